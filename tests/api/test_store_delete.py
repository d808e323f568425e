"""``Store.delete_session`` on both stores: everything goes, and the session stays fenced."""

from __future__ import annotations

import pytest

from gateway.store import LeaseLost, LogEntry, MemoryStore, RedisStore, Store

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "memory":
        return MemoryStore()
    return RedisStore(request.getfixturevalue("redis_url"))


async def test_delete_removes_everything_and_fences_the_lease(store: Store) -> None:
    try:
        assert await store.create_session("s1", {"owner": "alice"})
        assert await store.acquire_lease("s1", "node-a", 5.0)
        await store.append("s1", "node-a", [LogEntry(1, b'{"seq":1}')], [b"h"])
        assert await store.delete_session("s1")
        assert await store.get_meta("s1") is None
        assert await store.read_log("s1", 0) == []
        assert await store.read_history("s1") == []
        assert await store.lease_owner("s1") is None
        # A driver that has not heard of the delete cannot lease or write it back.
        assert not await store.acquire_lease("s1", "node-a", 5.0)
        assert await store.keep_leases(["s1"], "node-a", 5.0) == [False]
        with pytest.raises(LeaseLost):
            await store.append("s1", "node-a", [LogEntry(2, b'{"seq":2}')])
        assert await store.read_log("s1", 0) == []
        assert not await store.delete_session("s1")
        assert not await store.delete_session("never-was")
    finally:
        await store.close()


async def test_shared_secret_first_writer_wins(store: Store) -> None:
    try:
        first = await store.shared_secret("t", b"one")
        assert first == b"one"
        assert await store.shared_secret("t", b"two") == b"one"
    finally:
        await store.close()


async def test_deleted_sessions_are_told_while_fenced_and_forgotten_after() -> None:
    """The tombstones a workspace sweep reads (``were_deleted``) last as the fence does."""
    now = [1000.0]
    store = MemoryStore(ttl=60.0, clock=lambda: now[0])
    await store.create_session("kept", {"owner": "alice"})
    await store.create_session("gone", {"owner": "alice"})
    assert await store.delete_session("gone")
    assert await store.were_deleted(["gone", "kept", "never-was"]) == [True, False, False]
    now[0] += 61.0
    assert await store.were_deleted(["gone"]) == [False]


async def test_deleted_sessions_are_told_in_one_call_for_many(store: Store) -> None:
    try:
        sids = [f"s{n}" for n in range(1200)]  # more than one pipelined chunk
        for sid in sids[::300]:
            await store.delete_session(sid)
        told = await store.were_deleted(sids)
        assert [sid for sid, gone in zip(sids, told, strict=True) if gone] == sids[::300]
        assert await store.were_deleted([]) == []
    finally:
        await store.close()
