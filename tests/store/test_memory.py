"""``MemoryStore`` specifics: the injectable clock, sweeping, trimming bounds, close."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.store import MemoryStore
from gateway.store.base import LogEntry
from tests.store.conftest import FakeClock, poll_until
from tests.store.test_store import LEASE, entries


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_renew_extends_the_lease(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    assert await store.acquire_lease("s1", "n1", 1.0)
    clock.advance(0.9)
    assert await store.renew_lease("s1", "n1", 1.0)
    clock.advance(0.9)
    assert await store.lease_owner("s1") == "n1"
    clock.advance(0.2)
    assert await store.lease_owner("s1") is None


async def test_appends_and_meta_writes_restart_the_idle_ttl(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock, ttl=10.0)
    await store.create_session("s1", {"owner": "n1"})
    await store.acquire_lease("s1", "n1", 1000.0)
    clock.advance(9.0)
    await store.append("s1", "n1", entries(1, 1))
    clock.advance(9.0)
    await store.set_meta("s1", {"status": "idle"})
    clock.advance(9.0)
    assert await store.get_meta("s1") == {"owner": "n1", "status": "idle"}
    assert await store.last_seq("s1") == 1
    clock.advance(1.0)
    assert await store.get_meta("s1") is None
    assert await store.read_log("s1", 0) == []


async def test_reads_do_not_restart_the_idle_ttl(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock, ttl=10.0)
    await store.create_session("s1", {"owner": "n1"})
    clock.advance(9.0)
    assert await store.get_meta("s1") is not None
    clock.advance(1.0)
    assert await store.get_meta("s1") is None


async def test_sweep_drops_sessions_nobody_touches(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock, ttl=10.0)
    for i in range(100):
        await store.create_session(f"s{i}", {"owner": "n1"})
        await store.acquire_lease(f"s{i}", "n1", 5.0)
    clock.advance(11.0)
    await store.create_session("fresh", {"owner": "n1"})  # any write may sweep
    assert list(store._sessions) == ["fresh"]
    assert store._leases == {}


async def test_trim_keeps_at_least_max_log_and_not_much_more(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock, max_log=100)
    await store.acquire_lease("s1", "n1", LEASE)
    for seq in range(1, 1001):
        await store.append("s1", "n1", entries(seq, 1))
        kept = await store.last_seq("s1") - await store.first_seq("s1") + 1
        assert min(seq, 100) <= kept <= 125


async def test_close_ends_waiting_followers(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    follower = asyncio.create_task(store.wait_log("s1", 0, timeout=30))

    async def waiting() -> bool:
        return bool(store._waiters)

    await poll_until(waiting, "the follower waits")
    await store.close()
    assert await follower == []


async def test_a_cancelled_follower_leaves_no_waiter(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    follower = asyncio.create_task(store.wait_log("s1", 0, timeout=30))

    async def waiting() -> bool:
        return bool(store._waiters)

    await poll_until(waiting, "the follower waits")
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower
    assert store._waiters == {}


def big(seq: int, size: int = 100_000) -> list[LogEntry]:
    return [LogEntry(seq, b"x" * size)]


async def test_a_full_store_drops_idle_sessions_least_recently_written_first(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: 200 messages of 1 MB grew a node by 740 MB, without bound."""
    store = MemoryStore(clock=clock, max_bytes=1_000_000)
    for n in range(8):  # 800 kB of sessions no node drives any more
        await store.acquire_lease(f"old{n}", "n1", LEASE)
        await store.append(f"old{n}", "n1", big(1))
        await store.release_lease(f"old{n}", "n1")
        clock.advance(1.0)
    await store.acquire_lease("live", "n1", LEASE)
    for seq in range(1, 5):
        await store.append("live", "n1", big(seq))
    assert store.size <= 1_000_000
    # The oldest went; the newest idle ones and the live session's whole log stayed.
    assert await store.last_seq("old0") == 0 and await store.last_seq("old7") == 1
    assert await store.first_seq("live") == 1 and await store.last_seq("live") == 4
    assert "idle sessions were dropped" in caplog.text and "REDIS_URL" in caplog.text


async def test_a_full_store_of_live_sessions_drops_the_largest_ones_oldest_events(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore(clock=clock, max_bytes=1_000_000)
    await store.acquire_lease("small", "n1", LEASE)
    await store.append("small", "n1", big(1, 10_000))
    await store.acquire_lease("large", "n1", LEASE)
    with caplog.at_level(logging.WARNING):
        for seq in range(1, 31):
            await store.append("large", "n1", big(seq), history=[b"h" * 50_000])
            assert store.size <= 1_000_000
    assert await store.last_seq("large") == 30 and await store.first_seq("large") > 1
    assert len(await store.read_history("large")) < 30
    assert await store.first_seq("small") == 1  # the small one kept all it had
    assert caplog.text.count("session large: the in-memory store is full") == 1
    # What was dropped is no longer counted: a deleted session gives its room back.
    await store.delete_session("large")
    assert 10_000 < store.size < 20_000


async def test_recordings_count_against_the_store(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock, max_bytes=1_000_000)
    await store.create_session("rec", {"owner": "n1"})
    await store.append_recordings([("rec", b"line\n" * 100_000, b"cut\n")], limit=10**9)
    assert 500_000 <= store.size <= 1_000_000
    for n in range(3):
        await store.create_session(f"more{n}", {"owner": "n1"})
        await store.append_recordings([(f"more{n}", b"line\n" * 100_000, b"")], limit=10**9)
    assert store.size <= 1_000_000 and await store.get_meta("rec") is None


@pytest.mark.parametrize(("option", "value"), [("ttl", 0.0), ("max_log", 0), ("max_bytes", 0)])
def test_bad_settings_are_refused(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=option):
        MemoryStore(**{option: value})  # type: ignore[arg-type]
