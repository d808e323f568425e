"""Liveness and readiness, answered separately.

``/healthz`` is liveness: the process answers, so an orchestrator has no reason
to restart it (not even while it drains, or while Redis is down: a restart
would not bring Redis back). ``/readyz`` is readiness: whether a new client
would be served now. Before this split ``/healthz`` said 200 while Redis was
down and every new client got 1013; load balancers kept sending them.

The store check is one cheap ping with a short timeout, shared by concurrent
probes and cached for ``CACHE_SECONDS``: a balancer probing every node every
second costs each store one ping a second, not one per probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Final

from gateway.store.base import Store

__all__ = ["CACHE_SECONDS", "PING_TIMEOUT", "StoreProbe"]

CACHE_SECONDS: Final = 1.0
PING_TIMEOUT: Final = 0.5
"""A store that takes longer than this to answer a PING cannot serve sessions well."""


class StoreProbe:
    """Whether the store answers, asked at most once per ``CACHE_SECONDS``."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._clock = clock
        self._checked_at = -CACHE_SECONDS
        self._ok = False
        self._inflight: asyncio.Future[bool] | None = None

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
