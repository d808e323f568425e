"""The canary: every websockets internal ``gateway.wsfast`` uses is still there and still works.

One test per internal (or per group used together), named after it, so a
websockets release that changes one fails here with its name rather than
somewhere in the gateway's behaviour. The internals are the ones listed in
the docstrings of ``gateway/wsfast/read.py`` and ``write.py``; a module that
starts using another one adds its test here. The sans-I/O ``Protocol`` is
checked without sockets; the asyncio ``Connection`` on one real connection
over loopback.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import textwrap
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import CLIENT, SERVER, Protocol, State
from websockets.streams import StreamReader
from websockets.utils import apply_mask as pure_apply_mask

from gateway.wsfast import (
    BatchingConnection,
    FastReadClientConnection,
    MessageQueue,
    at_frame_boundary,
    can_write_now,
)
from gateway.wsfast import read as wsfast_read
from gateway.wsfast import write as wsfast_write
from tests.support.source import parse

pytestmark = pytest.mark.timeout(20)


# --- the sans-I/O Protocol ----------------------------------------------------------


def test_protocol_attributes_the_fast_paths_read() -> None:
    """``state`` (and ``_state``), ``side``, ``extensions``, ``current_size``,
    ``max_message_size``, ``reader``, ``parser``, ``writes``: present, with the types
    the fast paths expect."""
    protocol = Protocol(CLIENT, state=State.OPEN, max_size=1000)
    assert protocol.state is State.OPEN
    # can_write_now reads the attribute the ``state`` property returns.
    assert protocol._state is State.OPEN
    protocol.state = State.CLOSING
    assert protocol._state is State.CLOSING
    protocol.state = State.OPEN
    assert protocol.side is CLIENT and Protocol(SERVER).side is SERVER
    assert protocol.extensions == []
    assert protocol.current_size is None
    assert protocol.max_message_size == 1000
    assert isinstance(protocol.reader, StreamReader)
    assert isinstance(protocol.reader.buffer, bytearray)
    assert inspect.isgenerator(protocol.parser)
    assert protocol.writes == []


def test_parser_waits_for_a_frame_in_stream_reader_at_eof() -> None:
    """``at_frame_boundary`` walks ``parser``'s ``gi_yieldfrom`` chain down to
    ``StreamReader.at_eof``; if websockets changes how it waits, the fast path never starts."""
    assert inspect.isgeneratorfunction(StreamReader.at_eof)
    protocol = Protocol(CLIENT, state=State.OPEN)
    assert at_frame_boundary(protocol)
    wire = Frame(Opcode.TEXT, b"hello").serialize(mask=False)
    protocol.receive_data(wire[:1])  # half a frame header: not a boundary
    assert not at_frame_boundary(protocol)
    protocol.receive_data(wire[1:])
    assert at_frame_boundary(protocol)


def test_current_size_is_set_exactly_while_a_fragmented_message_comes_in() -> None:
    """The fast path reads a data frame only when ``current_size is None``."""
    protocol = Protocol(CLIENT, state=State.OPEN)
    protocol.receive_data(Frame(Opcode.TEXT, b"frag", fin=False).serialize(mask=False))
    assert protocol.current_size == 4
    protocol.receive_data(Frame(Opcode.CONT, b"mented").serialize(mask=False))
    assert protocol.current_size is None
    assert [e.data for e in protocol.events_received()] == [b"frag", b"mented"]


def test_send_text_and_send_binary_queue_bytes_in_writes() -> None:
    """``write_now``/``write_text_now`` fall back to ``send_text`` when ``writes`` is
    not empty; ``BatchedWrites`` joins ``writes`` before ``send_data`` drains them."""
    protocol = Protocol(SERVER, state=State.OPEN)
    protocol.send_text(b"a")
    protocol.send_binary(b"b")
    assert all(isinstance(w, bytes) for w in protocol.writes)
    assert b"".join(protocol.writes) == (
        Frame(Opcode.TEXT, b"a").serialize(mask=False)
        + Frame(Opcode.BINARY, b"b").serialize(mask=False)
    )
    assert protocol.data_to_send() and protocol.writes == []


def test_apply_mask_is_the_c_one_and_masks_as_the_pure_one() -> None:
    data, mask = b"x" * 1000 + "é".encode(), b"\x01\x02\x03\x04"
    for module in (wsfast_read, wsfast_write):
        masked = module.apply_mask(data, mask)
        assert masked == pure_apply_mask(data, mask)
        assert module.apply_mask(masked, mask) == data
    from websockets import speedups  # the C extension: its absence costs CPU, not correctness

    assert wsfast_read.apply_mask is wsfast_write.apply_mask is speedups.apply_mask


# --- the asyncio Connection ---------------------------------------------------------


def _recv_messages_calls() -> set[str]:
    """The methods ``Connection`` calls on ``self.recv_messages``, read from its source."""
    tree = parse(textwrap.dedent(inspect.getsource(Connection)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "recv_messages"
    }


def test_connection_calls_recv_messages_only_as_message_queue_answers() -> None:
    """``MessageQueue`` stands in for websockets' ``Assembler``: it must answer
    every call ``Connection`` makes on it."""
    assert _recv_messages_calls() == {"put", "get", "get_iter", "close"}
    for name in _recv_messages_calls():
        assert callable(getattr(MessageQueue, name, None)), name


def test_connection_methods_and_flow_control_attributes_exist() -> None:
    """``send_data``, ``send_context``; ``paused``, ``send_in_progress`` and
    ``max_queue_high``/``max_queue_low``, set by ``Connection.__init__``."""
    assert callable(getattr(Connection, "send_data", None))
    assert callable(getattr(Connection, "send_context", None))
    assigned = Connection.__init__.__code__.co_names
    for name in ("paused", "send_in_progress", "max_queue_high", "max_queue_low"):
        assert name in assigned, name


@contextlib.asynccontextmanager
async def _pair(
    client_class: type[ClientConnection] = ClientConnection,
    server_class: type[ServerConnection] = ServerConnection,
) -> AsyncIterator[tuple[ClientConnection, ServerConnection]]:
    """One open connection over loopback, both ends, with no compression."""
    accepted: asyncio.Future[ServerConnection] = asyncio.get_running_loop().create_future()
    release = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        accepted.set_result(ws)
        await release.wait()

    async with serve(
        handler, "127.0.0.1", 0, compression=None, create_connection=server_class
    ) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(
            f"ws://127.0.0.1:{port}", compression=None, max_queue=8, create_connection=client_class
        ) as client:
            try:
                yield client, await accepted
            finally:
                release.set()


async def test_a_live_connection_has_what_the_fast_paths_read() -> None:
    async with _pair() as (client, server):
        for ws, side in ((client, CLIENT), (server, SERVER)):
            assert ws.protocol.side is side
            assert ws.protocol.state is State.OPEN
            assert ws.protocol.extensions == []
            assert ws.paused is False
            assert ws.send_in_progress is None
            assert callable(ws.transport.write)
        assert (client.max_queue_high, client.max_queue_low) == (8, None)
        await server.send("one")
        assert await client.recv() == "one"
        assert at_frame_boundary(client.protocol)  # what makes FastReader start reading


async def test_recv_messages_is_made_in_connection_made_so_ours_replaces_it() -> None:
    """``FastReader.connection_made`` replaces the ``Assembler`` after websockets
    made it; were it made later, ``recv()`` would read websockets' queue again."""
    async with _pair(FastReadClientConnection, BatchingConnection) as (client, server):
        assert isinstance(client.recv_messages, MessageQueue)
        assert isinstance(server.recv_messages, MessageQueue)
        await server.send("through the fast path")
        assert await client.recv() == "through the fast path"
        assert isinstance(client, FastReadClientConnection) and client.frames_read_fast == 1


async def test_send_data_writes_what_the_protocol_queued() -> None:
    async with _pair() as (client, server):
        server.protocol.send_text(b"queued")
        server.send_data()
        assert server.protocol.writes == []
        assert await client.recv() == "queued"


async def test_paused_and_send_in_progress_are_what_can_write_now_reads() -> None:
    async with _pair() as (client, _server):
        assert can_write_now(client)
        client.pause_writing()  # asyncio's flow control: the buffer is above its mark
        assert client.paused and not can_write_now(client)
        client.resume_writing()
        assert can_write_now(client)

        gate = asyncio.Event()

        async def fragments() -> AsyncIterator[str]:
            yield "frag"
            await gate.wait()
            yield "mented"

        sending = asyncio.create_task(client.send(fragments()))
        for _ in range(100):  # the task runs until the gate: a few loop passes
            if client.send_in_progress is not None:
                break
            await asyncio.sleep(0)
        assert client.send_in_progress is not None
        assert not can_write_now(client)  # a fragmented message is being sent
        gate.set()
        await sending
        assert client.send_in_progress is None and can_write_now(client)


async def test_send_context_sends_what_the_protocol_queued_inside_it() -> None:
    """``send_batch`` queues several frames in one ``send_context``: one write."""
    async with _pair(server_class=BatchingConnection) as (client, server):
        async with server.send_context():
            server.protocol.send_text(b"one")
            server.protocol.send_text(b"two")
        assert [await client.recv() for _ in range(2)] == ["one", "two"]


def test_what_fail_connection_calls_exists() -> None:
    """``FastReader.fail_connection`` (1007, 1009, 1008 from the read callback) calls
    ``Protocol.fail``, ``Connection.send_data``, and reads ``close_timeout``,
    ``connection_lost_waiter`` and ``loop`` (set by ``__init__``)."""
    assert callable(getattr(Protocol, "fail", None))
    assert callable(getattr(Connection, "send_data", None))
    assigned = Connection.__init__.__code__.co_names
    for name in ("close_timeout", "connection_lost_waiter", "loop"):
        assert name in assigned, name


async def test_a_connection_failed_from_the_read_callback_closes_with_its_code() -> None:
    async with _pair(FastReadClientConnection, BatchingConnection) as (client, server):
        assert isinstance(server, BatchingConnection)
        server.fail_connection(1008, "told why")
        assert server.protocol.state is not State.OPEN
        with pytest.raises(ConnectionClosed) as closed:
            await client.recv()
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, "told why")


def test_the_connection_records_why_it_failed_under_one_of_two_names() -> None:
    """``fail_connection`` records its reason through ``set_connection_exc``
    (websockets 17) or ``set_recv_exc`` (16): if neither exists, a failed
    connection's ``recv()`` would raise AttributeError instead of ConnectionClosed."""
    from websockets.asyncio.connection import Connection

    assert callable(getattr(Connection, "set_connection_exc", None)) or callable(
        getattr(Connection, "set_recv_exc", None)
    )
