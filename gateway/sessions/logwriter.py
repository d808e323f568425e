"""One writer for the event logs of every session a node drives.

"Log, then send" puts a store write in front of every batch of events. With a
writer task per session, each token cost two task wake-ups (the writer woken
by the event, then by the store's answer) on top of the store call itself;
at a thousand sessions streaming, those wake-ups were a large share of the
node's CPU. Here sessions only mark themselves dirty; one round takes every
dirty session's batch, writes them all with one ``Store.submit_appends`` (one
round trip for Redis), and hands each session its result. Rounds in flight
are the group commit: what is emitted meanwhile goes out in a later round.

**Four rounds in flight** (``ROUNDS_IN_FLIGHT``). With one, a session that
marked just after a round was sent waited for that round's answer and then
its own: two round trips in the tail of the latency, and on a busy machine a
round trip is the time Redis takes to be scheduled. A second round takes the
sessions that marked meanwhile. With Redis a network hop away (1 ms), two
were not enough at 50 sessions (a mark a millisecond): an event waited for a
free round, then its own; four took 0.5–0.6 ms off the p50 (docs/performance.md,
"The first word, measured again"). Since a one-event append is one bare XADD whatever the round's
size, smaller rounds cost Redis no more commands. A session whose append is in flight is held
back (``_deferred``) until its answer, so a session never has two appends in
flight: its order holds, and a failed append ("maybe stored") is settled
before anything of that session is written again. On one connection Redis
answers rounds in order; with the awaited group commit (Cluster, replicated)
the second round queues behind the first there.

**Callbacks, not a task.** A round is started by ``call_soon`` (after every
session ready in this tick has marked) and finished by the store's callback:
no task wake-up for the round and none for the store's answer, which at low
load (a round per event) were a measured share of an event's CPU. The rare
rounds that must await (a previous append failed in flight and the log is read
first; a lease to take back) run in a task of their own.

**Linger.** At low load a round carries one event: each token costs its own
Redis write and read, and on a VM each of those wakes another process
(measured: at 10 sessions, a round trip per event made the node plus its Redis
cost 1.65 times LiteLLM's passthrough per event, docs/performance.md). With
``linger`` > 0 a round waits for company: until ``LINGER_COMPANY`` sessions are
waiting, or its *patience* is over (or three quarters of it, at a mark:
``LINGER_LATE``, no timer wake-up). A round's patience is its first session's:
half (``LINGER_SHARE``) the time since that session's previous mark, and at
most ``linger`` (20 ms by default). A token stream at 20 deltas/s may so wait
up to 20 ms, one at 100 deltas/s 5 ms, a burst hardly at all: a token is never
held back more than half its spacing, so the stream keeps its order and, to a
reader, its pace. It waits only while company is likely: the mean gap between
any two marks is below its patience, and the previous round carried fewer
than ``LINGER_FULL`` sessions. A round started by company starts inside that
``mark`` call: a ``call_soon`` (and the loop pass it costs) per round was
measured as 0.36 extra ``epoll_wait`` calls per event at 50 sessions (``perf
stat``). "Log, then send" is unchanged: events still reach clients only after
their append is stored.

**Only streamed chunks wait.** A turn's first content event (``hurry``, from
the driver's first delta of a response), every event that is neither a
response's streamed chunk nor the user's own message (a response's end,
speech that interrupts the model, a call to run: ``SessionLog``), and a
session someone awaits (``SessionLog.flushed``: a tool about to run, a drain)
end a lingering round at once, or go in a round of their own past
``ROUNDS_IN_FLIGHT``: the linger trades latency for fewer round trips, which
is the wrong trade for what a user or a client waits on (measured: it was
most of the first content's added latency at 50 sessions and more,
docs/performance.md). The round still goes in the next loop pass, so the
rest of that delta's events share it.

**The one waited on goes first.** The sessions that hurried a round are put
at its front: the store's answer for a round comes as one reply, and its
sessions are then handed their events in the round's order, each a client
write. Behind a round's other sessions the first content waited their
deliveries (reply → client p50 175 µs at 50 sessions with Redis 1 ms away,
``tests/bench/first_word_trace.py``).

**Riders.** ``on_round`` is called as each round starts: the flight
recorder's writes (``gateway.sessions.recorder``) ride the rounds instead of
waking the loop on timers of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine
from functools import partial
from time import perf_counter
from typing import Any, Final, Protocol

from gateway.store.base import LeaseLost, LogEntry, Sessions, StoreError

__all__ = ["Batch", "LogSource", "LogWriter"]

# One append: log entries and the history items written with them.
Batch = tuple[list[LogEntry], list[bytes]]


class LogSource(Protocol):
    """A session whose events the writer logs (``gateway.sessions.runtime``).

    The writer takes a batch, writes it, and reports back; the session decides
    what an outcome means (deliver, hold and retry, or give up the session).
    """

    @property
    def sid(self) -> str: ...

    @property
    def unsure(self) -> Batch | None:
        """A batch whose append failed in flight and may have landed."""

    def take_batch(self) -> Batch | None:
        """What to append now (None: nothing)."""

    def settle_unsure(self, stored_last: int, batch: Batch) -> Batch | None:
        """After a failed append: ``stored_last`` (``confirmed_seq``) tells whether it
        is stored after all."""

    def appended(self, batch: Batch, result: BaseException | None) -> None:
        """The outcome of appending ``batch``: stored (None) or why not."""

    def write_failed(self) -> None:
        """The writer broke on this session's batch (a bug)."""


log = logging.getLogger("gateway.sessions.logwriter")

# Linger only while the mean gap between marks (an exponentially weighted
# average, weight LINGER_WEIGHT per new gap) is below the linger: company is
# then likely to come within it.
LINGER_WEIGHT: Final = 0.125
# Linger only after rounds of fewer sessions than this (under load the round
# trips in flight batch).
LINGER_FULL: Final = 32
# A lingering round goes once this many sessions wait in it: the round trip each
# saves is a share of 1/n, so past a few the wait buys little.
LINGER_COMPANY: Final = 8
# A round waits at most this share of the time since its first session's
# previous mark: a token is held back by at most that share of its spacing.
LINGER_SHARE: Final = 0.5
# A round this far into its patience goes with the next mark rather than
# wake the loop by its timer: little more company would come before it.
LINGER_LATE: Final = 0.75
# Rounds in flight at once. A further round takes the sessions that marked
# while the others are out, so their events do not wait for an answer too (one
# round trip less in the tail of the latency); a session never has two
# appends in flight (see ``mark``).
ROUNDS_IN_FLIGHT: Final = 4


class LogWriter:
    def __init__(
        self,
        store: Sessions,
        node_id: str,
        *,
        linger: float = 0.0,
        lease_ttl: float | None = None,
        on_round: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.on_round = on_round  # called as each round starts (see "Riders")
        self.node_id = node_id
        # The lease to take back when an append finds nobody holding it (None: never).
        self.lease_ttl = lease_ttl
        # Waiting after the first event of a round for more to join it: under
        # load, fewer and bigger round trips for a bounded extra latency.
        self._linger = _Linger(linger) if linger > 0 else None
        self.rounds = 0
        """Rounds written (events logged / rounds = sessions per round trip)."""
        self.lingered = 0
        """Rounds that waited for more sessions to join."""
        self.hurried = 0
        """Rounds ``hurry`` started early: a lingering one, or one held back by the
        rounds in flight."""
        self._dirty: list[LogSource] = []
        # A round is scheduled or lingering: marks only join ``_dirty``.
        self._scheduled = False
        self._in_flight = 0  # rounds sent and not answered yet
        # Sessions with an append in flight, and those of them that marked
        # meanwhile (their next batch waits for that answer).
        self._writing: set[LogSource] = set()
        self._deferred: list[LogSource] = []
        self._urgent: list[LogSource] = []  # hurried: first in the next round
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # rounds that need awaits

    def mark(self, source: LogSource) -> None:
        """``source`` has something to write (called once until it is taken)."""
        linger = self._linger
        if linger is not None:
            # The pace of marks, kept here rather than in a method of the
            # linger's: this runs once per event.
            now = perf_counter()
            gap = min(now - linger.last_mark, linger.longest_gap)
            linger.last_mark = now
            linger.gap = (
                gap if linger.gap == math.inf else linger.gap + (gap - linger.gap) * LINGER_WEIGHT
            )
            marks = linger.marks
            patience = (now - marks.get(source, -math.inf)) * LINGER_SHARE
            marks[source] = now
            if now >= linger.prune_at:
                linger.prune(now)
        if source in self._writing:
            # Its previous append is in flight: this batch goes after its answer
            # (one append in flight per session keeps its order and the
            # "maybe stored" rule).
            self._deferred.append(source)
            return
        dirty = self._dirty
        if linger is not None:
            if not dirty:
                linger.first_mark = now
                linger.patience = patience if patience < linger.seconds else linger.seconds
            dirty.append(source)
            if not self._scheduled:
                if self._in_flight < ROUNDS_IN_FLIGHT:
                    self._scheduled = True
                    self._schedule()
            elif linger.timer is not None and (
                len(dirty) >= LINGER_COMPANY
                or now - linger.first_mark >= linger.patience * LINGER_LATE
            ):
                # Company came, or the patience is nearly over: go now, in this
                # call, the loop awake for this mark anyway (a call_soon, or the
                # timer, would cost the loop another pass per round). The events
                # this source emits later in this step go with the next round.
                linger.timer.cancel()
                self._start_round()
            return
        dirty.append(source)
        if not self._scheduled and self._in_flight < ROUNDS_IN_FLIGHT:
            self._scheduled = True
            self._schedule()

    def hurry(self, source: LogSource | None = None) -> None:
        """What was just marked is waited on (a turn's first content, an event a client
        acts on, a session someone awaits: ``SessionLog``): a lingering round goes
        now, and so does one held back by the rounds in flight; ``source``, the
        session that waits, goes first in it (see "The one waited on goes first").

        Started by ``call_soon``, not here: the events the caller emits in
        the same step still join it. A round held back by ``ROUNDS_IN_FLIGHT``
        (under load, both rounds out) goes as a third one rather than wait for
        an answer and then, maybe, a linger: the bound is there to batch tokens,
        and a session never has two appends in flight whatever the number of
        rounds (``mark``).
        """
        if source is not None:
            self._urgent.append(source)
        loop = self._loop
        if loop is None:
            return  # no round was ever scheduled: the first mark starts one at once
        linger = self._linger
        if linger is not None and linger.timer is not None:
            linger.timer.cancel()
            linger.timer = None  # marks now only join ``_dirty``: the round is scheduled
            self.hurried += 1
            loop.call_soon(self._start_round)
        elif self._dirty and not self._scheduled and not self._closed:
            self._scheduled = True  # held back by the rounds in flight
            self.hurried += 1
            loop.call_soon(self._start_round)

    async def close(self) -> None:
        self._closed = True
        linger = self._linger
        if linger is not None and linger.timer is not None:
            linger.timer.cancel()
            linger.timer = None
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def _schedule(self) -> None:
        """Start the next round: after this tick, or once the linger is over."""
        loop = self._loop
        if loop is None:
            # Cached: asyncio.get_running_loop() costs a getpid() syscall per
            # call on Python 3.11, and a round used to call it three times.
            loop = self._loop = asyncio.get_running_loop()
        if self._closed:
            return
        linger = self._linger
        if linger is not None and (delay := linger.delay(perf_counter(), len(self._dirty))) > 0:
            self.lingered += 1
            linger.timer = loop.call_later(delay, self._start_round)
        else:
            # Not run now: every session that is ready in this tick marks first.
            loop.call_soon(self._start_round)

    def _start_round(self) -> None:
        linger = self._linger
        if linger is not None:
            linger.timer = None
        self._scheduled = False
        if self._closed:
            return
        dirty, self._dirty = self._dirty, []
        if self._urgent:
            dirty = self._urgent_first(dirty)
        if linger is not None:
            linger.last_size = len(dirty)
        self.rounds += 1
        if self.on_round is not None:
            self.on_round()
        self._in_flight += 1
        self._writing.update(dirty)
        writing = _Round(dirty)
        try:
            jobs: list[tuple[LogSource, Batch]] = []
            unsure = False
            for source in dirty:
                taken = source.take_batch()
                if taken is not None:
                    jobs.append((source, taken))
                    unsure = unsure or source.unsure is not None
            if not jobs:
                self._round_done(writing)
            elif unsure:
                # A previous append failed in flight: read the log first (awaits).
                self._await_round(self._settle_then_append(jobs), writing)
            else:
                self.store.submit_appends(
                    [(source.sid, self.node_id, job[0], job[1]) for source, job in jobs],
                    partial(self._appended, jobs, writing),
                )
        except Exception:  # a bug here must not stop every session's log
            self._broke(writing)

    def _urgent_first(self, dirty: list[LogSource]) -> list[LogSource]:
        """``dirty`` with the hurried sessions in it first; the others stay urgent
        (deferred behind an append in flight, they go first in a later round)."""
        urgent, self._urgent = self._urgent, []
        front = [source for source in urgent if source in dirty]
        if not front:
            self._urgent = [source for source in urgent if source in self._deferred]
            return dirty
        first = set(front)
        self._urgent = [s for s in urgent if s not in first and s in self._deferred]
        return list(dict.fromkeys(front)) + [source for source in dirty if source not in first]

    def _appended(
        self,
        jobs: list[tuple[LogSource, Batch]],
        writing: _Round,
        results: list[BaseException | None],
    ) -> None:
        """The store's answer for a round: report each session's outcome."""
        try:
            retake = []
            for (source, job), result in zip(jobs, results, strict=True):
                if _lease_expired(result, job) and self.lease_ttl is not None:
                    retake.append((source, job))
                else:
                    source.appended(job, result)
            if retake:
                self._await_round(self._retake_all(retake), writing)
                return
        except Exception:
            self._broke(writing)
            return
        self._round_done(writing)

    def _round_done(self, writing: _Round) -> None:
        """A round is answered: its sessions may write again, the next round may go."""
        if writing.done:
            return
        writing.done = True
        self._in_flight -= 1
        self._writing.difference_update(writing.sources)
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            dirty = self._dirty
            linger = self._linger
            for source in deferred:
                if source in self._writing:  # in another round still in flight
                    self._deferred.append(source)
                else:
                    if not dirty and linger is not None:
                        # It marked within a round trip of its previous append:
                        # half of that gap is next to nothing, so it goes now.
                        linger.first_mark = perf_counter()
                        linger.patience = 0.0
                    dirty.append(source)
        if (
            self._dirty
            and not self._scheduled
            and self._in_flight < ROUNDS_IN_FLIGHT
            and not self._closed
        ):
            self._scheduled = True
            self._schedule()

    def _broke(self, writing: _Round) -> None:
        log.exception("log writer round failed")
        for source in writing.sources:
            source.write_failed()
        self._round_done(writing)

    def _await_round(self, work: Coroutine[Any, Any, None], writing: _Round) -> None:
        """Finish this round in a task (rare paths that read or retake before writing)."""

        async def run() -> None:
            try:
                await work
            except Exception:
                self._broke(writing)
            else:
                self._round_done(writing)

        task = asyncio.get_running_loop().create_task(run(), name="log-writer-round")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle_then_append(self, taken: list[tuple[LogSource, Batch]]) -> None:
        store = self.store
        jobs = []
        for source, batch in taken:
            job: Batch | None = batch
            if source.unsure is not None:
                # The previous append failed in flight and may have landed:
                # the log says which, before anything is written again. What
                # counts is what is stored as durably as promised (a replica
                # confirms it under durability replicated), not what the
                # primary happens to have: that is what may be sent.
                try:
                    stored_last = await store.confirmed_seq(source.sid)
                except StoreError as exc:
                    source.appended(batch, exc)
                    continue
                job = source.settle_unsure(stored_last, batch)
            if job is not None:
                jobs.append((source, job))
        if not jobs:
            return
        results = await store.append_many(
            [(source.sid, self.node_id, job[0], job[1]) for source, job in jobs]
        )
        retake = []
        for (source, job), result in zip(jobs, results, strict=True):
            if _lease_expired(result, job) and self.lease_ttl is not None:
                retake.append((source, job))
            else:
                source.appended(job, result)
        await self._retake_all(retake)

    async def _retake_all(self, jobs: list[tuple[LogSource, Batch]]) -> None:
        if not jobs:
            return  # a writer that never takes leases back (lease_ttl None) has none
        assert self.lease_ttl is not None
        for source, job in jobs:
            result = await self._retake_and_append(source.sid, job, self.lease_ttl)
            source.appended(job, result)

    async def _retake_and_append(
        self, sid: str, job: Batch, lease_ttl: float
    ) -> BaseException | None:
        """The lease expired with nobody taking it (a store outage longer than the lease).

        After such an outage the held batch is retried (every 0.5 s) before the
        node's lease keeper runs again (every lease_ttl/3), so the append finds
        no lease. That is no takeover: take the lease back and append. The
        append's seq check still fences a node that drove the session in
        between and let it go again (``SeqConflict``: then it is lost after all).
        """
        try:
            if not await self.store.acquire_lease(sid, self.node_id, lease_ttl):
                return LeaseLost(f"session {sid}: another node took the lease; stop driving it")
            log.info("session %s: took back a lease that expired unclaimed", sid)
            await self.store.append(sid, self.node_id, job[0], job[1])
        except StoreError as exc:
            return exc
        return None


class _Linger:
    """When a round waits for company, and the round waiting (see "Linger" above).

    Its own object because it is one decision with its own state: the pace of
    marks, the size of the previous round and the timer of a lingering round.
    """

    __slots__ = (
        "first_mark",
        "gap",
        "last_mark",
        "last_size",
        "longest_gap",
        "marks",
        "patience",
        "prune_at",
        "seconds",
        "timer",
    )

    def __init__(self, seconds: float) -> None:
        # At most, seconds a round waits after its first event for more to join it.
        self.seconds = seconds
        # A quiet spell counts as a gap of at most this in the mean.
        self.longest_gap = 10 * seconds
        self.first_mark = 0.0  # perf_counter() of the first mark of the next round
        self.patience = 0.0  # how long the next round may wait (its first session's)
        self.last_mark = -math.inf  # perf_counter() of the previous mark
        self.gap = math.inf  # mean seconds between marks (see LINGER_WEIGHT)
        self.last_size = 0  # sessions in the previous round
        self.timer: asyncio.TimerHandle | None = None  # a round is lingering: its end
        # Each session's previous mark (its pace). A mark older than ``seconds /
        # LINGER_SHARE`` gives the whole linger, as none does: such are dropped
        # now and then (``prune``), so sessions that ended are not kept.
        self.marks: dict[object, float] = {}
        self.prune_at = 0.0

    def prune(self, now: float) -> None:
        """Forget the marks too old to shorten a round's patience."""
        oldest = now - self.seconds / LINGER_SHARE
        self.marks = {source: at for source, at in self.marks.items() if at > oldest}
        self.prune_at = now + 10 * self.seconds / LINGER_SHARE

    def delay(self, now: float, waiting: int) -> float:
        """How long a round of ``waiting`` sessions waits for more (0: it goes now)."""
        patience = self.patience
        likely = self.gap < patience  # company is likely to come within it
        if likely and self.last_size < LINGER_FULL and waiting < LINGER_COMPANY:
            return self.first_mark + patience - now
        return 0.0


class _Round:
    """The sessions of one round, until its answer (``_round_done`` runs once per round)."""

    __slots__ = ("done", "sources")

    def __init__(self, sources: list[LogSource]) -> None:
        self.sources = sources
        self.done = False


def _lease_expired(result: BaseException | None, job: Batch) -> bool:
    """An append refused because nobody holds the lease, with entries whose seqs fence it.

    A batch of history items alone has no seq to fence a writer in between, so
    it is not retried on a retaken lease.
    """
    return isinstance(result, LeaseLost) and result.holder is None and bool(job[0])
