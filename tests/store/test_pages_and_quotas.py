"""Issue 29 in the store: pages bounded by bytes, short-lived new sessions, byte quotas.

The contract on both stores: ``read_log(max_bytes=…)`` never returns more
than fits (one larger entry comes alone), ``create_session(ttl=…)`` keeps a
session that long until its next write, and ``hold_bytes`` counts what a key
holds, refusing past its limit and forgetting members past their deadline.
"""

from __future__ import annotations

import pytest

from gateway.store import LogEntry, RedisStore, Store
from tests.store.conftest import Harness

LEASE = 30.0
SHORT = 0.3

pytestmark = pytest.mark.timeout(30)


def sized(first: int, sizes: list[int]) -> list[LogEntry]:
    return [LogEntry(first + i, b"x" * size) for i, size in enumerate(sizes)]


async def logged(store: Store, sid: str, log: list[LogEntry]) -> None:
    assert await store.acquire_lease(sid, "n1", LEASE)
    await store.append(sid, "n1", log)


# --- pages by bytes -----------------------------------------------------------


async def test_a_page_holds_no_more_bytes_than_asked_and_a_large_entry_comes_alone(
    store: Store,
) -> None:
    log = sized(1, [300, 300, 300, 1500, 10, 10, 700, 400])
    await logged(store, "s1", log)

    pages: list[list[LogEntry]] = []
    after = 0
    while page := await store.read_log("s1", after, 100, max_bytes=1000):
        pages.append(page)
        after = page[-1].seq
    assert [[e.seq for e in p] for p in pages] == [[1, 2, 3], [4], [5, 6, 7], [8]]
    assert [e for p in pages for e in p] == log  # nothing lost, nothing twice
    assert all(sum(len(e.data) for e in p) <= 1000 for p in pages if len(p) > 1)


async def test_a_page_by_bytes_still_stops_at_its_count(store: Store) -> None:
    # Many small entries: the Redis script reads them in growing batches.
    log = sized(1, [20] * 300)
    await logged(store, "s1", log)
    assert await store.read_log("s1", 0, 150, max_bytes=1 << 20) == log[:150]
    assert await store.read_log("s1", 290, 150, max_bytes=1 << 20) == log[290:]
    assert await store.read_log("s1", 0, 1000, max_bytes=200) == log[:10]
    assert await store.read_log("s1", 300, 10, max_bytes=200) == []
    assert await store.read_log("nope", 0, 10, max_bytes=200) == []


# --- a short TTL until the next write -------------------------------------------


async def test_a_session_made_with_a_short_ttl_goes_unless_written_again(
    harness: Harness,
) -> None:
    store = harness.make(ttl=60.0)
    assert await store.create_session("unused", {"owner": "k"}, ttl=SHORT)
    assert await store.create_session("used", {"owner": "k"}, ttl=SHORT)
    await store.set_meta("used", {"unused": "0"})  # a write restarts the normal TTL
    if isinstance(store, RedisStore):
        pttl = await store._r.pttl("rtgw:{used}:meta")
        assert SHORT * 1000 < pttl <= 60_000

    async def gone() -> bool:
        return await store.get_meta("unused") is None

    await harness.after(SHORT, gone, "the unused session expires")
    assert await store.get_meta("used") == {"owner": "k", "unused": "0"}


async def test_a_short_ttl_must_be_positive(store: Store) -> None:
    with pytest.raises(ValueError, match="> 0"):
        await store.create_session("s1", {"owner": "k"}, ttl=0)


# --- byte quotas --------------------------------------------------------------------


async def test_a_byte_quota_counts_what_its_members_hold(store: Store) -> None:
    assert await store.hold_bytes("q", "a", 400, 1000, LEASE) == (True, 400)
    assert await store.hold_bytes("q", "b", 500, 1000, LEASE) == (True, 900)
    assert await store.hold_bytes("q", "c", 200, 1000, LEASE) == (False, 900)  # nothing held
    assert await store.hold_bytes("q", "a", 100, 1000, LEASE) == (True, 600)  # replaced
    assert await store.hold_bytes("q", "c", 200, 1000, LEASE) == (True, 800)
    await store.release_bytes("q", "b")
    await store.release_bytes("q", "b")  # twice: a no-op
    await store.release_bytes("q", "nobody")
    assert await store.hold_bytes("q", "d", 700, 1000, LEASE) == (True, 1000)
    assert await store.hold_bytes("other", "a", 999, 1000, LEASE) == (True, 999)  # its own
    assert await store.hold_bytes("q", "e", 10**9, 0, LEASE) == (True, 1000 + 10**9)  # no limit


async def test_a_byte_quota_forgets_members_past_their_deadline(harness: Harness) -> None:
    store = harness.make()
    assert await store.hold_bytes("q", "short", 800, 1000, SHORT) == (True, 800)
    assert await store.hold_bytes("q", "long", 100, 1000, LEASE) == (True, 900)
    assert (await store.hold_bytes("q", "new", 800, 1000, LEASE))[0] is False
    # Holding again moves a deadline: "long" now lasts as short as "short".
    assert await store.hold_bytes("q", "long", 100, 1000, SHORT) == (True, 900)

    async def freed() -> bool:
        return await store.hold_bytes("q", "new", 800, 1000, LEASE) == (True, 800)

    await harness.after(SHORT, freed, "the short members stop counting")
    if isinstance(store, RedisStore):  # the quota's keys expire with their last member
        pttl = await store._r.pttl("rtgw:quota:{q}:total")
        assert SHORT * 1000 < pttl <= LEASE * 1000
