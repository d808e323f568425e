"""``gateway.wsfast.read``: plain frames read as websockets would, only cheaper, on both sides.

A real websockets server on loopback sends every kind of frame a provider may
send; the client (``FastReadClientConnection``) must receive exactly what a plain
websockets client receives, answer pings, and close with the same codes. And
the other way: the gateway's server connection (``BatchingConnection``) reads
what a plain websockets client (a voice client, say) sends, masked.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConcurrencyError, ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from gateway.wsfast import (
    BatchingConnection,
    FastReadClientConnection,
    FrameBudget,
    MessageQueue,
)

pytestmark = pytest.mark.timeout(20)

MESSAGES: list[str | bytes] = [
    '{"type":"response.text.delta","delta":"Hel"}',
    "é" * 200,  # 16-bit length, multi-byte UTF-8
    "x" * 70_000,  # 64-bit length: arrives in several reads
    b"\x00\x01binary",
    "",
]


async def exchange(
    server_script: Callable[[ServerConnection], Awaitable[None]],
    client_script: Callable[[ClientConnection], Awaitable[None]],
    *,
    max_size: int = 1 << 20,
) -> None:
    async with serve(server_script, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(
            f"ws://127.0.0.1:{port}",
            compression=None,
            max_size=max_size,
            create_connection=FastReadClientConnection,
        ) as client:
            await client_script(client)


async def test_messages_pings_fragments_and_close_are_as_websockets_gives_them() -> None:
    ponged = asyncio.Event()

    async def server(ws: ServerConnection) -> None:
        for message in MESSAGES:
            await ws.send(message)
        await ws.send(["frag", "mented"])  # a fragmented text message
        pong = await ws.ping(b"are you there")
        await pong
        ponged.set()
        for i in range(300):  # many small frames, coalesced into reads by TCP
            await ws.send(f'{{"n":{i}}}')
        await ws.close(4000, "bye")

    async def client(ws: ClientConnection) -> None:
        assert isinstance(ws, FastReadClientConnection)
        got = [await ws.recv() for _ in MESSAGES]
        assert got == MESSAGES
        assert await ws.recv() == "fragmented"
        assert [await ws.recv() for _ in range(300)] == [f'{{"n":{i}}}' for i in range(300)]
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000
        assert ponged.is_set()
        assert ws.frames_read_fast >= 300  # the fast path did read them

    await exchange(server, client)


async def test_frames_split_at_every_byte_arrive_whole() -> None:
    async def server(ws: ServerConnection) -> None:
        await ws.send("ready")
        await ws.wait_closed()

    async def client(ws: ClientConnection) -> None:
        assert isinstance(ws, FastReadClientConnection)
        assert await ws.recv() == "ready"
        wire = b"".join(
            Frame(Opcode.TEXT, text.encode()).serialize(mask=False)
            for text in ("a", "b" * 300, "c" * 70_000)
        )
        for cut in (1, 2, 3, 4, 9, 10, 11, 305, len(wire) - 1):
            ws.data_received(wire[:cut])
            ws.data_received(wire[cut:])
            assert [await ws.recv() for _ in range(3)] == ["a", "b" * 300, "c" * 70_000]
        assert ws.frames_read_fast == 27  # all of them by the fast path

    await exchange(server, client)


async def test_an_oversized_frame_closes_with_1009_as_before() -> None:
    async def server(ws: ServerConnection) -> None:
        await ws.send("small")
        await ws.send("y" * 5000)
        await ws.wait_closed()

    async def client(ws: ClientConnection) -> None:
        assert await ws.recv() == "small"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.sent is not None and closed.value.sent.code == 1009

    await exchange(server, client, max_size=1000)


async def test_a_masked_frame_from_the_server_is_a_protocol_error() -> None:
    async def server(ws: ServerConnection) -> None:
        await ws.send("ready")
        await ws.wait_closed()

    async def client(ws: ClientConnection) -> None:
        assert await ws.recv() == "ready"
        ws.data_received(Frame(Opcode.TEXT, b"masked").serialize(mask=True))
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.sent is not None and closed.value.sent.code == 1002

    await exchange(server, client)


class _TellsItPaused(FastReadClientConnection):
    """Sets ``reading_paused`` when the connection stops reading its socket (the transport has no
    event for it)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.reading_paused = asyncio.Event()
        assert isinstance(transport, asyncio.Transport)
        pause_reading = transport.pause_reading

        def pause() -> None:
            pause_reading()
            self.reading_paused.set()

        transport.pause_reading = pause  # type: ignore[method-assign]
        super().connection_made(transport)


async def test_a_reader_that_falls_behind_pauses_the_sender_and_loses_nothing() -> None:
    """Above ``max_queue`` unread messages the socket stops being read, as websockets does."""
    count = 200
    sent = asyncio.Event()

    async def server(ws: ServerConnection) -> None:
        for i in range(count):
            await ws.send(f"m{i}" + "p" * 2000)
        sent.set()
        await ws.wait_closed()

    async with serve(server, "127.0.0.1", 0, compression=None) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(
            f"ws://127.0.0.1:{port}",
            compression=None,
            max_queue=4,
            create_connection=_TellsItPaused,
        ) as ws:
            assert isinstance(ws, _TellsItPaused)
            assert await ws.recv() == "m0" + "p" * 2000
            # Nothing is read: the queue passes 4 messages and reading stops,
            # so the server's sends back up in the socket buffers.
            await asyncio.wait_for(ws.reading_paused.wait(), 10)
            assert not ws.transport.is_reading()
            got = [await ws.recv() for _ in range(count - 1)]
            assert got == [f"m{i}" + "p" * 2000 for i in range(1, count)]
            assert ws.transport.is_reading()
            await asyncio.wait_for(sent.wait(), 5)


async def test_a_reader_behind_on_large_messages_pauses_before_max_queue() -> None:
    """Unread bytes bound the queue too: two 3 MiB messages stop the reading (30 MiB sent), where
    ``max_queue`` (16) messages of a door client's 20 MiB limit would be 320 MiB."""
    count = 10
    size = 3 * 2**20
    sent = asyncio.Event()

    async def server(ws: ServerConnection) -> None:
        for i in range(count):
            await ws.send(bytes([i]) * size)
        sent.set()
        await ws.wait_closed()

    async with serve(server, "127.0.0.1", 0, compression=None, max_size=None) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(
            f"ws://127.0.0.1:{port}",
            compression=None,
            max_size=None,
            create_connection=_TellsItPaused,
        ) as ws:
            assert isinstance(ws, _TellsItPaused)
            await asyncio.wait_for(ws.reading_paused.wait(), 10)
            assert not ws.transport.is_reading()
            assert not sent.is_set()  # the rest backs up in the socket buffers
            got = [await ws.recv() for _ in range(count)]
            assert got == [bytes([i]) * size for i in range(count)]
            await asyncio.wait_for(sent.wait(), 10)
            assert ws.transport.is_reading()


async def test_messages_queued_before_the_close_are_still_received() -> None:
    async def server(ws: ServerConnection) -> None:
        for text in ("one", "two", "three"):
            await ws.send(text)
        await ws.close(4001, "done")

    async def client(ws: ClientConnection) -> None:
        await ws.wait_closed()  # the close came after the three messages
        assert [await ws.recv() for _ in range(3)] == ["one", "two", "three"]
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001

    await exchange(server, client)


async def test_two_readers_at_once_are_refused_as_websockets_refuses_them() -> None:
    async def server(ws: ServerConnection) -> None:
        await ws.wait_closed()

    async def client(ws: ClientConnection) -> None:
        first = asyncio.create_task(ws.recv())
        await asyncio.sleep(0)  # the first reader is waiting
        with pytest.raises(ConcurrencyError):
            await ws.recv()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        ws.recv_messages.put_message(b"after", True)  # a reader may come again
        assert await ws.recv() == "after"

    await exchange(server, client)


async def test_an_intercept_takes_what_comes_while_a_reader_waits_and_can_wake_it() -> None:
    """Only an empty queue with a reader waiting is intercepted; a nudge makes
    ``recv()`` return ``None``; anything the intercept leaves arrives in order.

    The server sends one message per ack, and the client acks only once its
    reader waits again, so each message arrives while ``recv()`` waits."""
    go = asyncio.Event()

    async def server(ws: ServerConnection) -> None:
        await ws.recv()  # the client's reader waits
        for text in ("a1", "a2", "keep", "wake"):
            await ws.send(text)
            await ws.recv()
        await go.wait()
        for text in ("q1", "q2"):
            await ws.send(text)
        await ws.close()

    async def client(ws: ClientConnection) -> None:
        queue = ws.recv_messages
        assert isinstance(queue, MessageQueue)
        taken: list[bytes] = []

        def intercept(data: bytes, text: bool) -> bool:
            if data == b"keep":
                return False
            taken.append(data)
            if data == b"wake":
                queue.nudge()
            else:  # the reader goes on waiting: the next may come
                asyncio.get_running_loop().create_task(ws.send("ack"))
            return True

        queue.intercept = intercept
        await ws.send("ready")
        assert await ws.recv() == "keep"  # a1, a2 were taken; "keep" was left
        await ws.send("ack")
        assert await ws.recv() is None  # "wake" was taken, with a nudge
        assert taken == [b"a1", b"a2", b"wake"]
        await ws.send("ack")
        go.set()
        await ws.wait_closed()  # nobody read meanwhile: q1 and q2 queued, unintercepted
        assert await ws.recv() == "q1"
        assert await ws.recv() == "q2"
        assert taken == [b"a1", b"a2", b"wake"]

    await exchange(server, client)


# --- the server side: a client's masked frames ------------------------------------


async def test_the_gateways_server_connection_reads_what_a_client_sends() -> None:
    got: list[str | bytes] = []
    fast: list[int] = []
    audio = [bytes([i % 256]) * 960 for i in range(300)]  # 20 ms of PCM16 at 24 kHz each

    async def server(ws: ServerConnection) -> None:
        assert isinstance(ws, BatchingConnection)
        try:
            async for message in ws:
                got.append(message)
        finally:
            fast.append(ws.frames_read_fast)

    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as client:
            for message in MESSAGES:
                await client.send(message)
            await client.send(["frag", "mented"])
            await (await client.ping(b"still there?"))  # the server answers while reading fast
            for frame in audio:
                await client.send(frame)
        srv.close()
        await srv.wait_closed()  # the handler has read everything
    assert got == [*MESSAGES, "fragmented", *audio]
    assert fast and fast[0] >= 300


async def test_an_unmasked_frame_from_a_client_is_a_protocol_error() -> None:
    async def server(ws: ServerConnection) -> None:
        await ws.send("ready")
        with pytest.raises(ConnectionClosed):  # the protocol error ends the connection
            async for _ in ws:
                pass

    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as client:
            assert await client.recv() == "ready"
            client.transport.write(Frame(Opcode.TEXT, b"unmasked").serialize(mask=False))
            with pytest.raises(ConnectionClosed) as closed:
                await client.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1002


async def test_a_large_masked_frame_arrives_whole_however_it_is_cut() -> None:
    """A client's large frame is unmasked piece by piece as it arrives: whatever the
    reads' boundaries (inside the header, off the key's 4-byte phase), the message is
    the one sent, and the frames around it are untouched."""

    from gateway.wsfast.large import UNMASK_AS_IT_COMES

    big = os.urandom(UNMASK_AS_IT_COMES + 12_345)
    text = "é" * (UNMASK_AS_IT_COMES // 2 + 7)  # a text frame, multi-byte UTF-8
    frames = [(Opcode.TEXT, b"before"), (Opcode.BINARY, big), (Opcode.TEXT, text.encode())]
    frames.append((Opcode.TEXT, b"after"))
    wire = b"".join(Frame(op, data).serialize(mask=True) for op, data in frames)
    want: list[str | bytes] = ["before", big, text, "after"]
    results: list[list[str | bytes]] = []

    async def server(ws: ServerConnection) -> None:
        assert isinstance(ws, BatchingConnection)
        assert await ws.recv() == "ready"
        for cuts in (
            [3],
            [11, 13],
            [9, 100_001, 100_002, 200_003],
            list(range(7, len(wire), 65_537)),
        ):
            parts = [0, *cuts, len(wire)]
            for a, b in itertools.pairwise(parts):
                ws.data_received(wire[a:b])
            results.append([await ws.recv() for _ in want])
        await ws.send("go")
        results.append([await ws.recv() for _ in want])  # and over the socket
        await ws.close()

    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as client:
            await client.send("ready")
            assert await client.recv() == "go"  # nothing else on the socket meanwhile
            await client.send("before")
            await client.send(big)
            await client.send(text)
            await client.send("after")
            await client.wait_closed()
    assert results == [want] * 5


async def test_large_frames_wait_for_the_nodes_budget_and_all_arrive() -> None:
    """Connections sharing a ``FrameBudget`` gather large frames only while it has
    room: with room for one 2 MiB frame, a second client's is not read (its
    connection paused) until the first is done with (its reader asks for the
    next message, or its connection closes); then it arrives whole. Small frames
    are not counted, and the budget is all given back."""
    budget = _WatchedBudget(3 << 20)
    size = 2 << 20
    frames = {name: bytes([i]) * size for i, name in enumerate(("a", "b"))}
    take = {name: asyncio.Event() for name in frames}
    got: dict[str, bytes] = {}
    connections: dict[str, BatchingConnection] = {}

    async def server(ws: ServerConnection) -> None:
        assert isinstance(ws, BatchingConnection)
        ws.protocol.max_message_size = 4 << 20
        ws.share_budget(budget)
        name = await ws.recv()  # small: not counted
        assert isinstance(name, str)
        connections[name] = ws
        await ws.send("go")
        await take[name].wait()
        message = await ws.recv()
        assert isinstance(message, bytes)
        got[name] = message
        await ws.close()

    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        port = srv.sockets[0].getsockname()[1]
        url = f"ws://127.0.0.1:{port}"
        async with connect(url, compression=None) as a, connect(url, compression=None) as b:
            for name, client in (("a", a), ("b", b)):
                await client.send(name)
                assert await client.recv() == "go"
            assert budget.held == 0
            await asyncio.wait_for(a.send(frames["a"]), 10)  # read whole, not yet taken
            await asyncio.wait_for(budget.until(lambda: budget.held == size), 10)
            sending = asyncio.create_task(b.send(frames["b"]))
            # b's frame waits: the budget holds a's, and b's connection is not read.
            await asyncio.wait_for(budget.until(lambda: budget.waiting == 1), 10)
            assert not connections["b"].transport.is_reading()
            assert budget.held == size
            take["a"].set()  # a's reader takes its frame and closes: b's is read
            await asyncio.wait_for(budget.until(lambda: budget.waiting == 0), 10)
            await asyncio.wait_for(sending, 10)
            take["b"].set()
            await asyncio.wait_for(a.wait_closed(), 10)
            await asyncio.wait_for(b.wait_closed(), 10)
    assert got == frames
    assert budget.held == 0 and budget.waiting == 0


@contextlib.asynccontextmanager
async def _budget_server(
    budget: FrameBudget, got: dict[str, bytes]
) -> AsyncIterator[tuple[str, dict[str, BatchingConnection]]]:
    """A server whose clients name themselves, then send one large frame each."""
    connections: dict[str, BatchingConnection] = {}

    async def server(ws: ServerConnection) -> None:
        assert isinstance(ws, BatchingConnection)
        ws.protocol.max_message_size = 4 << 20
        ws.share_budget(budget)
        name = await ws.recv()
        assert isinstance(name, str)
        connections[name] = ws
        await ws.send("go")
        with contextlib.suppress(ConnectionClosed):
            message = await ws.recv()
            assert isinstance(message, bytes)
            got[name] = message

    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        yield f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}", connections


async def _named(url: str, name: str) -> ClientConnection:
    client = await connect(url, compression=None)
    await client.send(name)
    assert await client.recv() == "go"
    return client


def _masked(payload: bytes) -> bytes:
    return Frame(Opcode.BINARY, payload).serialize(mask=True, extensions=[])


async def test_a_large_frame_trickled_while_others_wait_is_cut_off() -> None:
    """A client that sends part of a large frame and stalls holds its share of the
    budget; once another client waits for room and the frame came slower than the
    budget's floor over its patience, its connection fails with 1008 (saying how
    to send instead), its share goes back, and the waiting client's frame is read."""
    budget = _WatchedBudget(3 << 20, min_rate=1 << 20, patience=0.2)
    size = 2 << 20
    frame_b = os.urandom(size)
    got: dict[str, bytes] = {}
    async with asyncio.timeout(20), contextlib.AsyncExitStack() as stack:
        url, _ = await stack.enter_async_context(_budget_server(budget, got))
        a = await stack.enter_async_context(await _named(url, "a"))
        b = await stack.enter_async_context(await _named(url, "b"))
        a.transport.write(_masked(os.urandom(size))[: size // 2])  # and no more
        await budget.until(lambda: budget.held == size)
        sending = asyncio.create_task(b.send(frame_b))
        await budget.until(lambda: budget.waiting == 1)
        await a.wait_closed()
        assert a.close_code == 1008
        assert a.close_reason is not None and "send it faster" in a.close_reason
        await sending
        await budget.until(lambda: "b" in got)
    assert got == {"b": frame_b}
    assert budget.held == 0 and budget.waiting == 0


async def test_a_slow_large_frame_that_keeps_no_one_out_is_let_be() -> None:
    """With no one waiting for room, a slow uplink's frame is not judged: it is read
    whole however long it takes."""
    budget = _WatchedBudget(3 << 20, min_rate=1 << 20, patience=0.05)
    payload = os.urandom(2 << 20)
    frame = _masked(payload)
    got: dict[str, bytes] = {}
    async with asyncio.timeout(20), contextlib.AsyncExitStack() as stack:
        url, connections = await stack.enter_async_context(_budget_server(budget, got))
        a = await stack.enter_async_context(await _named(url, "a"))
        a.transport.write(frame[: len(frame) // 2])
        await budget.until(lambda: budget.judged >= 3)  # 3 looks at its pace, each let be
        assert connections["a"].state is State.OPEN
        a.transport.write(frame[len(frame) // 2 :])
        await budget.until(lambda: "a" in got)
    assert got == {"a": payload}


class _WatchedBudget(FrameBudget):
    """A ``FrameBudget`` that wakes the test whenever it changes (or judges a pace)."""

    def __init__(self, capacity: int, *, min_rate: float = 0, patience: float = 5.0) -> None:
        super().__init__(capacity, min_rate=min_rate, patience=patience)
        self.changed = asyncio.Event()
        self.judged = 0

    def too_slow(self, arrived: int, seconds: float) -> bool:
        self.judged += 1
        self.changed.set()
        return super().too_slow(arrived, seconds)

    def take(self, size: int) -> bool:
        took = super().take(size)
        self.changed.set()
        return took

    def give(self, size: int) -> None:
        super().give(size)
        self.changed.set()

    def wait(self, retry: Callable[[], bool]) -> None:
        super().wait(retry)
        self.changed.set()

    async def until(self, check: Callable[[], bool]) -> None:
        while not check():
            self.changed.clear()
            await self.changed.wait()


async def test_a_clients_first_frame_is_read_by_the_fast_path() -> None:
    """The handshake's end leaves websockets' parser at a frame boundary: the first
    frame (a recording sent whole, here) is read by the fast path, unmasked as it
    comes, not by websockets' parser, which kept every later read until one ended
    exactly on a frame's end."""
    big = os.urandom(3 << 20)
    read: list[tuple[bytes, int]] = []

    async def server(ws: ServerConnection) -> None:
        assert isinstance(ws, BatchingConnection)
        ws.protocol.max_message_size = 4 << 20
        message = await ws.recv()
        assert isinstance(message, bytes)
        read.append((message, ws.frames_read_fast))
        await ws.close()

    async with serve(
        server, "127.0.0.1", 0, compression=None, create_connection=BatchingConnection
    ) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as client:
            await client.send(big)
            await asyncio.wait_for(client.wait_closed(), 10)
    assert read == [(big, 1)]
