"""Liveness and readiness, answered separately.

``/healthz`` is liveness: the process answers, so an orchestrator has no reason
to restart it (not even while it drains, or while Redis is down: a restart
would not bring Redis back). ``/readyz`` is readiness: whether a new client
would be served now. Before this split ``/healthz`` said 200 while Redis was
down and every new client got 1013; load balancers kept sending them.

The store check is one cheap ping with a short timeout, shared by concurrent
probes and cached for ``CACHE_SECONDS``: a balancer probing every node every
second costs each store one ping a second, not one per probe. A store that
answers but cannot keep its durability promise (``--durability replicated``
with no replica confirming: sessions hold their events) is not ready either,
and the probe says so in those words (``Health.degraded``).

Readiness also turns 503 while the process has used ``READY_SHARE`` of the
file descriptors it may open: a node out of descriptors cannot accept a
connection (not even its own health checks) nor open one to Redis or to a
provider, so balancers are told before that happens, not after. At start,
``raise_descriptor_limit`` lifts the soft limit to the hard one (a default
soft limit of 1,024 ran out at ~1,030 stalled connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import time
from collections.abc import Callable
from typing import Final

from gateway.store.base import Health

__all__ = [
    "CACHE_SECONDS",
    "PING_TIMEOUT",
    "READY_SHARE",
    "Descriptors",
    "StoreProbe",
    "descriptor_limit",
    "open_descriptors",
    "raise_descriptor_limit",
]

CACHE_SECONDS: Final = 1.0
PING_TIMEOUT: Final = 0.5
"""A store that takes longer than this to answer a PING cannot serve sessions well."""
READY_SHARE: Final = 0.9
"""Not ready from this share of the descriptor limit on: the rest is the node's
reserve for Redis, providers, tools and the clients already being admitted."""


def descriptor_limit() -> int | None:
    """The most file descriptors this process may open (the soft limit); None: unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def open_descriptors() -> int | None:
    """How many file descriptors this process holds now; None where it cannot be told."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(where)) - 1  # listdir's own descriptor is listed too
        except OSError:
            continue
    return None


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; ``(soft before, soft now)``.

    Every connection is a descriptor, and distributions still start services
    with a soft limit of 1,024. Where the hard limit is unlimited the soft one
    is raised to 1,048,576 (macOS refuses more than its own maximum: then it
    stays as it was).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft), int(now)


class Descriptors:
    """Whether this process is running short of file descriptors (counted once a second).

    Counting means listing ``/proc/self/fd``: cheap, but not per probe when
    thousands of connections are open.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        count: Callable[[], int | None] = open_descriptors,
        limit: Callable[[], int | None] = descriptor_limit,
    ) -> None:
        self._clock = clock
        self._count = count
        self._limit = limit
        self._checked_at = -CACHE_SECONDS
        self._shortage: str | None = None

    def shortage(self) -> str | None:
        """None while fine; else what to tell a readiness probe."""
        now = self._clock()
        if now - self._checked_at >= CACHE_SECONDS:
            self._checked_at = now
            used, limit = self._count(), self._limit()
            self._shortage = None
            if used is not None and limit is not None and used >= READY_SHARE * limit:
                self._shortage = (
                    f"{used} of its {limit} file descriptors in use (raise the process's "
                    "nofile limit, or add nodes)"
                )
        return self._shortage


class StoreProbe:
    """Whether the store answers, asked at most once per ``CACHE_SECONDS``."""

    def __init__(self, store: Health, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._clock = clock
        self._checked_at = -CACHE_SECONDS
        self._ok = False
        self._inflight: asyncio.Future[bool] | None = None

    async def problem(self) -> str | None:
        """Why the store cannot serve new clients now (for ``/readyz``), or None."""
        if not await self.reachable():
            return "the session store is unreachable"
        return self.store.degraded()

    async def reachable(self) -> bool:
        if self._clock() - self._checked_at < CACHE_SECONDS:
            return self._ok
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._ping())
        inflight = self._inflight
        # shield: one probe's client hanging up must not cancel the others' ping.
        return await asyncio.shield(inflight)

    async def _ping(self) -> bool:
        ok = False
        try:
            with contextlib.suppress(Exception):
                ok = await asyncio.wait_for(self.store.ping(), PING_TIMEOUT)
        finally:
            self._ok = ok
            self._checked_at = self._clock()
            self._inflight = None
        return ok
