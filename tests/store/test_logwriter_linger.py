"""The log writer's linger: light steady traffic shares round trips, a lone event does not wait.

The linger is set far longer than the test timeout, so a round that waited
for it when it should not would fail the test by timing out; the rounds are
counted, not timed.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

from gateway.sessions.logwriter import (
    LINGER_COMPANY,
    LINGER_LATE,
    LINGER_SHARE,
    ROUNDS_IN_FLIGHT,
    Batch,
    LogWriter,
    _Linger,
)
from gateway.store import MemoryStore
from gateway.store.base import LogEntry

NODE = "node-a"
LONG = 600.0  # seconds: longer than any test may run


class Session:
    """A session with one event to log; ``stored`` is set once its append is reported."""

    def __init__(self, sid: str) -> None:
        self._sid = sid
        self.seq = 0
        self.stored = asyncio.Event()
        self.result: BaseException | None = None

    @property
    def sid(self) -> str:
        return self._sid

    @property
    def unsure(self) -> Batch | None:
        return None

    def emit(self) -> None:
        self.seq += 1
        self.stored.clear()

    def take_batch(self) -> Batch | None:
        return [LogEntry(self.seq, b"token %d" % self.seq)], []

    def settle_unsure(self, stored_last: int, batch: Batch) -> Batch | None:
        return batch

    def appended(self, batch: Batch, result: BaseException | None) -> None:
        self.result = result
        self.stored.set()

    def write_failed(self) -> None:
        raise AssertionError("the writer broke")


async def sessions(store: MemoryStore, count: int, prefix: str = "s") -> list[Session]:
    made = [Session(f"{prefix}{i}") for i in range(count)]
    for session in made:
        assert await store.acquire_lease(session.sid, NODE, 60)
    return made


async def test_a_lone_event_after_a_quiet_spell_is_written_at_once() -> None:
    store = MemoryStore()
    writer = LogWriter(store, NODE, linger=LONG)
    (session,) = await sessions(store, 1)
    try:
        session.emit()
        writer.mark(session)
        await session.stored.wait()  # would wait LONG if it lingered
        assert session.result is None
        assert (writer.rounds, writer.lingered) == (1, 0)
        assert [e.seq for e in await store.read_log(session.sid, 0)] == [1]
    finally:
        await writer.close()


async def steady(writer: LogWriter, store: MemoryStore) -> None:
    """Marks coming faster than the linger (a round of them): traffic the writer calls steady."""
    made = await sessions(store, 20, prefix="warm")
    for session in made:
        session.emit()
        writer.mark(session)
    await asyncio.gather(*(session.stored.wait() for session in made))


async def test_steady_light_traffic_shares_one_round_until_company_came() -> None:
    store = MemoryStore()
    writer = LogWriter(store, NODE, linger=LONG)
    others = await sessions(store, LINGER_COMPANY)  # LINGER_COMPANY in round two
    try:
        await steady(writer, store)
        # Marks come fast and the first session of the round has not marked
        # before: the round lingers for company, and goes as soon as
        # LINGER_COMPANY sessions are waiting, inside that last mark.
        second, *rest = others
        second.emit()
        writer.mark(second)
        while not writer.lingered:  # noqa: ASYNC110 - the writer exposes no event for it
            await asyncio.sleep(0)
        for session in rest:
            session.emit()
            writer.mark(session)
        await asyncio.gather(*(session.stored.wait() for session in others))
        assert all(session.result is None for session in others)
        assert (writer.rounds, writer.lingered) == (2, 1)
        for session in others:
            assert [e.seq for e in await store.read_log(session.sid, 0)] == [1]
    finally:
        await writer.close()


async def test_no_linger_by_setting_writes_every_round_at_once() -> None:
    store = MemoryStore()
    writer = LogWriter(store, NODE, linger=0.0)
    (session,) = await sessions(store, 1)
    try:
        for _ in range(3):
            session.emit()
            writer.mark(session)
            await session.stored.wait()
        assert (writer.rounds, writer.lingered) == (3, 0)
        assert [e.seq for e in await store.read_log(session.sid, 0)] == [1, 2, 3]
    finally:
        await writer.close()


def patience(writer: LogWriter) -> float:
    """How long the writer's next (or lingering) round may wait for company."""
    linger = writer._linger
    assert linger is not None
    return linger.patience


async def test_a_round_waits_at_most_a_share_of_its_sessions_pace() -> None:
    """A session that marked a moment ago (a fast stream, a burst) is not kept waiting
    for the linger: its round's patience is LINGER_SHARE of the time since that mark.

    The linger is LONG, so a round that took it as its patience would time the
    test out; the clock is read only to check the patience the writer took."""
    store = MemoryStore()
    writer = LogWriter(store, NODE, linger=LONG)
    (session,) = await sessions(store, 1)
    try:
        await steady(writer, store)
        session.emit()
        writer.mark(session)  # first mark: the linger's whole patience
        assert patience(writer) == LONG and writer.lingered == 1
        writer.hurry()
        await session.stored.wait()
        before = perf_counter()
        session.emit()
        writer.mark(session)  # a moment after its previous mark
        assert 0 < patience(writer) <= (perf_counter() - before + 1.0) * LINGER_SHARE
        await session.stored.wait()  # would wait LONG with the linger's patience
        assert [e.seq for e in await store.read_log(session.sid, 0)] == [1, 2]
    finally:
        await writer.close()


async def test_a_mark_late_in_the_patience_starts_the_round_without_its_timer() -> None:
    """Marks right after the first wait with it; one LINGER_LATE into the patience
    starts the round inside ``mark`` (the loop is awake for it: no timer wake-up).

    Counted the moment ``mark`` returns: nothing is timed but the gap the rule is about.
    """
    linger = 0.2
    store = MemoryStore()
    writer = LogWriter(store, NODE, linger=linger)
    second, third, fourth = await sessions(store, 3)
    try:
        await steady(writer, store)
        assert writer.rounds == 1
        second.emit()
        writer.mark(second)  # first mark of its own: the whole linger's patience
        assert writer.lingered == 1 and patience(writer) == linger
        third.emit()
        writer.mark(third)  # at once: it keeps waiting
        assert writer.rounds == 1
        await asyncio.sleep(linger * LINGER_LATE)  # the gap under test, not a synchronisation
        fourth.emit()
        writer.mark(fourth)
        assert writer.rounds == 2  # started inside mark(), with all three
        await asyncio.gather(*(s.stored.wait() for s in (second, third, fourth)))
        for session in (second, third, fourth):
            assert [e.seq for e in await store.read_log(session.sid, 0)] == [1]
    finally:
        await writer.close()


async def test_a_turns_first_content_ends_a_lingering_round() -> None:
    """The first word of an answer goes in the next loop pass, not after the linger."""
    store = MemoryStore()
    writer = LogWriter(store, NODE, linger=LONG)
    waiting, first = await sessions(store, 2)
    try:
        await steady(writer, store)
        waiting.emit()
        writer.mark(waiting)  # steady traffic: this round lingers for company
        while not writer.lingered:  # noqa: ASYNC110 - the writer exposes no event for it
            await asyncio.sleep(0)
        first.emit()
        writer.mark(first)
        writer.hurry()  # ``first`` carries a turn's first content event
        await asyncio.gather(waiting.stored.wait(), first.stored.wait())  # would wait LONG
        assert (writer.rounds, writer.lingered, writer.hurried) == (2, 1, 1)
        assert [e.seq for e in await store.read_log(first.sid, 0)] == [1]
    finally:
        await writer.close()


async def test_the_session_that_hurried_is_answered_first_in_its_round() -> None:
    """The store answers a round at once, and its sessions are handed their events in
    the round's order, each a client write: the first word goes before the chunks
    that marked ahead of it, and an append still in flight keeps its session first
    in the round after."""
    store = HeldStore()
    writer = LogWriter(store, NODE, linger=LONG)
    order: list[str] = []
    *chunks, first = await sessions(store, LINGER_COMPANY - 1)
    for session in (*chunks, first):
        session.appended = lambda batch, result, s=session: order.append(s.sid)  # type: ignore[method-assign]
    try:
        for session in (*chunks, first):
            session.emit()
            writer.mark(session)
        writer.hurry(first)  # ``first`` marked last and carries a turn's first content
        while not store.held:  # noqa: ASYNC110 - the store exposes no event for it
            await asyncio.sleep(0)
        store.answer_all()
        assert order == [first.sid, *(s.sid for s in chunks)]

        # Again, with ``first``'s previous append in flight: it stays first for the
        # round it joins once that append is answered, though a round went meanwhile
        # and another session marked before it joined.
        order.clear()
        busy, late, later = chunks[: ROUNDS_IN_FLIGHT - 1], chunks[-2], chunks[-1]
        for out, session in enumerate((first, *busy), 1):  # ROUNDS_IN_FLIGHT rounds out
            session.emit()
            writer.mark(session)
            while len(store.held) < out:  # noqa: ASYNC110
                await asyncio.sleep(0)
        first.emit()
        writer.mark(first)  # deferred: its previous append is in flight
        writer.hurry(first)
        late.emit()
        writer.mark(late)  # held back by the rounds in flight

        def answer(index: int) -> None:
            results, on_done = store.held.pop(index)
            on_done(results)

        answer(1)  # ``busy[0]``'s round: ``late`` goes in a round without ``first``
        while len(store.held) < ROUNDS_IN_FLIGHT:  # noqa: ASYNC110
            await asyncio.sleep(0)
        later.emit()
        writer.mark(later)  # held back again
        answer(0)  # ``first``'s previous append: ``first`` joins ``later``'s round
        while len(store.held) < ROUNDS_IN_FLIGHT:  # noqa: ASYNC110
            await asyncio.sleep(0)
        store.answer_all()
        rest = [s.sid for s in busy[1:]]
        assert order == [busy[0].sid, first.sid, *rest, late.sid, first.sid, later.sid]
    finally:
        store.answer_all()
        await writer.close()


class HeldStore(MemoryStore):
    """Appends answered only when the test says so: rounds stay in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[list[BaseException | None], Any]] = []

    def submit_appends(self, batches: Any, on_done: Any) -> None:
        self.held.append((self._append_all(batches), on_done))

    def answer_all(self) -> None:
        held, self.held = self.held, []
        for results, on_done in held:
            on_done(results)


async def test_a_turns_first_content_does_not_wait_for_the_rounds_in_flight() -> None:
    """Under load both rounds are out; the first word goes in a third, not after an answer."""
    store = HeldStore()
    writer = LogWriter(store, NODE, linger=LONG)
    out = await sessions(store, ROUNDS_IN_FLIGHT + 2)
    *busy, waiting, first = out
    try:
        for session in busy:
            session.emit()
            writer.mark(session)
            while len(store.held) < busy.index(session) + 1:  # noqa: ASYNC110 - no event
                await asyncio.sleep(0)
        waiting.emit()
        writer.mark(waiting)  # held back: ROUNDS_IN_FLIGHT rounds are out
        first.emit()
        writer.mark(first)
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(store.held) == ROUNDS_IN_FLIGHT  # nothing went without the hurry
        writer.hurry()  # ``first`` carries a turn's first content event
        for _ in range(3):  # the round starts in the next loop pass
            await asyncio.sleep(0)
        assert len(store.held) == ROUNDS_IN_FLIGHT + 1  # a third round, not after an answer
        assert writer.hurried == 1
        store.answer_all()
        await asyncio.gather(waiting.stored.wait(), first.stored.wait())
        assert [e.seq for e in await store.read_log(first.sid, 0)] == [1]
    finally:
        store.answer_all()
        await writer.close()


def test_the_linger_forgets_sessions_too_quiet_to_shorten_a_round() -> None:
    """A session's previous mark matters only while it is recent enough to give less
    than the whole linger; older ones are dropped, so sessions that ended are not kept."""
    linger = _Linger(0.01)
    recent, ended = object(), object()
    horizon = 0.01 / LINGER_SHARE  # a mark older than this gives the whole linger
    linger.marks = {ended: 0.0, recent: 1.0 - horizon / 2}
    linger.prune(1.0)
    assert linger.marks == {recent: 1.0 - horizon / 2}
    assert linger.prune_at > 1.0
