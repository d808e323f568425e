"""What one peer sends cannot hold the loop or the node's memory (issue 38), on both sides.

A real websockets peer on loopback writes raw frames an attacker (or a broken
provider) would: a message in a million fragments, invalid UTF-8 in a text
frame, a flood of pings whose pongs it never reads, a 64 MiB frame in
256 KiB reads. Figures before the fix, from outside: a million fragments held
the loop 7-12 s; 108 MB of pings 5.8 s and +155 MB; a 64 MiB frame 8.4 s of
one core. Each test asserts the close code a peer gets and a bound on the
time or CPU it cost, with a wide margin (the machine is shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from gateway.wsfast import BatchingConnection, FastReadClientConnection, read
from gateway.wsfast.messages import MAX_FRAGMENTS, MessageQueue
from tests.support.stall import LoopWatch

pytestmark = pytest.mark.timeout(60)


def fragments(count: int, *, masked: bool) -> bytes:
    """One text message of ``count`` one-byte frames (mask of zeros: the byte as is)."""
    mask = b"\x80\x00\x00\x00\x00" if masked else b"\x00"
    head = bytes([0x01, mask[0] | 1]) + mask[1:] + b"a"
    middle = bytes([0x00, mask[0] | 1]) + mask[1:] + b"a"
    tail = bytes([0x80, mask[0] | 1]) + mask[1:] + b"a"
    return head + middle * (count - 2) + tail


async def closed_with(ws: ClientConnection | ServerConnection) -> ConnectionClosed:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await ws.recv(decode=False)
    return closed.value


async def test_a_provider_message_in_a_million_fragments_fails_fast_with_1009() -> None:
    async def server(ws: ServerConnection) -> None:
        await ws.recv()  # the client reads frames itself once its handshake is over
        ws.transport.write(fragments(1_000_000, masked=False))
        await ws.wait_closed()

    async with (
        serve(server, "127.0.0.1", 0, compression=None) as srv,
        connect(
            f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
            compression=None,
            create_connection=FastReadClientConnection,
        ) as ws,
        LoopWatch() as watch,
    ):
        cpu = time.process_time()
        await ws.send("go")
        closed = await closed_with(ws)
        cpu = time.process_time() - cpu
    print(
        f"\nmillion fragments: closed {closed.sent}, loop stall {watch.longest * 1000:.0f} ms, "
        f"CPU {cpu:.2f} s (both peers)"
    )
    assert closed.sent is not None and closed.sent.code == 1009
    assert f"more than {MAX_FRAGMENTS} fragments" in closed.sent.reason
    assert watch.longest < 2.0 and cpu < 2.0  # 7-12 s before


async def test_a_client_message_in_a_million_fragments_is_closed_with_1009() -> None:
    got: list[ConnectionClosed] = []

    async def server(ws: ServerConnection) -> None:
        got.append(await closed_with(ws))

    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        reader, writer = await raw_client(srv.sockets[0].getsockname()[1])
        writer.write(fragments(1_000_000, masked=True))
        code, reason, _ = await close_frame(reader)
        writer.close()
    assert code == 1009 and f"more than {MAX_FRAGMENTS} fragments" in reason
    assert got and got[0].sent is not None and got[0].sent.code == 1009


async def raw_client(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket client as an attacker writes one: the handshake, then raw bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await reader.readuntil(b"\r\n\r\n")
    return reader, writer


async def close_frame(reader: asyncio.StreamReader) -> tuple[int, str, int]:
    """Read the server's frames to its close: ``(code, reason, pongs before it)``."""
    pongs = 0
    async with asyncio.timeout(30):
        while True:
            first, second = await reader.readexactly(2)
            length = second & 0x7F
            if length == 126:
                length = int.from_bytes(await reader.readexactly(2))
            elif length == 127:
                length = int.from_bytes(await reader.readexactly(8))
            payload = await reader.readexactly(length)
            if first & 0x0F == 0x8:
                return int.from_bytes(payload[:2]), payload[2:].decode(), pongs
            pongs += first & 0x0F == 0xA


async def test_fragments_within_the_limit_are_joined() -> None:
    async def server(ws: ServerConnection) -> None:
        ws.transport.write(fragments(MAX_FRAGMENTS, masked=False))
        await ws.wait_closed()

    async with (
        serve(server, "127.0.0.1", 0, compression=None) as srv,
        connect(
            f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
            compression=None,
            create_connection=FastReadClientConnection,
        ) as ws,
    ):
        assert await ws.recv() == "a" * MAX_FRAGMENTS


@pytest.mark.parametrize("fragmented", [False, True])
async def test_invalid_utf8_from_a_provider_fails_the_connection_with_1007(
    fragmented: bool,
) -> None:
    bad = b"\xc3\x28 not UTF-8"
    frames = (
        bytes([0x01, 2]) + bad[:2] + bytes([0x80, len(bad) - 2]) + bad[2:]
        if fragmented
        else bytes([0x81, len(bad)]) + bad
    )

    async def server(ws: ServerConnection) -> None:
        await ws.send('{"ok":1}')
        ws.transport.write(frames)
        await ws.wait_closed()

    async with (
        serve(server, "127.0.0.1", 0, compression=None) as srv,
        connect(
            f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
            compression=None,
            create_connection=FastReadClientConnection,
        ) as ws,
    ):
        assert await ws.recv(decode=False) == b'{"ok":1}'  # as adapters read: bytes
        closed = await closed_with(ws)
    assert closed.sent is not None and closed.sent.code == 1007
    assert "not UTF-8" in closed.sent.reason


async def test_a_client_that_pings_and_never_reads_the_pongs_is_closed_with_1008() -> None:
    """The flood is written without reading: before, every ping's pong queued in the
    node (108 MB of pings: +155 MB); now a burst of pings, then a close that says why."""
    got: list[ConnectionClosed] = []

    async def server(ws: ServerConnection) -> None:
        got.append(await closed_with(ws))

    ping = b"\x89\xfd\x00\x00\x00\x00" + b"p" * 125  # masked (zeros), 125 bytes
    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        reader, writer = await raw_client(srv.sockets[0].getsockname()[1])
        writer.write(b"\x81\x82\x00\x00\x00\x00hi")  # the server reads frames itself now
        sent = 0
        with contextlib.suppress(ConnectionError):  # the node closes; nothing is read
            async with asyncio.timeout(30):
                while sent < 800_000:  # 108 MB, as the probe
                    writer.write(ping * 1000)
                    sent += 1000
                    await writer.drain()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await close_frame(reader)  # or cut off: the node closed with the flood unread
        writer.close()
    assert got and got[0].sent is not None and got[0].sent.code == 1008
    assert "pings" in got[0].sent.reason
    print(f"\npings written before the close: {sent}")
    assert sent < 800_000  # closed at the first burst over, not after the flood


async def test_pings_the_fast_path_never_sees_are_limited_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path starts at a frame boundary, and a peer's writes need never end on
    one (131-byte pings in 64 KiB writes, read in 256 KiB chunks under load: none of
    20 MiB did). Here it never starts: the pings websockets parses are held to the
    same bucket, and the flood ends with 1008 after about one read's worth."""
    monkeypatch.setattr(read, "at_frame_boundary", lambda protocol: False)
    got: list[ConnectionClosed] = []

    async def server(ws: ServerConnection) -> None:
        got.append(await closed_with(ws))

    ping = b"\x89\xfd\x00\x00\x00\x00" + b"p" * 125  # masked (zeros), 125 bytes
    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        reader, writer = await raw_client(srv.sockets[0].getsockname()[1])
        sent = 0
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(30):
                while sent < 160_000:  # 21 MB
                    writer.write(ping * 500)
                    sent += 500
                    await writer.drain()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await close_frame(reader)
        writer.close()
    assert got and got[0].sent is not None and got[0].sent.code == 1008, got
    assert "pings" in got[0].sent.reason
    assert sent < 160_000  # closed at the first burst over, not after the flood


async def test_a_64_mib_frame_in_small_reads_is_read_in_linear_time() -> None:
    size = 64 << 20

    async def server(ws: ServerConnection) -> None:
        await ws.recv()  # the client reads frames itself once its handshake is over
        await ws.send(b"x" * size)
        await ws.wait_closed()

    async with (
        serve(server, "127.0.0.1", 0, compression=None) as srv,
        connect(
            f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
            compression=None,
            max_size=size,
            create_connection=FastReadClientConnection,
        ) as ws,
        LoopWatch() as watch,
    ):
        await ws.send("go")
        cpu = time.process_time()
        data = await ws.recv(decode=False)
        cpu = time.process_time() - cpu
        assert len(data) == size and ws.frames_read_fast >= 1
    print(f"\n64 MiB frame: CPU {cpu:.2f} s, loop stall {watch.longest * 1000:.0f} ms")
    assert cpu < 2.5  # 8.4 s before (quadratic); ~0.1-0.3 s now, both peers in this process


@pytest.mark.parametrize("wait", [False, True])
async def test_nothing_after_the_bad_frame_is_delivered(wait: bool) -> None:
    """Before the reader's own path starts (frames right after the handshake, parsed by
    websockets in one go) and after: what came before the bad frame is delivered, what
    came after it is not."""
    good = b"\x81\x01a"
    bad = b"\x81\x02\xc3\x28"
    after = b"\x81\x01b"

    async def server(ws: ServerConnection) -> None:
        if wait:
            await ws.recv()
        ws.transport.write(good + bad + after)
        await ws.wait_closed()

    async with (
        serve(server, "127.0.0.1", 0, compression=None) as srv,
        connect(
            f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
            compression=None,
            create_connection=FastReadClientConnection,
        ) as ws,
    ):
        if wait:
            await ws.send("go")
        assert await ws.recv() == "a"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()  # not "b"
    assert closed.value.sent is not None and closed.value.sent.code == 1007


async def test_no_part_of_a_message_past_the_fragment_limit_is_delivered() -> None:
    """Frames right after the handshake are parsed by websockets in one go: the
    fragments after the limit must not make a message of their own."""

    async def server(ws: ServerConnection) -> None:
        ws.transport.write(fragments(MAX_FRAGMENTS + 900, masked=False))
        await ws.wait_closed()

    async with (
        serve(server, "127.0.0.1", 0, compression=None) as srv,
        connect(
            f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
            compression=None,
            create_connection=FastReadClientConnection,
        ) as ws,
    ):
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()  # not the message's last 900 bytes
    assert closed.value.sent is not None and closed.value.sent.code == 1009


class _Passes:
    """Bytes each connection below was given per loop pass; the pass is advanced once
    a pass by a callback that schedules itself."""

    now: ClassVar[int] = 0
    read: ClassVar[dict[int, int]] = {}

    @classmethod
    def count(cls, data: bytes) -> None:
        cls.read[cls.now] = cls.read.get(cls.now, 0) + len(data)

    @classmethod
    def start(cls) -> None:
        loop = asyncio.get_running_loop()

        def next_pass() -> None:
            cls.now += 1
            loop.call_soon(next_pass)

        cls.read.clear()
        next_pass()


class _CountingServer(BatchingConnection):
    def data_received(self, data: bytes) -> None:
        _Passes.count(data)
        super().data_received(data)


class _CountingClient(FastReadClientConnection):
    def data_received(self, data: bytes) -> None:
        _Passes.count(data)
        super().data_received(data)


def _on_uvloop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    uvloop = pytest.importorskip("uvloop")  # the node's loop; a pinned test dependency
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def test_a_large_client_frame_is_read_a_bounded_share_per_loop_pass() -> None:
    """uvloop reads a ready socket up to 32 times a pass (256 KB a read): eight
    clients' 20 MiB appends had megabytes each copied and unmasked in one pass, and
    the node's other clients waited 150-250 ms. A burst's reading now stops for the
    rest of a pass after one large read (``READ_PER_PASS``)."""
    size = 20 << 20
    got: list[int] = []
    whole = asyncio.Event()

    async def server(ws: ServerConnection) -> None:
        got.append(len(await ws.recv(decode=False)))
        whole.set()

    async def main() -> None:
        async with serve(
            server,
            "127.0.0.1",
            0,
            compression=None,
            max_size=size + 1024,
            create_connection=_CountingServer,
        ) as srv:
            _, writer = await raw_client(srv.sockets[0].getsockname()[1])
            _Passes.start()  # after the handshake's reads
            # One masked binary frame (a mask of zeros: the payload as is), written at once.
            writer.write(b"\x82\xff" + size.to_bytes(8) + b"\x00" * 4 + b"\x01" * size)
            async with asyncio.timeout(30):
                await writer.drain()
                await whole.wait()
            writer.close()

    _on_uvloop(main)
    assert got == [size]
    most = max(_Passes.read.values())
    print(f"\nmost bytes of the frame read in one pass: {most:,}")
    assert most <= 1 << 19, most  # one read (256 KB) and a little; ~4.7 MB before


def test_a_providers_burst_of_frames_is_read_a_bounded_share_per_loop_pass() -> None:
    """A provider that wrote 100,000 text deltas at once had all of them parsed (and
    made events) in one pass: the node's loop stalled 375 ms."""
    delta = b'{"type":"response.output_text.delta","response_id":"r","delta":"word "}'
    burst = (b"\x81" + bytes([len(delta)]) + delta) * 100_000
    got: list[int] = []

    async def server(ws: ServerConnection) -> None:
        await ws.recv()  # the client reads frames itself once its handshake is over
        ws.transport.write(burst + b"\x81\x03end")
        await ws.wait_closed()

    async def main() -> None:
        async with (
            serve(server, "127.0.0.1", 0, compression=None) as srv,
            connect(
                f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
                compression=None,
                create_connection=_CountingClient,
            ) as ws,
        ):
            # Taken in the read callback, as the adapters take a response's deltas
            # (``Upstream.stream_text_to``): no queue fills to pause the reading.
            def take(data: bytes, _text: bool) -> bool:
                got.append(len(data))
                return data != b"end"

            ws.recv_messages.intercept = take
            await ws.send("go")
            _Passes.start()
            async with asyncio.timeout(30):
                assert await ws.recv() == "end"

    _on_uvloop(main)
    assert len(got) == 100_001  # and the end, given to recv()
    most = max(_Passes.read.values())
    print(f"\nmost bytes of the burst read in one pass: {most:,} of {len(burst):,}")
    assert most <= 1 << 19, most


def test_a_read_of_tiny_frames_is_taken_a_bounded_number_a_loop_pass() -> None:
    """One 256 KB read of 2-byte frames is 32,000 messages: parsed (and relayed, for a
    microphone's) in one callback, they held the loop 40-80 ms. A callback now takes
    ``FRAMES_PER_CALL`` and leaves the rest, in order, to the next passes."""
    count = 40_000
    frames = b"".join(b"\x82\x86" + b"\x00" * 4 + i.to_bytes(4) + b"\x00\x00" for i in range(count))
    per_pass: dict[int, int] = {}
    got: list[int] = []
    done = asyncio.Event()

    async def server(ws: ServerConnection) -> None:
        def take(data: bytes, _text: bool) -> bool:  # a microphone's relay, as the edge's
            per_pass[_Passes.now] = per_pass.get(_Passes.now, 0) + 1
            got.append(int.from_bytes(data[:4]))
            if len(got) == count:
                done.set()
            return True

        assert isinstance(ws.recv_messages, MessageQueue)
        ws.recv_messages.intercept = take
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()  # the intercept takes everything: it waits until the close

    async def main() -> None:
        async with serve(
            server, "127.0.0.1", 0, compression=None, create_connection=_CountingServer
        ) as srv:
            _, writer = await raw_client(srv.sockets[0].getsockname()[1])
            _Passes.start()
            writer.write(frames)
            async with asyncio.timeout(30):
                await writer.drain()
                await done.wait()
            writer.close()

    _on_uvloop(main)
    assert got == list(range(count))  # every frame, in order
    most = max(per_pass.values())
    print(f"\nmost frames taken in one pass: {most:,} of {count:,}")
    # A pass may end one read's frames and start the next read's: two callbacks' worth.
    assert most <= 2 * read.FRAMES_PER_CALL <= 1024, most  # 25,600 in one callback before
