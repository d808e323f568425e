"""``SessionLog``: number, stamp, log, then send; held and settled when an append fails."""

from __future__ import annotations

import asyncio

import pytest

from gateway.metrics import Metrics
from gateway.sessions.session_log import SessionLog
from gateway.store.base import LeaseLost, SeqConflict, StoreUnavailable
from protocol.assembly import decode_history_item
from protocol.events import (
    Error,
    Metric,
    Respond,
    SpeechStarted,
    Think,
    User,
    decode_event,
)
from protocol.metering import ZERO_USAGE
from tests.sessions.fakes import Subscriber, Writer

pytestmark = pytest.mark.timeout(10)

NOW = 1_700_000_000.0


def session_log(
    writer: Writer, *, last_seq: int = 0, retry_delay: float = 0.0
) -> tuple[SessionLog, Subscriber, list[str]]:
    lost: list[str] = []
    log = SessionLog(
        "sid-1",
        last_seq=last_seq,
        history=[],
        writer=writer,  # type: ignore[arg-type]
        metrics=Metrics(),
        retry_delay=retry_delay,
        clock=lambda: NOW,
        on_lost=lost.append,
    )
    client = Subscriber()
    log.subscribers.add(client)
    return log, client, lost


async def test_events_are_numbered_from_the_log_and_sent_only_once_stored() -> None:
    writer = Writer()
    log, client, _ = session_log(writer, last_seq=41)
    log.emit(User(content="hello"))
    log.emit(Respond(content="hi"))
    assert log.last_seq == 43
    assert writer.marked == [log]  # one mark for the batch, not one per event
    assert client.entries == []  # nothing reaches a client before the store has it

    _, batch = writer.take()
    assert batch is not None
    entries, history = batch
    assert [e.seq for e in entries] == [42, 43] and history == []
    first = decode_event(entries[0].data)
    assert isinstance(first, User) and first.seq == 42 and first.timestamp == NOW
    log.appended(batch, None)
    assert [e.seq for e in client.events] == [42, 43]
    assert log.delivered_seq == 43


async def test_a_turns_first_content_hurries_its_round_once() -> None:
    """After ``hurry_next`` (the driver's first delta) the next event, once marked,
    ends a lingering round; the events after it do not."""
    writer = Writer()
    log, _, _ = session_log(writer)
    log.emit(Respond(content="mid-stream"))
    assert writer.hurried == []
    log.hurry_next()
    log.emit(Respond(content="The"))
    log.emit(Respond(content=" answer"))
    assert writer.hurried == [[log]]  # once, with the first content already marked


async def test_someone_waiting_for_the_log_hurries_its_round() -> None:
    """A tool about to run, a turn ending: ``flushed`` ends a lingering round, and
    returns once the batch is stored; with nothing unwritten it hurries nothing."""
    writer = Writer()
    log, _, _ = session_log(writer)
    await asyncio.wait_for(log.flushed(), 1)
    assert writer.hurried == []
    log.emit(Respond(content="calling a tool"))
    waiting = asyncio.create_task(log.flushed())
    while not writer.hurried:  # noqa: ASYNC110 - the fake writer exposes no event for it
        await asyncio.sleep(0)
    assert writer.hurried == [[log]] and not waiting.done()
    _, batch = writer.take()
    assert batch is not None
    log.appended(batch, None)
    await asyncio.wait_for(waiting, 1)


async def test_history_rides_with_the_next_append() -> None:
    writer = Writer()
    log, _, _ = session_log(writer)
    log.persist([User(content="remember me")])
    log.emit(User(content="remember me"))
    _, batch = writer.take()
    assert batch is not None
    assert [decode_history_item(h) for h in batch[1]] == [User(content="remember me")]
    assert log.history == [User(content="remember me")]


async def test_history_items_take_the_seq_of_their_first_event_or_of_the_last_logged() -> None:
    log, _, _ = session_log(Writer(), last_seq=9)
    log.emit(User(content="question", reply_to="c1"))
    log.persist([User(content="question")])  # stored right after its event: its seq
    chunk = Respond(content="an")
    log.emit(chunk)
    log.emit(Respond(content="swer"))
    log.persist([Respond(content="answer")], [chunk])  # an answer: its first chunk's
    assert [item.seq for item in log.history] == [10, 11]


async def test_flushed_waits_for_the_last_append() -> None:
    writer = Writer()
    log, _, _ = session_log(writer)
    await asyncio.wait_for(log.flushed(), 1)  # nothing emitted: flushed at once
    log.emit(User(content="x"))
    waiting = asyncio.ensure_future(log.flushed())
    await asyncio.sleep(0)
    assert not waiting.done()
    _, batch = writer.take()
    assert batch is not None
    log.appended(batch, None)
    await asyncio.wait_for(waiting, 1)


async def test_an_append_that_failed_in_flight_is_held_told_once_and_retried() -> None:
    writer = Writer()
    log, client, _ = session_log(writer)
    log.emit(User(content="one"))
    _, first = writer.take()
    assert first is not None
    log.appended(first, StoreUnavailable("redis restarting"))
    assert log.unsure == first and client.entries == []
    [notice] = client.notices
    assert notice.code == "store" and notice.seq == 0 and notice.timestamp == NOW

    await asyncio.wait_for(writer.marks.wait(), 1)  # retried after retry_delay
    log.emit(User(content="two"))
    _, second = writer.take()
    assert second is not None
    log.appended(second, StoreUnavailable("still down"))
    assert len(client.notices) == 1  # one outage, one notice
    # The unsure batch stays what was sent; the second, never sent while the first
    # could not be settled, goes back to pending and is taken with the next round.
    assert log.unsure is not None and [e.seq for e in log.unsure[0]] == [1]
    await asyncio.wait_for(writer.marks.wait(), 1)
    _, third = writer.take()
    assert third is not None and [e.seq for e in third[0]] == [2]


async def test_a_held_batch_that_landed_after_all_is_sent_not_written_again() -> None:
    writer = Writer()
    log, client, _ = session_log(writer)
    log.emit(User(content="one"))
    _, held = writer.take()
    assert held is not None
    log.appended(held, StoreUnavailable("the connection broke in flight"))
    log.emit(User(content="two"))
    _, batch = writer.take()
    assert batch is not None
    # The log's last seq says the held append was stored: only the new batch goes.
    rest = log.settle_unsure(1, batch)
    assert [e.seq for e in client.events] == [1]
    assert rest is not None and [e.seq for e in rest[0]] == [2]
    log.appended(rest, None)
    assert [e.seq for e in client.events] == [1, 2]
    assert log.unsure is None


async def test_a_held_batch_that_did_not_land_goes_again_before_the_new_one() -> None:
    writer = Writer()
    log, client, _ = session_log(writer)
    log.emit(User(content="one"))
    _, held = writer.take()
    assert held is not None
    log.appended(held, StoreUnavailable("down"))
    await asyncio.wait_for(writer.marks.wait(), 1)
    _, nothing_new = writer.take()  # the retry's mark: only the held batch is due
    assert nothing_new == ([], [])
    rest = log.settle_unsure(0, ([], []))
    assert rest is not None and [e.seq for e in rest[0]] == [1]
    assert client.entries == []
    log.appended(rest, None)
    assert [e.seq for e in client.events] == [1]
    await asyncio.wait_for(log.flushed(), 1)


@pytest.mark.parametrize("error", [LeaseLost("taken by node-b", "node-b"), SeqConflict("seq 3")])
async def test_another_owner_stops_the_log_and_tells_the_session(error: Exception) -> None:
    writer = Writer()
    log, client, lost = session_log(writer)
    log.emit(User(content="one"))
    _, batch = writer.take()
    assert batch is not None
    log.emit(User(content="two"))  # pending when the loss is reported: dropped
    log.appended(batch, error)
    assert lost == [str(error)] and log.lost
    assert client.entries == []
    await asyncio.wait_for(log.flushed(), 1)  # nobody waits forever for a lost session
    assert log.take_batch() is None


async def test_a_writer_that_broke_on_the_batch_loses_the_session() -> None:
    log, _, lost = session_log(Writer())
    log.emit(User(content="x"))
    log.write_failed()
    assert lost == ["internal error while logging"] and log.take_batch() is None


async def test_a_stopped_log_writes_nothing_more() -> None:
    writer = Writer()
    log, _, lost = session_log(writer)
    log.emit(User(content="x"))
    log.stop()
    assert writer.take()[1] is None and lost == []


async def test_notices_audio_and_the_loss_reach_every_client() -> None:
    log, one, _ = session_log(Writer())
    two = Subscriber()
    log.subscribers.add(two)
    log.notify(Error(code="store", content="down", seq=0))
    log.deliver_audio(b"\x00\x01")
    log.session_lost("moved to node-b")
    for client in (one, two):
        assert [n.code for n in client.notices] == ["store"]
        assert client.audio == [b"\x00\x01"] and client.lost == ["moved to node-b"]
    assert log.subscribers == set()


async def test_only_a_responses_streamed_chunks_may_wait_for_company() -> None:
    """A chunk mid-stream may wait in a lingering round; anything a client acts on (a
    response's end, speech that interrupts, a call to run) hurries its round."""
    writer = Writer()
    log, _, _ = session_log(writer)
    log.emit(User(content="the user's own message"))
    log.emit(Respond(content="mid"))
    log.emit(Think(content="stream"))
    assert writer.hurried == []
    log.emit(SpeechStarted(offset_ms=120))
    assert writer.hurried == [[log]]
    writer.take()
    log.emit(Metric(step=ZERO_USAGE, total=ZERO_USAGE))
    assert writer.hurried == [[log], [log]]
