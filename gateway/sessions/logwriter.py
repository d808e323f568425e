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

from gateway.store.base import LogEntry, Store, StoreError

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
    def __init__(self, store: Store, node_id: str, *, linger: float = 0.0) -> None:
        self.store = store
        self.node_id = node_id
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
            source.appended(job, result)
