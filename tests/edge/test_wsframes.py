"""The websockets internals ``gateway.edge.wsframes`` relies on are still there and still work."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.protocol import Protocol

from gateway.edge.wsframes import BatchingConnection, can_write_now, send_batch, write_now

FRAMES = [b'{"type":"respond","content":"%d","seq":%d}' % (i, i) for i in range(1, 9)]


def test_the_internals_exist() -> None:
    assert callable(getattr(ServerConnection, "send_data", None))
    assert callable(getattr(ServerConnection, "send_context", None))
    assert callable(getattr(Protocol, "send_text", None))
    assert callable(getattr(Protocol, "send_binary", None))
    assert "writes" in inspect.getsource(Protocol.__init__)
    assert isinstance(inspect.getattr_static(ServerConnection, "paused", None), property) or (
        "paused" in inspect.getsource(ServerConnection.__mro__[1].__init__)
    )


@pytest.mark.timeout(20)
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


@pytest.mark.timeout(20)
async def test_frames_built_without_websockets_arrive_whole_at_every_length() -> None:
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
