"""Backpressure: a client that stops reading costs bounded memory and loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from typing import Any

import msgspec
import pytest
from websockets.exceptions import ConnectionClosed

from gateway.edge.backpressure import MAX_MERGED_BYTES, coalesce_entries
from gateway.edge.connection import ClientConnection
from gateway.edge.server import Gateway
from gateway.store.base import LogEntry
from protocol.events import Call, End, Error, Event, Metric, Respond, Think, encode
from tests.edge.conftest import GatewayFactory, http_get, metric_value, poll_until
from tests.support.client import GatewayClient, text_of

# --------------------------------------------------------------------- coalescing


def entry(event: Event, seq: int) -> LogEntry:
    event.seq = seq
    event.timestamp = float(seq)
    return LogEntry(seq, encode(event))


def decode(e: LogEntry) -> Any:
    from protocol.events import decode_event

    return decode_event(e.data)


def test_runs_of_one_kind_merge_into_one_frame_with_seq_from() -> None:
    events: list[Event] = [
        Think(content="a"),
        Think(content="b"),
        Think(content="c"),
        Call(content='{"name":"x","args":{}}'),
        Respond(content="He"),
        Respond(content="llo"),
        Think(content="!"),
        End(),
    ]
    entries = [entry(e, seq) for seq, e in enumerate(events, 10)]
    out, merged = coalesce_entries(entries)
    decoded = [decode(e) for e in out]
    assert merged == 5
    assert [type(e) for e in decoded] == [Think, Call, Respond, Think, End]
    think, call, respond, lone, end = decoded
    assert (think.content, think.seq_from, think.seq, think.timestamp) == ("abc", 10, 12, 12.0)
    assert call.seq == 13
    assert (respond.content, respond.seq_from, respond.seq) == ("Hello", 14, 15)
    assert lone.seq_from is msgspec.UNSET and lone.seq == 16  # a single chunk stays as is
    assert end.seq == 17
    assert [e.seq for e in out] == [12, 13, 15, 16, 17]


def test_a_gap_or_the_size_cap_ends_a_run() -> None:
    gap = [entry(Respond(content="a"), 1), entry(Respond(content="b"), 3)]
    out, merged = coalesce_entries(gap)
    assert merged == 0 and out == gap
    big = "x" * 1000
    many = [entry(Respond(content=big), seq) for seq in range(1, 101)]
    out, _ = coalesce_entries(many)
    assert all(len(e.data) <= MAX_MERGED_BYTES for e in out)
    frames = [decode(e) for e in out]
    assert "".join(f.content for f in frames) == big * 100
    assert frames[0].seq_from == 1 and frames[-1].seq == 100
    for before, after in itertools.pairwise(frames):
        assert after.seq_from == before.seq + 1


def test_merged_frames_keep_unicode_and_escapes_exact() -> None:
    parts = ['"quoted"\n', "tab\t", "emoji 🎉", "\u2028 sep", "back\\slash"]
    entries = [entry(Think(content=p), seq) for seq, p in enumerate(parts, 1)]
    out, _ = coalesce_entries(entries)
    assert len(out) == 1 and decode(out[0]).content == "".join(parts)


# --------------------------------------------------------------------- a live slow client


def server_side(gw: Gateway) -> ClientConnection:
    """The gateway's end of the slow client (the one furthest behind)."""
    return min(gw.connections, key=lambda c: c.last_sent)


def small_buffers(gw: Gateway) -> None:
    """Shrink the kernel's send buffers of connections the gateway accepts from now
    on (accepted sockets inherit the listener's), so a client that stops reading
    fills them after a few KB instead of several MB."""
    assert gw.server is not None
    for sock in gw.server.sockets:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)


def slow_socket(gw: Gateway) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    sock.setblocking(False)
    return sock


def assert_every_event_once(events: list[Event], first: int) -> None:
    """Contiguous seqs, where a coalesced frame covers ``seq_from..seq``."""
    expected = first
    for ev in events:
        if isinstance(ev, Error) and ev.code in ("bad_frame", "unknown_type", "turn_active"):
            continue
        start = getattr(ev, "seq_from", msgspec.UNSET)
        start = ev.seq if start is msgspec.UNSET else start
        assert start == expected, f"expected seq {expected}, got {start}..{ev.seq}"
        expected = ev.seq + 1


async def read_rest(client: GatewayClient) -> None:
    """Read until the turn's closing metric (or the connection closes)."""
    with contextlib.suppress(ConnectionClosed):
        await client.until(lambda e: isinstance(e, Metric), timeout=60)


LONG = "".join(f"{i:05d} " for i in range(4000))  # 24,000 characters, 6,000 chunks


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_a_client_that_stops_reading_stays_bounded_and_then_gets_everything(
    gateway_factory: GatewayFactory,
) -> None:
    limit = 64
    async with gateway_factory(
        send_queue_frames=limit, coalesce_after=8, slow_client_timeout=0
    ) as gw:
        small_buffers(gw)
        # The slow client holds few frames in its library queue, then stops reading.
        slow = await GatewayClient.connect(gw.url, sock=slow_socket(gw), max_queue=2)
        fast = await GatewayClient.connect(gw.url, session_id=slow.sid, after=0)
        events = await fast.turn(LONG)
        assert text_of(events, "respond") == "Echo: " + LONG
        # The whole turn is logged; the slow client read none of it, and what the
        # gateway holds for it is bounded (its socket may hold the merged rest).
        conn = server_side(gw)
        # Bounded by send_queue_frames (past it the client catches up from the
        # log) and by merging what is queued into few frames.
        assert len(conn.out.queue) <= limit
        assert conn.ws.transport.get_write_buffer_size() <= gw.config.write_limit + 65536
        # Reading again, it gets every event exactly once, some merged.
        await read_rest(slow)
        assert_every_event_once(slow.events, 1)
        assert slow.last_seq == fast.last_seq
        assert text_of(slow.events, "respond") == "Echo: " + LONG
        assert any(getattr(e, "seq_from", msgspec.UNSET) is not msgspec.UNSET for e in slow.events)
        assert len(slow.events) < fast.last_seq  # fewer frames than logged events
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_coalesced_chunks_total") > 0
        await slow.close()
        await fast.close()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_round_carrying_a_long_run_does_not_overfill_a_stalled_client(
    gateway_factory: GatewayFactory, redis_url: str
) -> None:
    """A store that answers late makes one log round carry thousands of a session's
    events: written at once in full, they sat in the socket buffer of a client that
    stopped reading, far past ``write_limit`` (144 KB against 32 in a CI run)."""
    import redis.asyncio

    async with gateway_factory(
        send_queue_frames=100_000, coalesce_after=8, slow_client_timeout=0
    ) as gw:
        small_buffers(gw)
        slow = await GatewayClient.connect(gw.url, sock=slow_socket(gw), max_queue=2)
        fast = await GatewayClient.connect(gw.url, session_id=slow.sid, after=0)
        admin = redis.asyncio.Redis.from_url(redis_url)
        try:
            await fast.user(LONG)
            await fast.until_type("user")  # logged: the answer streams in now, and piles up
            await admin.execute_command("CLIENT", "PAUSE", "1000", "WRITE")
        finally:
            await admin.aclose()
        await fast.until_type("end")
        conn = server_side(gw)
        assert conn.ws.transport.get_write_buffer_size() <= gw.config.write_limit + 65536
        await read_rest(slow)
        assert_every_event_once(slow.events, 1)
        assert text_of(slow.events, "respond") == "Echo: " + LONG
        await slow.close()
        await fast.close()


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_long_queue_is_coalesced_without_falling_back_to_the_log(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(
        send_queue_frames=100_000, coalesce_after=8, slow_client_timeout=0
    ) as gw:
        small_buffers(gw)
        slow = await GatewayClient.connect(gw.url, sock=slow_socket(gw), max_queue=2)
        fast = await GatewayClient.connect(gw.url, session_id=slow.sid, after=0)
        await fast.turn(LONG)
        await read_rest(slow)
        assert_every_event_once(slow.events, 1)
        assert text_of(slow.events, "respond") == "Echo: " + LONG
        assert len(slow.events) < fast.last_seq  # fewer frames than logged events
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_client_catchups_total") == 0
        await slow.close()
        await fast.close()


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_client_that_reads_nothing_is_closed_4008_and_resumes_losslessly(
    gateway_factory: GatewayFactory,
) -> None:
    # 1 s: the fast client, on the same 4 KB socket buffers, must not look
    # stalled when a busy machine holds this process back for a moment (0.3 s
    # reaped it once in CI, 6 events before the end of its turn).
    async with gateway_factory(send_queue_frames=64, slow_client_timeout=1.0) as gw:
        small_buffers(gw)
        slow = await GatewayClient.connect(gw.url, sock=slow_socket(gw), max_queue=2)
        fast = await GatewayClient.connect(gw.url, session_id=slow.sid, after=0)
        # The turn runs on while the slow client is reaped: the slow client must
        # start reading within the close grace of the reap, however long the
        # turn takes on a busy machine, or it sees an abort instead of the 4008.
        turn = asyncio.create_task(fast.turn(LONG))

        async def reaped() -> bool:
            _, text = await http_get(gw, "/metrics")
            return metric_value(text, "rtgw_slow_client_closes_total") == 1

        await poll_until(reaped, "the gateway gives up on the slow client")
        await read_rest(slow)  # what was buffered, then the close frame
        await turn
        assert slow.ws.close_code == 4008
        assert slow.ws.close_reason is not None and "after=" in slow.ws.close_reason
        # Its events stayed in the log: resume after the last seq it got.
        again = await GatewayClient.connect(gw.url, session_id=slow.sid, after=slow.last_seq)
        await read_rest(again)
        got = slow.events + again.events
        assert_every_event_once(got, 1)
        assert text_of(got, "respond") == "Echo: " + LONG
        await again.close()
        await fast.close()


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_client_flooding_frames_without_reading_replies_stays_bounded(
    gateway_factory: GatewayFactory,
) -> None:
    limit = 32
    async with gateway_factory(send_queue_frames=limit, slow_client_timeout=0) as gw:
        small_buffers(gw)
        slow = await GatewayClient.connect(gw.url, sock=slow_socket(gw), max_queue=2)
        conn = server_side(gw)
        for _ in range(3000):  # each one earns a bad_frame reply it never reads
            await slow.send("{not json" + "x" * 200)

        async def dropped() -> bool:
            _, text = await http_get(gw, "/metrics")
            return metric_value(text, "rtgw_replies_dropped_total") > 0

        await poll_until(dropped, "replies beyond the queue limit are dropped")
        assert len(conn.out.queue) <= limit
        slow.ws.transport.abort()  # it reads nothing, so no close handshake can finish


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_a_client_too_far_behind_catches_up_from_the_log(
    gateway_factory: GatewayFactory,
) -> None:
    # No merging: the only way to stay bounded is to drop the queue and read
    # the log later, which is what a client that falls this far behind gets.
    async with gateway_factory(send_queue_frames=64, coalesce_after=0, slow_client_timeout=0) as gw:
        small_buffers(gw)
        slow = await GatewayClient.connect(gw.url, sock=slow_socket(gw), max_queue=2)
        fast = await GatewayClient.connect(gw.url, session_id=slow.sid, after=0)
        await fast.turn(LONG)
        assert len(server_side(gw).out.queue) <= 64
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_client_catchups_total") >= 1
        await read_rest(slow)
        assert [e.seq for e in slow.events] == list(range(1, fast.last_seq + 1))
        assert text_of(slow.events, "respond") == "Echo: " + LONG
        await slow.close()
        await fast.close()
