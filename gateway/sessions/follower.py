"""Following a session that another node drives.

A client may reconnect to any node. When the session's lease is held by a
live node, this node tails the session's log from the store and forwards the
entries to its local clients. When the lease turns out to be free (the driver
finished and let go, or died and the lease expired), this node takes the
session over and its clients move to the new local runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from gateway.sessions.subscriber import DrivenSession, Subscriber
from gateway.store.base import LogEntry, Sessions, StoreUnavailable

__all__ = ["LogFollower"]

log = logging.getLogger("gateway.sessions.follower")

_PAST_EXPIRY: Final = 0.02
"""Seconds after a lease's expiry a follower looks again (a clock's tick of slack)."""


class LogFollower:
    """Tails one session's log for the local clients of a session driven elsewhere."""

    def __init__(
        self,
        store: Sessions,
        sid: str,
        after: int,
        *,
        node_id: str,
        drive: Callable[[str], Awaitable[DrivenSession | None]],
        on_stop: Callable[[LogFollower], None],
        poll: float,
        retry_delay: float,
    ) -> None:
        """``drive(sid)`` takes the session over when its lease is free (None: it
        is not); ``on_stop`` is told when this follower ends, for the node's index."""
        self.store = store
        self.sid = sid
        self.node_id = node_id
        self._drive = drive
        self._on_stop = on_stop
        self._poll = poll
        self._retry_delay = retry_delay
        self.last_seq = after
        self.subscribers: set[Subscriber] = set()
        self._task: asyncio.Task[None] | None = None
        self.done = False

    def attach(self, sub: Subscriber) -> None:
        self.subscribers.add(sub)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"follow:{self.sid}")

    def detach(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers:
            self.stop()

    def stop(self) -> None:
        self.done = True
        self._on_stop(self)
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    def _deliver(self, entries: Sequence[LogEntry]) -> None:
        self.last_seq = entries[-1].seq
        for sub in tuple(self.subscribers):
            sub.deliver(entries)

    async def _run(self) -> None:
        store = self.store
        poll = wait = self._poll
        while not self.done and self.subscribers:
            try:
                entries = await store.wait_log(self.sid, self.last_seq, wait)
                wait = poll
                if entries:
                    self._deliver(entries)
                    continue
                # Ours already: a command from a client here took the session
                # over (its driver died); move the other clients to it too.
                if await store.lease_owner(self.sid) not in (None, self.node_id):
                    # A live driver renews well before the lease runs out; a dead
                    # one does not: look again just after it would expire, not
                    # up to a whole poll later (a takeover waits that much less).
                    left = await store.lease_expires_in(self.sid)
                    wait = min(poll, left + _PAST_EXPIRY)
                    continue
                runtime = await self._drive(self.sid)
            except StoreUnavailable as exc:
                log.warning("following %s: store unavailable: %s", self.sid, exc)
                await asyncio.sleep(self._retry_delay)
                continue
            if runtime is not None:
                self._hand_over(runtime)
                return

    def _hand_over(self, runtime: DrivenSession) -> None:
        """This node drives the session now: move the clients to the runtime."""
        self.stop()
        for sub in tuple(self.subscribers):
            with contextlib.suppress(Exception):
                sub.switch_source(runtime)
        self.subscribers.clear()
