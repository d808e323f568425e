"""The log writer's rounds in flight: a second round goes before the first is
answered, with the sessions that marked meanwhile, and no session ever has two
appends in flight (its order and the "maybe stored" rule depend on it).

The store holds every round until the test answers it, so what is in flight
when is decided by the test, not by timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from gateway.sessions.logwriter import ROUNDS_IN_FLIGHT, Batch, LogWriter
from gateway.store import MemoryStore
from gateway.store.base import LogEntry, StoreUnavailable

from .test_logwriter_linger import NODE, Session, sessions

pytestmark = pytest.mark.timeout(20)

Answer = Callable[[list[BaseException | None]], None]


class HeldStore(MemoryStore):
    """A memory store whose ``submit_appends`` waits for the test to answer each round."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[tuple[list[str], Answer]] = []
        self.sent = asyncio.Event()

    def submit_appends(
        self,
        batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]],
        on_done: Answer,
    ) -> None:
        sids = [sid for sid, *_ in batches]

        async def answer_later(result: list[BaseException | None] | None = None) -> None:
            if result is None:
                result = await self.append_many(batches)
            on_done(result)

        def answer(result: list[BaseException | None] | None = None) -> None:
            asyncio.get_running_loop().create_task(answer_later(result))

        self.rounds.append((sids, answer))
        self.sent.set()

    async def round_sent(self, count: int) -> list[str]:
        """The sessions of round ``count`` (1-based), once it is sent."""
        while len(self.rounds) < count:
            self.sent.clear()
            await self.sent.wait()
        return self.rounds[count - 1][0]

    def answer(self, index: int, result: list[BaseException | None] | None = None) -> None:
        self.rounds[index - 1][1](result)


def mark(writer: LogWriter, session: Session) -> None:
    session.emit()
    writer.mark(session)


async def test_a_second_round_goes_while_the_first_is_in_flight() -> None:
    """Up to ``ROUNDS_IN_FLIGHT`` rounds go unanswered; the next waits for one of them."""
    store = HeldStore()
    writer = LogWriter(store, NODE)
    made = await sessions(store, ROUNDS_IN_FLIGHT + 1)
    *out, late = made
    try:
        for n, session in enumerate(out, 1):
            mark(writer, session)  # the rounds before are not answered: it need not wait
            assert await store.round_sent(n) == [session.sid]
        mark(writer, late)  # every round in flight: it waits for one of them
        await asyncio.sleep(0)  # the loop pass a round would be started in
        assert len(store.rounds) == ROUNDS_IN_FLIGHT
        store.answer(2)
        assert await store.round_sent(ROUNDS_IN_FLIGHT + 1) == [late.sid]
        await out[1].stored.wait()
        assert not out[0].stored.is_set()
        for n in range(1, ROUNDS_IN_FLIGHT + 2):
            if n != 2:
                store.answer(n)
        await asyncio.gather(*(session.stored.wait() for session in made))
        assert [session.result for session in made] == [None] * len(made)
    finally:
        await writer.close()


async def test_a_session_never_has_two_appends_in_flight() -> None:
    """Its next batch waits for the answer to its previous one, even with a round free."""
    store = HeldStore()
    writer = LogWriter(store, NODE)
    a, b = await sessions(store, 2)
    try:
        mark(writer, a)
        assert await store.round_sent(1) == ["s0"]
        mark(writer, a)  # a's first append is in flight
        mark(writer, b)
        assert await store.round_sent(2) == ["s1"]  # b goes; a does not
        store.answer(2)
        await b.stored.wait()
        assert len(store.rounds) == 2  # a still waits for its first answer
        store.answer(1)
        assert await store.round_sent(3) == ["s0"]
        await a.stored.wait()  # the answer to its first append
        a.stored.clear()
        store.answer(3)
        await a.stored.wait()
        assert [e.seq for e in await store.read_log("s0", 0)] == [1, 2]
    finally:
        await writer.close()


class Unsure(Session):
    """A session that holds a failed batch, as the runtime does, and tells the writer."""

    def __init__(self, sid: str) -> None:
        super().__init__(sid)
        self.held: Batch | None = None
        self.failures = 0

    @property
    def unsure(self) -> Batch | None:
        return self.held

    def take_batch(self) -> Batch | None:
        return [LogEntry(self.seq, b"token %d" % self.seq)], []

    def settle_unsure(self, stored_last: int, batch: Batch) -> Batch | None:
        held, self.held = self.held, None
        assert held is not None
        if stored_last >= held[0][-1].seq:
            return batch
        return held[0] + batch[0], held[1] + batch[1]

    def appended(self, batch: Batch, result: BaseException | None) -> None:
        if result is not None:
            self.failures += 1
            self.held = batch
        super().appended(batch, result)


async def test_a_failed_round_leaves_the_other_round_and_the_order_intact() -> None:
    """Round 1 fails ("maybe stored") while round 2 is out: a's events are held and
    written in order afterwards; b's round is untouched."""
    store = HeldStore()
    writer = LogWriter(store, NODE)
    a = Unsure("s0")
    b = Unsure("s1")
    for session in (a, b):
        assert await store.acquire_lease(session.sid, NODE, 60)
    try:
        mark(writer, a)
        await store.round_sent(1)
        mark(writer, b)
        await store.round_sent(2)
        store.answer(1, [StoreUnavailable("connection lost after the round was sent")])
        await a.stored.wait()
        assert a.failures == 1
        store.answer(2)
        await b.stored.wait()
        assert b.result is None
        mark(writer, a)  # the retry: settled against the log, the held batch first
        await a.stored.wait()
        assert (a.result, a.held) == (None, None)
        assert [e.seq for e in await store.read_log("s0", 0)] == [1, 2]
        assert [e.seq for e in await store.read_log("s1", 0)] == [1]
    finally:
        await writer.close()
