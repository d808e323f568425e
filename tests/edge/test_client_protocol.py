"""The client protocol's edges: ping/pong, timestamps, empty messages, event mode, ``after``.

Issues 13.7 and 19 (first-hour server bits and event mode).
"""

from __future__ import annotations

import itertools
import time
from urllib.parse import quote

import pytest
from websockets.asyncio.client import connect

from protocol.events import Error, Event, Pong, Respond, Think, User, decode_event
from tests.edge.conftest import GatewayFactory, refusal
from tests.support.client import GatewayClient, text_of

memory_only = pytest.mark.parametrize("store_kind", ["memory"])


def _recent(timestamp: float) -> bool:
    return abs(time.time() - timestamp) < 60


@memory_only
async def test_ping_gets_pong_and_unlogged_frames_carry_real_timestamps(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        assert _recent(client.session.timestamp)
        await client.turn("hello")
        last = client.last_seq
        await client.send({"type": "ping"})
        pong = await client.next()
        assert isinstance(pong, Pong) and pong.seq == last and _recent(pong.timestamp)
        await client.send("{not json")
        error = await client.next()
        assert isinstance(error, Error) and error.seq == last and _recent(error.timestamp)
        await client.close()


@memory_only
async def test_an_empty_or_blank_user_message_is_a_bad_frame(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        for content in ("", "   \n\t"):
            await client.user(content)
            error = await client.next()
            assert isinstance(error, Error) and error.code == "bad_frame", error
            assert "empty" in error.content
        # Nothing was logged and the session still works.
        assert error.seq == 0
        assert text_of(await client.turn("hello"), "respond") == "Echo: hello"
        await client.close()


def _chunks(events: list[Event]) -> list[Think | Respond]:
    return [e for e in events if isinstance(e, Think | Respond)]


async def test_event_mode_sends_one_think_and_one_respond_per_segment(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        tokens = await GatewayClient.connect(gw.url)
        token_chunks = _chunks(await tokens.turn("hello"))
        assert len(token_chunks) > 2  # token mode: a frame per model chunk
        await tokens.close()

        client = await GatewayClient.connect(f"{gw.url}?stream=event")
        events = await client.turn("hello")
        chunks = _chunks(events)
        assert [type(c) for c in chunks] == [Think, Respond], chunks
        think, respond = chunks
        assert respond.content == "Echo: hello" and think.content
        # seq_from..seq covers the joined chunks, and the stream stays contiguous.
        seqs: list[tuple[int, int]] = []
        for e in events:
            first = e.seq_from if isinstance(e, Think | Respond) and e.seq_from else e.seq
            seqs.append((int(first), e.seq))
        for (_, prev), (first, _) in itertools.pairwise(seqs):
            assert first == prev + 1, seqs
        sid, last = client.sid, client.last_seq
        await client.close()

        # Replay in event mode joins the same way.
        async with connect(f"{gw.url}?stream=event&session_id={sid}&after=0") as ws:
            decode_event(await ws.recv())  # session
            replayed: list[Event] = []
            while not replayed or replayed[-1].seq < last:
                replayed.append(decode_event(await ws.recv()))
        assert [type(c) for c in _chunks(replayed)] == [Think, Respond]
        assert [e.seq for e in replayed] == [e.seq for e in events]


@memory_only
async def test_an_unknown_stream_mode_is_refused(gateway_factory: GatewayFactory) -> None:
    async with gateway_factory() as gw:
        status, body, _ = await refusal(f"{gw.url}?stream=words")
        assert status == 400 and "stream=event" in body


async def test_bad_after_values_are_refused_naming_the_last_seq(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        await client.turn("hello")
        sid, last = client.sid, client.last_seq
        await client.close()
        # "²" is a digit to str.isdigit (was HTTP 500); 40 digits opened then
        # closed silently; past the end dropped the next turn's events.
        for after in ("²", "١٢", "4" * 40, str(last + 1), "-1", "+3", " 3", "1e3"):
            status, body, _ = await refusal(f"{gw.url}?session_id={sid}&after={quote(after)}")
            assert status == 400, after
            assert f"last seq is {last}" in body, body
        # A new session has nothing after 0.
        status, body, _ = await refusal(f"{gw.url}?after=5")
        assert status == 400 and "last seq 0" in body
        # Every seq from 0 to the last one resumes.
        for after in (0, last):
            again = await GatewayClient.connect(gw.url, session_id=sid, after=after)
            assert again.session.seq == last
            await again.close()


@memory_only
async def test_a_resume_from_before_the_trimmed_log_is_told_the_gap_then_continues(
    gateway_factory: GatewayFactory,
) -> None:
    """``log_trimmed``: the events no longer kept, named, then every kept one in order."""
    async with gateway_factory(max_log=10) as gw:
        client = await GatewayClient.connect(gw.url)
        for text in ("one", "two", "three"):
            await client.turn(text)
        sid, last = client.sid, client.last_seq
        await client.close()
        first_kept = await gw.node.store.first_seq(sid)
        assert first_kept > 3, "the log was not trimmed: the test needs more events"

        again = await GatewayClient.connect(gw.url, session_id=sid, after=1)
        gap = await again.next()
        assert isinstance(gap, Error) and gap.code == "log_trimmed", gap
        assert gap.seq == 1
        assert f"events 2..{first_kept - 1} are no longer in the session log" in gap.content
        replay = [await again.next() for _ in range(last - first_kept + 1)]
        assert [e.seq for e in replay] == list(range(first_kept, last + 1))
        assert text_of(replay, "respond").endswith("Echo: three")
        # A resume inside the kept log is not told of any gap.
        await again.close()
        inside = await GatewayClient.connect(gw.url, session_id=sid, after=first_kept)
        assert (await inside.next()).seq == first_kept + 1
        await inside.close()


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_a_resume_over_large_events_replays_every_one_a_page_of_bytes_at_a_time(
    gateway_factory: GatewayFactory,
) -> None:
    """Replay pages are cut by bytes (about 1 MiB) as well as by count: a client
    resuming over megabytes of events gets each of them, in order, none skipped
    where a page ended early because of its size."""
    # 2.4 MB of user messages; the simulator answers each with a short count (/context).
    big = [f"{n}:" + "x" * 300_000 + "\n/context" for n in range(8)]
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        for text in big:
            await client.turn(text)
        sid, last = client.sid, client.last_seq
        await client.close()

        again = await GatewayClient.connect(gw.url, session_id=sid, after=0)
        replay = [await again.next()]
        while replay[-1].seq < last:
            replay.append(await again.next())
        await again.close()
    assert [e.content for e in replay if isinstance(e, User)] == big
    assert len({e.seq for e in replay}) == len(replay) == last  # each once, none merged away
