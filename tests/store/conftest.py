"""Fixtures for the store suite: one harness per backend, same tests for both.

A ``Harness`` makes stores, gives a "peer" (another node on the same data) and
knows how time passes for its backend: ``MemoryStore`` runs on a fake clock
that tests advance; Redis expires keys in real time, which has no event to
await, so the Redis harness polls briefly with a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.store import MemoryStore, RedisStore, Store

POLL = 0.01
DEADLINE = 5.0


class FakeClock:
    """A monotonic clock that only moves when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def poll_until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until true; for conditions that have no event to await."""
    async with asyncio.timeout(DEADLINE):
        while not await check():  # noqa: ASYNC110 - no event exists to await
            await asyncio.sleep(POLL)


class Harness:
    kind = ""

    def __init__(self) -> None:
        self.stores: list[Store] = []

    def make(self, **options: Any) -> Store:
        raise NotImplementedError

    def peer(self, store: Store) -> Store:
        """Another node on the same data (the same object for one process)."""
        raise NotImplementedError

    async def lease_expired(self, store: Store, sid: str, ttl: float) -> None:
        """Return once a lease taken with ``ttl`` has expired."""
        raise NotImplementedError

    async def idle_expired(self, store: Store, sid: str) -> None:
        """Return once ``sid`` has been idle for longer than ``store``'s TTL."""
        raise NotImplementedError

    async def follower_blocked(self, store: Store) -> None:
        """Return once a ``wait_log`` call is waiting (so the append must wake it)."""
        raise NotImplementedError

    async def after(self, seconds: float, check: Callable[[], Awaitable[bool]], what: str) -> None:
        """Return once ``seconds`` have passed and ``check`` holds (what they made true)."""
        raise NotImplementedError

    async def close(self) -> None:
        for store in self.stores:
            await store.close()


class MemoryHarness(Harness):
    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()

    def make(self, **options: Any) -> Store:
        store = MemoryStore(clock=self.clock, **options)
        self.stores.append(store)
        return store

    def peer(self, store: Store) -> Store:
        return store

    async def lease_expired(self, store: Store, sid: str, ttl: float) -> None:
        self.clock.advance(ttl + 0.001)

    async def idle_expired(self, store: Store, sid: str) -> None:
        assert isinstance(store, MemoryStore)
        self.clock.advance(store.ttl + 0.001)

    async def follower_blocked(self, store: Store) -> None:
        assert isinstance(store, MemoryStore)

        async def waiting() -> bool:
            return bool(store._waiters)

        await poll_until(waiting, "a follower waits")

    async def after(self, seconds: float, check: Callable[[], Awaitable[bool]], what: str) -> None:
        self.clock.advance(seconds + 0.001)
        assert await check(), what


class RedisHarness(Harness):
    kind = "redis"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.options: dict[int, dict[str, Any]] = {}
        self.raw = aioredis.Redis.from_url(url)

    def make(self, **options: Any) -> Store:
        store = RedisStore.from_url(self.url, **options)
        self.options[id(store)] = options
        self.stores.append(store)
        return store

    def peer(self, store: Store) -> Store:
        return self.make(**self.options[id(store)])

    async def lease_expired(self, store: Store, sid: str, ttl: float) -> None:
        async def gone() -> bool:
            return await store.lease_owner(sid) is None

        await poll_until(gone, f"the lease of {sid} expires")

    async def idle_expired(self, store: Store, sid: str) -> None:
        async def gone() -> bool:
            return await store.get_meta(sid) is None

        await poll_until(gone, f"session {sid} expires")

    async def follower_blocked(self, store: Store) -> None:
        async def blocked() -> bool:
            info = await self.raw.info("clients")
            return int(info["blocked_clients"]) > 0

        await poll_until(blocked, "a follower blocks in XREAD")

    async def after(self, seconds: float, check: Callable[[], Awaitable[bool]], what: str) -> None:
        await poll_until(check, what)  # Redis' clock: real time, no event to await

    async def close(self) -> None:
        await super().close()
        await self.raw.aclose()


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    h: Harness
    if request.param == "memory":
        h = MemoryHarness()
    else:
        h = RedisHarness(request.getfixturevalue("redis_url"))
    yield h
    await h.close()


@pytest.fixture
def store(harness: Harness) -> Store:
    """A store with default settings, for tests that need nothing special."""
    return harness.make()
