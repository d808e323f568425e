"""One writer for the event logs of every session a node drives.

"Log, then send" puts a store write in front of every batch of events. With a
writer task per session, each token cost two task wake-ups (the writer woken
by the event, then by the store's answer) on top of the store call itself;
at a thousand sessions streaming, those wake-ups were a large share of the
node's CPU. Here sessions only mark themselves dirty; one task takes every
dirty session's batch, writes them all with one ``Store.append_many`` (one
round trip for Redis), and hands each session its result. A round in flight
is the group commit: what is emitted meanwhile goes out in the next round,
so a session never has two appends in flight and its order holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from gateway.store.base import LeaseLost, LogEntry, Store, StoreError

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
        """After a failed append: ``stored_last`` tells whether it landed after all."""

    def appended(self, batch: Batch, result: BaseException | None) -> None:
        """The outcome of appending ``batch``: stored (None) or why not."""

    def write_failed(self) -> None:
        """The writer broke on this session's batch (a bug)."""


log = logging.getLogger("gateway.sessions.logwriter")


class LogWriter:
    def __init__(
        self, store: Store, node_id: str, *, linger: float = 0.0, lease_ttl: float | None = None
    ) -> None:
        self.store = store
        self.node_id = node_id
        # The lease to take back when an append finds nobody holding it (None: never).
        self.lease_ttl = lease_ttl
        # Seconds to wait after the first event of a round for more to join it:
        # under load, fewer and bigger round trips for a bounded extra latency.
        self.linger = linger
        self._dirty: list[LogSource] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def mark(self, source: LogSource) -> None:
        """``source`` has something to write (called once until it is taken)."""
        self._dirty.append(source)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="log-writer")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if self.linger > 0:
                await asyncio.sleep(self.linger)
            self._wake.clear()
            dirty, self._dirty = self._dirty, []
            try:
                await self._round(dirty)
            except Exception:  # a bug here must not stop every session's log
                log.exception("log writer round failed")
                for source in dirty:
                    source.write_failed()

    async def _round(self, dirty: list[LogSource]) -> None:
        store = self.store
        jobs = []
        for source in dirty:
            taken = source.take_batch()
            if taken is None:
                continue
            job: Batch | None = taken
            if source.unsure is not None:
                # The previous append failed in flight and may have landed:
                # the log says which, before anything is written again.
                try:
                    stored_last = await store.last_seq(source.sid)
                except StoreError as exc:
                    source.appended(taken, exc)
                    continue
                job = source.settle_unsure(stored_last, taken)
            if job is not None:
                jobs.append((source, job))
        if not jobs:
            return
        results = await store.append_many(
            [(source.sid, self.node_id, job[0], job[1]) for source, job in jobs]
        )
        for (source, job), result in zip(jobs, results, strict=True):
            if _lease_expired(result, job) and self.lease_ttl is not None:
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


def _lease_expired(result: BaseException | None, job: Batch) -> bool:
    """An append refused because nobody holds the lease, with entries whose seqs fence it.

    A batch of history items alone has no seq to fence a writer in between, so
    it is not retried on a retaken lease.
    """
    return isinstance(result, LeaseLost) and result.holder is None and bool(job[0])
