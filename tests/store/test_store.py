"""The store contract, run against both ``MemoryStore`` and ``RedisStore``.

The gateway is written against ``Store`` only, so whatever one backend does the
other must do too; backend-specific details live in test_redis.py and
test_memory.py.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway.store import LeaseLost, LogEntry, RedisStore, SeqConflict, Store
from tests.store.conftest import Harness

LEASE = 30.0
SHORT = 0.2


def entries(first: int, count: int, tag: str = "") -> list[LogEntry]:
    return [LogEntry(seq, f'{{"seq":{seq}{tag}}}'.encode()) for seq in range(first, first + count)]


async def owned(store: Store, sid: str, node: str = "n1") -> Store:
    assert await store.acquire_lease(sid, node, LEASE)
    return store


# --- meta ------------------------------------------------------------------


async def test_create_get_set_meta(store: Store) -> None:
    assert await store.get_meta("s1") is None
    assert await store.create_session("s1", {"owner": "n1", "provider": "sim"})
    assert not await store.create_session("s1", {"owner": "n2"})
    assert await store.get_meta("s1") == {"owner": "n1", "provider": "sim"}

    await store.set_meta("s1", {"status": "active", "owner": "n2"})
    assert await store.get_meta("s1") == {"owner": "n2", "provider": "sim", "status": "active"}


async def test_set_meta_does_not_create_a_session(store: Store) -> None:
    await store.set_meta("ghost", {"status": "active"})
    assert await store.get_meta("ghost") is None


async def test_create_session_needs_meta(store: Store) -> None:
    with pytest.raises(ValueError, match="meta field"):
        await store.create_session("s1", {})


async def test_get_meta_returns_a_copy(store: Store) -> None:
    await store.create_session("s1", {"owner": "n1"})
    meta = await store.get_meta("s1")
    assert meta is not None
    meta["owner"] = "mutated"
    assert await store.get_meta("s1") == {"owner": "n1"}


# --- log -------------------------------------------------------------------


async def test_append_then_read_log_in_order(store: Store) -> None:
    await owned(store, "s1")
    await store.append("s1", "n1", entries(1, 3))
    await store.append("s1", "n1", entries(4, 2))
    assert await store.read_log("s1", 0) == entries(1, 5)
    assert await store.first_seq("s1") == 1
    assert await store.last_seq("s1") == 5


async def test_read_log_after_and_limit(store: Store) -> None:
    await owned(store, "s1")
    await store.append("s1", "n1", entries(1, 10))
    assert await store.read_log("s1", 7) == entries(8, 3)
    assert await store.read_log("s1", 2, limit=3) == entries(3, 3)
    assert await store.read_log("s1", 10) == []
    assert await store.read_log("s1", 99) == []
    assert await store.read_log("s1", 0, limit=0) == []


async def test_unknown_session_reads_empty(store: Store) -> None:
    assert await store.read_log("nope", 0) == []
    assert await store.first_seq("nope") == 0
    assert await store.last_seq("nope") == 0
    assert await store.read_history("nope") == []
    assert await store.lease_owner("nope") is None


async def test_binary_data_round_trips(store: Store) -> None:
    await owned(store, "s1")
    blob = bytes(range(256)) + b"\r\n$3\r\n" + "ünï".encode()
    await store.append("s1", "n1", [LogEntry(1, blob), LogEntry(2, b"")], [blob])
    assert await store.read_log("s1", 0) == [LogEntry(1, blob), LogEntry(2, b"")]
    assert await store.read_history("s1") == [blob]


@pytest.mark.parametrize(
    ("first", "count"),
    [(5, 1), (6, 3), (3, 1), (2, 2), (1, 3)],
    ids=["gap", "gap-batch", "duplicate-last", "overlap", "rewrite-all"],
)
async def test_seq_conflict(store: Store, first: int, count: int) -> None:
    await owned(store, "s1")
    await store.append("s1", "n1", entries(1, 3))
    with pytest.raises(SeqConflict, match="ends at 3"):
        await store.append("s1", "n1", entries(first, count, tag=",x"), [b"h"])
    # Nothing of the refused append was stored, history included.
    assert await store.read_log("s1", 0) == entries(1, 3)
    assert await store.read_history("s1") == []
    await store.append("s1", "n1", entries(4, 1))
    assert await store.last_seq("s1") == 4


async def test_first_append_must_start_at_one(store: Store) -> None:
    await owned(store, "s1")
    with pytest.raises(SeqConflict):
        await store.append("s1", "n1", entries(2, 1))
    await store.append("s1", "n1", entries(1, 1))


async def test_entries_must_be_consecutive(store: Store) -> None:
    await owned(store, "s1")
    with pytest.raises(ValueError, match="consecutive"):
        await store.append("s1", "n1", [LogEntry(1, b"a"), LogEntry(3, b"c")])
    assert await store.read_log("s1", 0) == []


# --- history ---------------------------------------------------------------


async def test_history_append_and_read(store: Store) -> None:
    await owned(store, "s1")
    await store.append("s1", "n1", entries(1, 1), [b"user:hi"])
    await store.append("s1", "n1", [], [b"think:a", b"call:b"])
    await store.append("s1", "n1", entries(2, 2), [b"respond:c"])
    await store.append("s1", "n1", entries(4, 1))
    assert await store.read_history("s1") == [b"user:hi", b"think:a", b"call:b", b"respond:c"]
    assert await store.last_seq("s1") == 4


async def test_many_history_items_in_one_append(store: Store) -> None:
    await owned(store, "s1")
    items = [b"%d" % i for i in range(2500)]
    await store.append("s1", "n1", [], items)
    assert await store.read_history("s1") == items


async def test_history_is_read_a_page_at_a_time(store: Store) -> None:
    await owned(store, "s1")
    items = [b"%d" % i for i in range(70)]
    await store.append("s1", "n1", [], items)
    pages = [await store.read_history("s1", start, 32) for start in (0, 32, 64, 70)]
    assert pages == [items[:32], items[32:64], items[64:], []]
    assert await store.read_history("s1", 68) == items[68:]  # count 0: to the end
    assert await store.read_history("nope", 0, 32) == []


# --- lease and fencing ---------------------------------------------------------


async def test_a_lease_says_how_long_it_has_left(store: Store) -> None:
    assert await store.lease_expires_in("s1") == 0.0  # nobody holds it
    assert await store.acquire_lease("s1", "n1", LEASE)
    assert 0 < await store.lease_expires_in("s1") <= LEASE
    await store.release_lease("s1", "n1")
    assert await store.lease_expires_in("s1") == 0.0


async def test_lease_acquire_renew_release(store: Store) -> None:
    assert await store.acquire_lease("s1", "n1", LEASE)
    assert await store.lease_owner("s1") == "n1"
    assert await store.acquire_lease("s1", "n1", LEASE)  # already ours: refreshed
    assert not await store.acquire_lease("s1", "n2", LEASE)
    assert await store.renew_lease("s1", "n1", LEASE)
    assert not await store.renew_lease("s1", "n2", LEASE)

    await store.release_lease("s1", "n2")  # not n2's: no-op
    assert await store.lease_owner("s1") == "n1"
    await store.release_lease("s1", "n1")
    assert await store.lease_owner("s1") is None
    assert not await store.renew_lease("s1", "n1", LEASE)
    assert await store.acquire_lease("s1", "n2", LEASE)
    assert await store.lease_owner("s1") == "n2"


async def test_keep_leases_renews_ours_takes_free_ones_and_reports_lost_ones(
    store: Store,
) -> None:
    assert await store.acquire_lease("mine", "n1", LEASE)
    assert await store.acquire_lease("theirs", "n2", LEASE)
    held = await store.keep_leases(["mine", "theirs", "free"], "n1", LEASE)
    assert held == [True, False, True]
    assert [await store.lease_owner(s) for s in ("mine", "theirs", "free")] == ["n1", "n2", "n1"]
    many = [f"s{i}" for i in range(1200)]  # more than one pipelined chunk
    assert await store.keep_leases(many, "n1", LEASE) == [True] * 1200


async def test_lease_expires(harness: Harness) -> None:
    store = harness.make()
    assert await store.acquire_lease("s1", "n1", SHORT)
    await harness.lease_expired(store, "s1", SHORT)
    assert await store.lease_owner("s1") is None
    assert not await store.renew_lease("s1", "n1", SHORT)
    assert await store.acquire_lease("s1", "n2", LEASE)


@pytest.mark.parametrize("ttl", [0.0, -1.0])
async def test_lease_ttl_must_be_positive(store: Store, ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await store.acquire_lease("s1", "n1", ttl)


async def test_append_without_lease_is_refused(store: Store) -> None:
    with pytest.raises(LeaseLost, match="nobody"):
        await store.append("s1", "n1", entries(1, 1))
    await owned(store, "s1", "n2")
    with pytest.raises(LeaseLost, match="n2"):
        await store.append("s1", "n1", entries(1, 1), [b"h"])
    with pytest.raises(LeaseLost):
        await store.append("s1", "n1", [], [b"h"])  # history alone is fenced too
    assert await store.read_log("s1", 0) == []
    assert await store.read_history("s1") == []


async def test_append_many_settles_each_session_on_its_own(store: Store) -> None:
    await owned(store, "a", "n1")
    await owned(store, "b", "n2")
    await owned(store, "c", "n1")
    await store.append("c", "n1", entries(1, 2))
    results = await store.append_many(
        [
            ("a", "n1", entries(1, 3), [b"ha"]),
            ("b", "n1", entries(1, 1), []),  # not n1's lease
            ("c", "n1", entries(5, 1), []),  # a gap after seq 2
        ]
    )
    assert results[0] is None
    assert isinstance(results[1], LeaseLost)
    assert isinstance(results[2], SeqConflict)
    assert [e.seq for e in await store.read_log("a", 0)] == [1, 2, 3]
    assert await store.read_history("a") == [b"ha"]
    assert await store.read_log("b", 0) == []
    assert [e.seq for e in await store.read_log("c", 0)] == [1, 2]


async def test_append_after_release_is_refused(store: Store) -> None:
    await owned(store, "s1")
    await store.append("s1", "n1", entries(1, 1))
    await store.release_lease("s1", "n1")
    with pytest.raises(LeaseLost):
        await store.append("s1", "n1", entries(2, 1))
    assert await store.last_seq("s1") == 1


async def test_takeover_fences_the_old_owner(harness: Harness) -> None:
    """The race the fence exists for: both nodes believe they may write seq 3."""
    old = harness.make()
    new = harness.peer(old)
    assert await old.acquire_lease("s1", "old", LEASE)
    await old.append("s1", "old", entries(1, 2))

    assert await old.renew_lease("s1", "old", SHORT)  # its last renewal, then it stalls
    await harness.lease_expired(old, "s1", SHORT)
    assert await new.acquire_lease("s1", "new", LEASE)
    assert await new.last_seq("s1") == 2
    await new.append("s1", "new", entries(3, 1, tag=',"by":"new"'))

    with pytest.raises(LeaseLost, match="new"):
        await old.append("s1", "old", entries(3, 1, tag=',"by":"old"'))
    assert not await old.renew_lease("s1", "old", LEASE)
    assert await old.read_log("s1", 2) == entries(3, 1, tag=',"by":"new"')


# --- following -------------------------------------------------------------


async def test_wait_log_wakes_on_another_nodes_append(harness: Harness) -> None:
    leader = harness.make()
    follower = harness.peer(leader)
    await owned(leader, "s1")
    await leader.append("s1", "n1", entries(1, 2))

    waiting = asyncio.create_task(follower.wait_log("s1", 2, timeout=30))
    await harness.follower_blocked(follower)
    assert not waiting.done()
    await leader.append("s1", "n1", entries(3, 2))
    assert await waiting == entries(3, 2)


async def test_wait_log_returns_what_is_there_without_waiting(store: Store) -> None:
    await owned(store, "s1")
    await store.append("s1", "n1", entries(1, 3))
    async with asyncio.timeout(1):
        assert await store.wait_log("s1", 1, timeout=30) == entries(2, 2)


async def test_wait_log_times_out_empty(store: Store) -> None:
    assert await store.wait_log("s1", 0, timeout=0.1) == []
    await owned(store, "s1")
    await store.append("s1", "n1", entries(1, 1))
    assert await store.wait_log("s1", 1, timeout=0.1) == []
    assert await store.wait_log("s1", 1, timeout=0) == []


async def test_wait_log_ahead_of_the_log_waits_for_newer(harness: Harness) -> None:
    """A follower that holds seq 5 is not woken by seq 4, like ``XREAD BLOCK``."""
    leader = harness.make()
    follower = harness.peer(leader)
    await owned(leader, "s1")
    await leader.append("s1", "n1", entries(1, 3))

    waiting = asyncio.create_task(follower.wait_log("s1", 5, timeout=30))
    await harness.follower_blocked(follower)
    await leader.append("s1", "n1", entries(4, 1))
    await leader.append("s1", "n1", entries(5, 2))
    assert await waiting == entries(6, 1)


# --- trimming and expiry -----------------------------------------------------


async def test_log_is_trimmed_to_max_log(harness: Harness) -> None:
    store = harness.make(max_log=10)
    await owned(store, "s1")
    for first in range(1, 301, 10):
        await store.append("s1", "n1", entries(first, 10))

    first = await store.first_seq("s1")
    assert 1 < first <= 291  # old entries went; at least max_log stayed
    assert await store.last_seq("s1") == 300
    log = await store.read_log("s1", 0, limit=1000)
    assert log == entries(first, 301 - first)
    # A client that asks for a trimmed range gets what is left, from first_seq.
    assert (await store.read_log("s1", 0, limit=1))[0].seq == first


async def test_idle_session_expires(harness: Harness) -> None:
    store = harness.make(ttl=0.3)
    await store.create_session("s1", {"owner": "n1"})
    await owned(store, "s1")
    await store.append("s1", "n1", entries(1, 2), [b"h"])

    await harness.idle_expired(store, "s1")
    assert await store.get_meta("s1") is None
    assert await store.read_log("s1", 0) == []
    assert await store.last_seq("s1") == 0
    assert await store.read_history("s1") == []
    # The session id can start over.
    assert await store.create_session("s1", {"owner": "n2"})


# --- group commit ------------------------------------------------------------


async def test_concurrent_appends_of_many_sessions_all_land_in_order(store: Store) -> None:
    sessions = [f"s{i}" for i in range(50)]
    for sid in sessions:
        await owned(store, sid)

    calls = []
    for round_ in range(4):  # 4 appends per session, 200 in all, issued in order
        for sid in sessions:
            first = round_ * 2 + 1
            calls.append(
                store.append(sid, "n1", entries(first, 2, tag=f',"s":"{sid}"'), [b"%d" % round_])
            )
    await asyncio.gather(*calls)

    for sid in sessions:
        assert await store.read_log(sid, 0) == entries(1, 8, tag=f',"s":"{sid}"')
        assert await store.read_history(sid) == [b"0", b"1", b"2", b"3"]
    if isinstance(store, RedisStore):
        assert store.stats.appends == 200
        assert store.stats.flushes <= 200 // 10, store.stats
        assert store.stats.max_batch >= 50, store.stats


async def test_concurrent_appends_of_one_session_keep_call_order(store: Store) -> None:
    await owned(store, "s1")
    await asyncio.gather(*(store.append("s1", "n1", entries(seq, 1)) for seq in range(1, 101)))
    assert await store.read_log("s1", 0) == entries(1, 100)


async def test_each_caller_gets_its_own_error(harness: Harness) -> None:
    store = harness.make()
    await owned(store, "ok")
    await owned(store, "seq")
    await store.append("seq", "n1", entries(1, 1))
    await owned(store, "taken", "other")

    results = await asyncio.gather(
        store.append("ok", "n1", entries(1, 1)),
        store.append("seq", "n1", entries(5, 1)),
        store.append("taken", "n1", entries(1, 1)),
        store.append("ok", "n1", entries(2, 1)),
        return_exceptions=True,
    )
    assert results[0] is None
    assert isinstance(results[1], SeqConflict)
    assert isinstance(results[2], LeaseLost)
    assert results[3] is None
    assert await store.read_log("ok", 0) == entries(1, 2)


async def test_a_refused_append_fails_the_later_ones_of_its_session(store: Store) -> None:
    """A failed batch is not skipped over: the next batch of the session conflicts."""
    await owned(store, "s1")
    results = await asyncio.gather(
        store.append("s1", "n1", entries(2, 1)),  # gap: refused
        store.append("s1", "n1", entries(3, 1)),  # follows the refused one: refused too
        return_exceptions=True,
    )
    assert [type(r) for r in results] == [SeqConflict, SeqConflict]
    assert await store.read_log("s1", 0) == []


# --- control messages --------------------------------------------------------


async def test_publish_counts_who_got_it(harness: Harness) -> None:
    """0 means nobody listened: a node forwarding a command then keeps it."""
    sender = harness.make()
    receiver = harness.peer(sender)
    assert await sender.publish("node:gone", b"lost") == 0
    got: asyncio.Queue[bytes] = asyncio.Queue()
    listening = asyncio.create_task(receiver.listen("node:here", got.put_nowait))
    try:
        async with asyncio.timeout(5):
            # Subscribing takes a round trip on Redis; there is no event for it.
            while await sender.publish("node:here", b"hello") == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            assert await got.get() == b"hello"
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
