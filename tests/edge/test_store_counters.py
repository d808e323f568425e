"""The store's counter and slot API (what per-key limits stand on), on both backends."""

from __future__ import annotations

import asyncio

from gateway.store import MemoryStore, Store
from tests.store.conftest import Harness, MemoryHarness, harness, poll_until, store

__all__ = ["harness", "store"]

SHORT = 0.2


async def test_incr_window_adds_and_reads(store: Store) -> None:
    assert await store.incr_window("turns:alice:1", 1, 60) == 1
    assert await store.incr_window("turns:alice:1", 1, 60) == 2
    assert await store.incr_window("turns:alice:1", 5, 60) == 7
    assert await store.incr_window("turns:alice:1", 0, 60) == 7  # 0 reads
    assert await store.incr_window("turns:bob:1", 0, 60) == 0
    assert await store.incr_window("turns:alice:2", 1, 60) == 1  # another window


async def test_incr_window_is_atomic_under_concurrency(store: Store) -> None:
    results = await asyncio.gather(*(store.incr_window("k", 1, 60) for _ in range(50)))
    assert sorted(results) == list(range(1, 51))


async def test_a_window_expires_ttl_after_it_was_created(harness: Harness) -> None:
    store = harness.make()
    await store.incr_window("w", 3, SHORT)
    if isinstance(harness, MemoryHarness):
        harness.clock.advance(SHORT / 2)
        assert await store.incr_window("w", 1, SHORT) == 4  # adding does not extend it
        harness.clock.advance(SHORT / 2 + 0.001)
    else:

        async def expired() -> bool:
            return await store.incr_window("w", 0, SHORT) == 0

        await poll_until(expired, "the window expires")
    assert await store.incr_window("w", 1, SHORT) == 1


async def test_slots_count_up_to_the_limit_and_free_on_release(store: Store) -> None:
    assert await store.acquire_slot("alice", "n1:1", 2, 30)
    assert await store.acquire_slot("alice", "n2:1", 2, 30)
    assert not await store.acquire_slot("alice", "n1:2", 2, 30)
    assert await store.acquire_slot("alice", "n1:1", 2, 30)  # already held: refreshed
    assert await store.acquire_slot("bob", "n1:3", 2, 30)  # keys are separate
    await store.release_slot("alice", "n2:1")
    await store.release_slot("alice", "n2:1")  # twice is fine
    assert await store.acquire_slot("alice", "n1:2", 2, 30)
    assert await store.acquire_slot("carol", "n1:9", 0, 30)  # 0 = no limit


async def test_a_dead_nodes_slots_expire_and_renewed_ones_stay(harness: Harness) -> None:
    store = harness.make()
    peer = harness.peer(store)
    assert await store.acquire_slot("alice", "dead:1", 2, SHORT)  # never renewed
    assert await peer.acquire_slot("alice", "live:1", 2, SHORT)
    assert not await peer.acquire_slot("alice", "live:2", 2, SHORT)
    if isinstance(harness, MemoryHarness):
        harness.clock.advance(SHORT * 0.6)
        await peer.renew_slots("alice", ["live:1"], SHORT)
        harness.clock.advance(SHORT * 0.6)
    else:
        await peer.renew_slots("alice", ["live:1"], 30)

        async def dead_gone() -> bool:
            if await peer.acquire_slot("alice", "live:2", 2, 30):
                await peer.release_slot("alice", "live:2")
                return True
            return False

        await poll_until(dead_gone, "the dead node's slot expires")
    # The dead node's slot is gone; the renewed one still counts.
    assert await peer.acquire_slot("alice", "live:2", 2, 30)
    assert not await peer.acquire_slot("alice", "live:3", 2, 30)


async def test_renewing_a_released_slot_does_not_bring_it_back(store: Store) -> None:
    assert await store.acquire_slot("alice", "n1:1", 1, 30)
    await store.release_slot("alice", "n1:1")
    await store.renew_slots("alice", ["n1:1"], 30)
    assert await store.acquire_slot("alice", "n1:2", 1, 30)


async def test_memory_counters_are_swept() -> None:
    clock = [1000.0]
    store = MemoryStore(clock=lambda: clock[0])
    for minute in range(100):
        await store.incr_window(f"turns:alice:{minute}", 1, 120)
    await store.acquire_slot("alice", "n:1", 1, 30)
    clock[0] += 3600
    await store.incr_window("turns:alice:new", 1, 120)
    assert len(store._counters) == 1 and not store._slots
