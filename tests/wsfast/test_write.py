"""``gateway.wsfast.write``: frames written now arrive as websockets' own would, on both sides.

To providers (``write_text_now``, masked client frames) a real websockets
server checks the mask bit and the UTF-8; to clients (``write_now``,
``send_batch``, unmasked server frames) a plain websockets client reads them.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.protocol import CLIENT
from websockets.speedups import apply_mask

from gateway.wsfast import (
    BatchingConnection,
    can_write_now,
    send_batch,
    write,
    write_now,
    write_text_now,
    write_texts_now,
)

pytestmark = pytest.mark.timeout(20)

FRAMES = [b'{"type":"respond","content":"%d","seq":%d}' % (i, i) for i in range(1, 9)]


# --- to providers: the client side ------------------------------------------------


async def test_frames_written_now_arrive_in_order_and_a_closed_socket_is_refused() -> None:
    got: list[str] = []
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            assert isinstance(frame, str)
            got.append(frame)
            if len(got) == 3:
                done.set()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            for i in range(3):
                assert can_write_now(client)
                write_text_now(client, b'{"n":%d}' % i)
            await done.wait()
        assert not can_write_now(client)  # closed: the caller must await send (and see why)
    assert got == ['{"n":0}', '{"n":1}', '{"n":2}']


async def test_client_frames_of_every_length_class_arrive_whole_through_a_real_server() -> None:
    """The client frames (masked) written by ``write_text_now`` are valid RFC 6455 frames."""
    sizes = [0, 1, 125, 126, 127, 65_535, 65_536, 70_000]
    texts = ["é" * (n // 2) + "x" * (n % 2) for n in sizes]  # n bytes of UTF-8 each
    got: list[str] = []
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:  # websockets checks the mask bit and the UTF-8
            assert isinstance(frame, str)
            got.append(frame)
            if len(got) == len(texts):
                done.set()

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as client:
            for text in texts:
                assert can_write_now(client)
                write_text_now(client, text.encode())
            await done.wait()
    assert got == texts


@pytest.mark.parametrize("compression", [None, "deflate"])
async def test_client_frames_written_together_arrive_whole_and_in_order_in_one_write(
    compression: str | None,
) -> None:
    """``write_texts_now``: every length class, in order, one transport write (compressed,
    websockets frames them: what it writes is its own business)."""
    sizes = [0, 1, 125, 126, 127, 65_535, 65_536, 70_000] * 2
    texts = ["é" * (n // 2) + "x" * (n % 2) for n in sizes]
    got: list[str] = []
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:  # websockets checks the mask bit and the UTF-8
            assert isinstance(frame, str)
            got.append(frame)
            if len(got) == len(texts):
                done.set()

    writes: list[int] = []
    async with serve(handler, "127.0.0.1", 0, compression=compression, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=compression) as client:
            transport = client.transport
            real_write = transport.write

            def counting_write(data: bytes | bytearray | memoryview) -> None:
                writes.append(len(data))
                real_write(data)

            transport.write = counting_write  # type: ignore[method-assign]
            assert can_write_now(client)
            write_texts_now(client, [text.encode() for text in texts])
            transport.write = real_write  # type: ignore[method-assign]
            await asyncio.wait_for(done.wait(), 10)
    assert got == texts
    if compression is None:
        assert len(writes) == 1, writes


def test_every_client_frame_has_its_own_mask_across_refills_of_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Masks come from a pool of ``os.urandom`` keys (RFC 6455 §5.3): no key is used
    twice, one draw serves 1,024 frames, and each frame unmasks to its text."""
    draws: list[int] = []
    counter = iter(range(1 << 30))

    def urandom(n: int) -> bytes:  # distinct keys, so a reused one shows
        draws.append(n)
        return b"".join(next(counter).to_bytes(4) for _ in range(n // 4))

    monkeypatch.setattr(write.os, "urandom", urandom)
    monkeypatch.setattr(write, "_masks", [])
    sent: list[bytes] = []
    transport = SimpleNamespace(write=sent.append)
    ws = SimpleNamespace(protocol=SimpleNamespace(side=CLIENT, extensions=[], writes=[]))
    ws.transport = transport
    texts = [b'{"n":%d}' % i + b"x" * (i % 300) for i in range(3000)]
    for text in texts:
        write_text_now(ws, text)  # type: ignore[arg-type]
    assert len(draws) == 3  # 3,000 frames: ceil(3000 / 1024) draws
    masks = set()
    for frame, text in zip(sent, texts, strict=True):
        n = frame[1] & 0x7F
        head = 2 if n < 126 else 4
        assert frame[0] == 0x81 and frame[1] & 0x80  # final text frame, masked
        assert (n if n < 126 else int.from_bytes(frame[2:4])) == len(text)
        mask = frame[head : head + 4]
        masks.add(mask)
        assert apply_mask(frame[head + 4 :], mask) == text
    assert len(masks) == len(texts)


# --- to clients: the server side ---------------------------------------------------


async def test_a_batch_arrives_as_separate_frames_in_one_write() -> None:
    writes: list[int] = []
    sent = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        transport = ws.transport
        real_write = transport.write

        def counting_write(data: bytes | bytearray | memoryview) -> None:
            writes.append(len(data))
            real_write(data)

        transport.write = counting_write  # type: ignore[method-assign]
        assert can_write_now(ws)
        write_now(ws, FRAMES[:4])
        await send_batch(ws, FRAMES[4:])
        transport.write = real_write  # type: ignore[method-assign]
        sent.set()
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, create_connection=BatchingConnection) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            got = [await client.recv() for _ in FRAMES]
            await sent.wait()
    assert got == [f.decode() for f in FRAMES]
    assert len(writes) == 2, f"expected one write per batch, saw {writes}"


async def test_server_frames_built_without_websockets_arrive_whole_at_every_length() -> None:
    """Uncompressed, ``write_now`` frames text itself: every header size must be right."""
    texts = ["", "a" * 125, "b" * 126, "é" * 300, "c" * 65535, "d" * 65536, "e" * 70_000]

    async def handler(ws: ServerConnection) -> None:
        assert not ws.protocol.extensions  # the direct path, not websockets' framing
        write_now(ws, [t.encode() for t in texts[:3]])
        for text in texts[3:]:
            write_now(ws, [text.encode()])
        await ws.wait_closed()

    async with serve(
        handler, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as client:
            assert [await client.recv() for _ in texts] == texts
