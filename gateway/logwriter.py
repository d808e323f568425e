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
from typing import TYPE_CHECKING

from .store.base import StoreError

if TYPE_CHECKING:
    from .session import Batch, SessionRuntime
    from .store.base import Store

__all__ = ["LogWriter"]

log = logging.getLogger("gateway.logwriter")


class LogWriter:
    def __init__(self, store: Store, node_id: str, *, linger: float = 0.0) -> None:
        self.store = store
        self.node_id = node_id
        # Seconds to wait after the first event of a round for more to join it:
        # under load, fewer and bigger round trips for a bounded extra latency.
        self.linger = linger
        self._dirty: list[SessionRuntime] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def mark(self, runtime: SessionRuntime) -> None:
        """``runtime`` has something to write (called once until it is taken)."""
        self._dirty.append(runtime)
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
                for runtime in dirty:
                    runtime.write_failed()

    async def _round(self, dirty: list[SessionRuntime]) -> None:
        store = self.store
        jobs = []
        for runtime in dirty:
            taken = runtime.take_batch()
            if taken is None:
                continue
            job: Batch | None = taken
            if runtime.unsure is not None:
                # The previous append failed in flight and may have landed:
                # the log says which, before anything is written again.
                try:
                    stored_last = await store.last_seq(runtime.sid)
                except StoreError as exc:
                    runtime.appended(taken, exc)
                    continue
                job = runtime.settle_unsure(stored_last, taken)
            if job is not None:
                jobs.append((runtime, job))
        if not jobs:
            return
        results = await store.append_many(
            [(runtime.sid, self.node_id, job[0], job[1]) for runtime, job in jobs]
        )
        for (runtime, job), result in zip(jobs, results, strict=True):
            runtime.appended(job, result)
