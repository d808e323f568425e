"""``RedisStore`` specifics: key layout, TTLs, group commit, scripts, outages."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.store import LeaseLost, LogEntry, RedisStore, SeqConflict, StoreUnavailable
from tests.store.conftest import poll_until
from tests.store.test_store import LEASE, entries
from tests.support.redis_server import RedisServer, free_port

# Outage tests bound every call: a store that hangs instead of failing is the bug.
FAIL_FAST = 5.0


@pytest.fixture
async def stores(redis_url: str) -> AsyncIterator[list[RedisStore]]:
    """Stores made by a test, closed after it."""
    made: list[RedisStore] = []
    yield made
    for store in made:
        await store.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def make(stores: list[RedisStore], url: str, **options: Any) -> RedisStore:
    store = RedisStore.from_url(url, **options)
    stores.append(store)
    return store


# --- layout --------------------------------------------------------------------


async def test_key_layout(redis_url: str, stores: list[RedisStore], raw: aioredis.Redis) -> None:
    store = make(stores, redis_url)
    await store.create_session("s1", {"owner": "n1"})
    await store.acquire_lease("s1", "n1", LEASE)
    await store.append("s1", "n1", entries(1, 2), [b"h1"])

    assert sorted(await raw.keys("*")) == [
        b"rtgw:{s1}:history",
        b"rtgw:{s1}:lease",
        b"rtgw:{s1}:log",
        b"rtgw:{s1}:meta",
    ]
    assert await raw.hgetall("rtgw:{s1}:meta") == {b"owner": b"n1"}
    # A first append reads the log's end (``check``): its IDs are ``SEQ-1``, past any fence.
    assert await raw.xrange("rtgw:{s1}:log") == [
        (b"1-1", {b"d": entries(1, 1)[0].data}),
        (b"2-1", {b"d": entries(2, 1)[0].data}),
    ]
    assert await raw.lrange("rtgw:{s1}:history", 0, -1) == [b"h1"]
    assert await raw.get("rtgw:{s1}:lease") == b"n1"
    # Reading after a seq skips every ID of it (``1-1`` is past ``1-0``).
    assert await store.wait_log("s1", 1, timeout=5) == entries(2, 1)
    assert await store.read_log("s1", 1) == entries(2, 1)


async def test_prefix_separates_deployments(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    a = make(stores, redis_url, prefix="a")
    b = make(stores, redis_url, prefix="b")
    await a.create_session("s1", {"owner": "n1"})
    assert await b.get_meta("s1") is None
    assert await raw.keys("*") == [b"a:{s1}:meta"]


async def test_append_refreshes_idle_ttl_but_not_the_lease(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    store = make(stores, redis_url, ttl=100.0)
    await store.create_session("s1", {"owner": "n1"})
    await store.acquire_lease("s1", "n1", 5.0)
    for key in ("meta", "log", "history"):  # push the idle TTL down to see it restored
        await raw.pexpire(f"rtgw:{{s1}}:{key}", 1000)
    await store.append("s1", "n1", entries(1, 1), [b"h"])

    for key in ("meta", "log", "history"):
        assert 90_000 < await raw.pttl(f"rtgw:{{s1}}:{key}") <= 100_000, key
    # The lease keeps its own, short TTL: an append must never extend it.
    assert 0 < await raw.pttl("rtgw:{s1}:lease") <= 5000


async def test_set_meta_refreshes_idle_ttl(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    store = make(stores, redis_url, ttl=100.0)
    await store.create_session("s1", {"owner": "n1"})
    await raw.pexpire("rtgw:{s1}:meta", 1000)
    await store.set_meta("s1", {"status": "idle"})
    assert await raw.pttl("rtgw:{s1}:meta") > 90_000


async def test_lease_ttls_are_milliseconds(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    store = make(stores, redis_url)
    await store.acquire_lease("s1", "n1", 2.5)
    assert 0 < await raw.pttl("rtgw:{s1}:lease") <= 2500
    assert await store.renew_lease("s1", "n1", 30.0)
    assert 29_000 < await raw.pttl("rtgw:{s1}:lease") <= 30_000
    assert await store.acquire_lease("s1", "n1", 60.0)  # ours: refreshed
    assert 59_000 < await raw.pttl("rtgw:{s1}:lease") <= 60_000


# --- group commit ------------------------------------------------------------


def gate_round_trips(store: RedisStore) -> asyncio.Event:
    """Hold every round trip until the test sets the event: a flush "in flight"."""
    gate = asyncio.Event()
    send = store._commit.sender.send

    async def held(route: Any, items: Any) -> Any:
        await gate.wait()
        return await send(route, items)

    store._commit.sender.send = held  # type: ignore[method-assign]
    return gate


async def test_appends_made_during_a_flush_go_in_the_next_one(
    redis_url: str, stores: list[RedisStore]
) -> None:
    store = make(stores, redis_url)
    gate = gate_round_trips(store)
    for i in range(100):
        await store.acquire_lease(f"s{i}", "n1", LEASE)

    first = asyncio.create_task(store.append("s0", "n1", entries(1, 1)))

    async def in_flight() -> bool:
        return store.stats.flushes == 1

    await poll_until(in_flight, "the first flush starts")
    later = []
    for i in range(100):  # one per loop tick, all while the first flush is held
        later.append(asyncio.create_task(store.append(f"s{i}", "n1", entries(1 + (i == 0), 1))))
        await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *later)

    assert store.stats.flushes == 2
    assert store.stats.max_batch == 100
    assert await store.read_log("s0", 0) == entries(1, 2)


async def test_max_batch_splits_big_queues(redis_url: str, stores: list[RedisStore]) -> None:
    store = make(stores, redis_url, max_batch=16)
    await store.acquire_lease("s1", "n1", LEASE)
    await asyncio.gather(*(store.append("s1", "n1", entries(seq, 1)) for seq in range(1, 101)))
    assert store.stats.max_batch == 16
    assert store.stats.flushes == 7
    assert await store.read_log("s1", 0) == entries(1, 100)


async def test_a_cancelled_append_still_lands(redis_url: str, stores: list[RedisStore]) -> None:
    """Later appends of the session count on it, so cancelling does not withdraw it."""
    store = make(stores, redis_url)
    await store.acquire_lease("s1", "n1", LEASE)
    task = asyncio.create_task(store.append("s1", "n1", entries(1, 1)))
    await asyncio.sleep(0)  # let it queue
    task.cancel()
    await store.append("s1", "n1", entries(2, 1))
    assert await store.read_log("s1", 0) == entries(1, 2)


async def test_close_lets_queued_appends_finish(redis_url: str, raw: aioredis.Redis) -> None:
    store = RedisStore.from_url(redis_url)
    await store.acquire_lease("s1", "n1", LEASE)
    tasks = [asyncio.create_task(store.append("s1", "n1", entries(s, 1))) for s in range(1, 11)]
    await asyncio.sleep(0)  # queued, not flushed yet
    await store.close()
    await asyncio.gather(*tasks)
    assert await raw.xlen("rtgw:{s1}:log") == 10


# --- scripts -------------------------------------------------------------------


async def test_noscript_after_script_flush_reloads(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    store = make(stores, redis_url)
    await store.acquire_lease("s1", "n1", LEASE)
    await store.append("s1", "n1", entries(1, 1))

    await raw.script_flush()
    await asyncio.gather(*(store.append("s1", "n1", entries(s, 1)) for s in range(2, 6)))
    assert store.stats.noscript_reloads == 1
    assert await store.read_log("s1", 0) == entries(1, 5)

    await raw.script_flush()
    assert await store.renew_lease("s1", "n1", LEASE)
    assert store.stats.noscript_reloads == 2
    with pytest.raises(LeaseLost):
        await store.append("s1", "n2", entries(6, 1))


@pytest.mark.parametrize("bulk_replies", [True, False], ids=["fast-path", "redis-py-parser"])
async def test_one_batch_settles_each_append_with_its_own_result(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis, bulk_replies: bool
) -> None:
    """Both reply readers (see gateway.store.redis_fastpath) give the same results."""
    store = make(stores, redis_url)
    store._commit.sender.bulk_replies = bulk_replies
    for sid in ("a", "b"):
        await store.acquire_lease(sid, "n1", LEASE)
    await store.acquire_lease("taken", "other", LEASE)

    results = await asyncio.gather(
        *(store.append("a", "n1", entries(seq, 1)) for seq in range(1, 51)),
        store.append("b", "n1", entries(7, 1)),
        store.append("taken", "n1", entries(1, 1)),
        return_exceptions=True,
    )
    assert results[:50] == [None] * 50
    assert isinstance(results[50], SeqConflict)
    assert isinstance(results[51], LeaseLost)
    assert await store.read_log("a", 0) == entries(1, 50)

    await raw.script_flush()
    await store.append("a", "n1", entries(51, 2))  # two events: the script, not a bare XADD
    assert store.stats.noscript_reloads == 1


async def _commands(raw: aioredis.Redis) -> int:
    """Data commands Redis has run since ``CONFIG RESETSTAT`` (scripts' calls included).

    Not counted: what a connection costs once (``SCRIPT LOAD``, ``CLIENT``,
    ``HELLO``) and the test's own ``CONFIG`` and ``INFO``.
    """
    stats = await raw.info("commandstats")
    setup = ("cmdstat_config", "cmdstat_info", "cmdstat_script", "cmdstat_client", "cmdstat_hello")
    return sum(int(v["calls"]) for k, v in stats.items() if not k.startswith(setup))


async def _submit(store: RedisStore, batches: list[Any]) -> list[BaseException | None]:
    done: asyncio.Future[list[BaseException | None]] = asyncio.get_running_loop().create_future()
    store.submit_appends(batches, done.set_result)
    return await done


async def test_redis_commands_per_logged_event(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    """Neither the log's end nor its TTL is read per event, nor (on the log writer's
    rounds) the lease: a one-event append there is a bare XADD.

    Redis's own count (INFO commandstats, the calls scripts make included),
    5 per event before: EVALSHA, GET, XREVRANGE, XADD, PTTL.
    """
    store = make(stores, redis_url)
    sids = [f"s{i}" for i in range(4)]
    for sid in sids:
        await store.create_session(sid, {"owner": "n1"})
        await store.acquire_lease(sid, "n1", LEASE)
        await store.append(sid, "n1", entries(1, 1))  # the first append reads the log's end
    # The awaited group commit (a Cluster's path) appends one event as a bare XADD too.
    await raw.config_resetstat()
    for seq in range(2, 12):
        for sid in sids:
            await store.append(sid, "n1", entries(seq, 1))
    assert await _commands(raw) == 10 * len(sids)
    # Two events: the script, EVALSHA, the lease's GET, an XADD each.
    await raw.config_resetstat()
    for sid in sids:
        await store.append(sid, "n1", entries(12, 2))
    assert await _commands(raw) == 4 * len(sids)
    # The log writer's rounds on one server: EVALSHA and MGET per round, XADD per event.
    seq = 14
    while not store.stats.pipe_rounds:  # the awaited path while the pipe connects
        assert await _submit(store, [(sid, "n1", entries(seq, 1), []) for sid in sids]) == [
            None
        ] * len(sids)
        seq += 1
    await raw.config_resetstat()
    start = seq
    for seq in range(start, start + 8):
        results = await _submit(store, [(sid, "n1", entries(seq, 1), []) for sid in sids])
        assert results == [None] * len(sids)
    assert store.stats.pipe_rounds == 9
    # One bare XADD per event: the fence is in the log (``ACQUIRE``), no lease read.
    assert await _commands(raw) == 8 * len(sids)
    for sid in sids:
        assert await store.read_log(sid, 0) == entries(1, seq)
    # Two events a session: one ROUND call, EVALSHA and MGET, then an XADD per event.
    await raw.config_resetstat()
    seq += 1
    results = await _submit(store, [(sid, "n1", entries(seq, 2), []) for sid in sids])
    assert results == [None] * len(sids)
    assert await _commands(raw) == 2 + 2 * len(sids)
    seq += 1
    # A log another writer made longer is still refused, without reading it first.
    for sid in ("s0", "s1"):
        await raw.xadd(f"rtgw:{{{sid}}}:log", {"d": b"x"}, id=f"{seq + 1}-0")
    with pytest.raises(SeqConflict, match=f"ends at {seq + 1}"):
        await store.append("s0", "n1", entries(seq + 1, 1))
    (refused,) = await _submit(store, [("s1", "n1", entries(seq + 1, 1), [])])
    assert isinstance(refused, SeqConflict) and f"ends at {seq + 1}" in str(refused)


async def _bare_rounds(store: RedisStore, sid: str, seq: int, node: str = "n1") -> int:
    """Append through the log writer's rounds until one goes as a bare XADD (the pipe
    connected, the log's end known); returns the next seq."""
    while True:
        before = store.stats.pipe_rounds
        assert await _submit(store, [(sid, node, entries(seq, 1), [])]) == [None]
        seq += 1
        if before and store.stats.pipe_rounds > before:
            return seq


async def test_a_node_that_lost_its_lease_cannot_append_once_another_took_the_session(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    """The fence in the log: a bare XADD reads no lease, so the node taking a lease nobody
    holds sets the log's last ID past the old owner's next append. The old owner's append
    is refused as ``LeaseLost`` (not stored), and the new owner's go on; a deleted
    session's log is not made again by an append of a node that missed the delete."""
    old, new = make(stores, redis_url), make(stores, redis_url)
    await old.create_session("s1", {"owner": "n1"})
    assert await old.acquire_lease("s1", "n1", LEASE)
    seq = await _bare_rounds(old, "s1", 1)
    ids = [entry_id for entry_id, _ in await raw.xrange("rtgw:{s1}:log")]
    assert ids[-1] == f"{seq - 1}-0".encode()  # the last went bare
    # The old owner is paused past its lease: it expires, another node takes the session.
    await raw.delete("rtgw:{s1}:lease")
    assert await new.acquire_lease("s1", "n2", LEASE)
    (refused,) = await _submit(old, [("s1", "n1", entries(seq, 1), [])])
    assert isinstance(refused, LeaseLost), refused
    assert [e.seq for e in await raw_log(raw, "s1")] == list(range(1, seq))
    await new.append("s1", "n2", entries(seq, 1))
    assert await _submit(new, [("s1", "n2", entries(seq + 1, 1), [])]) == [None]
    assert await new.read_log("s1", seq - 1) == entries(seq, 2)

    # The awaited group commit (a Cluster's path) appends bare too, and is fenced alike.
    await old.create_session("s3", {"owner": "n1"})
    assert await old.acquire_lease("s3", "n1", LEASE)
    await old.append("s3", "n1", entries(1, 1))  # reads the log's end
    await old.append("s3", "n1", entries(2, 1))  # bare
    assert [i for i, _ in await raw.xrange("rtgw:{s3}:log")] == [b"1-1", b"2-0"]
    await raw.delete("rtgw:{s3}:lease")
    assert await new.acquire_lease("s3", "n2", LEASE)
    with pytest.raises(LeaseLost):
        await old.append("s3", "n1", entries(3, 1))
    assert [e.seq for e in await raw_log(raw, "s3")] == [1, 2]

    # A delete the old owner's node never heard of: its append does not bring the log back.
    await new.create_session("s2", {"owner": "n2"})
    assert await new.acquire_lease("s2", "n2", LEASE)
    seq = await _bare_rounds(new, "s2", 1, "n2")
    assert await old.delete_session("s2")
    (refused,) = await _submit(new, [("s2", "n2", entries(seq, 1), [])])
    assert isinstance(refused, LeaseLost), refused
    assert not await raw.exists("rtgw:{s2}:log")


async def raw_log(raw: aioredis.Redis, sid: str) -> list[LogEntry]:
    return [
        LogEntry(int(entry_id.split(b"-")[0]), fields[b"d"])
        for entry_id, fields in await raw.xrange(f"rtgw:{{{sid}}}:log")
    ]


async def test_a_log_that_lost_its_end_across_a_reconnect_is_refused(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    """A failover to a replica without the last writes: the store's connections break and
    the log ends earlier than the store remembers. The next append reads the log's end
    again and is refused (``SeqConflict``), as before the store remembered it."""
    store = make(stores, redis_url)
    await store.create_session("s1", {"owner": "n1"})
    await store.acquire_lease("s1", "n1", LEASE)
    for seq in range(1, 4):
        await store.append("s1", "n1", entries(seq, 1))  # remembered: the log ends at 3
    await raw.xdel("rtgw:{s1}:log", "3-0")  # the promoted replica never got seq 3
    await raw.client_kill_filter(_type="normal", skipme=True)
    for _ in range(3):
        try:
            await store.append("s1", "n1", entries(4, 1))
        except StoreUnavailable:
            continue  # the append that found the connection killed ("maybe stored")
        except SeqConflict as exc:
            assert "ends at 2" in str(exc)
            break
        pytest.fail("seq 4 was appended to a log that ends at 2")
    assert [e.seq for e in await store.read_log("s1", 0)] == [1, 2]


async def test_a_lease_renewal_costs_redis_one_command_per_session(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    """The lease keeper's renewal: one MGET per 500 sessions, a PEXPIRE each (4 each before)."""
    store = make(stores, redis_url)
    sids = [f"s{i}" for i in range(10)]
    for sid in sids:
        await store.acquire_lease(sid, "n1", LEASE)
    await raw.config_resetstat()
    assert await store.keep_leases(sids, "n1", LEASE) == [True] * len(sids)
    assert await _commands(raw) == 2 + len(sids)  # EVALSHA, MGET, a PEXPIRE each


# --- blocking pool -------------------------------------------------------------


async def test_followers_do_not_starve_the_command_pool(
    redis_url: str, stores: list[RedisStore]
) -> None:
    leader = make(stores, redis_url, max_connections=2)
    await leader.acquire_lease("s1", "n1", LEASE)
    followers = [asyncio.create_task(leader.wait_log("s1", 0, timeout=30)) for _ in range(8)]

    async def all_blocked() -> bool:
        info = await leader._r.info("clients")
        return int(info["blocked_clients"]) == 8

    await poll_until(all_blocked, "8 followers block")
    async with asyncio.timeout(2):  # the 2 command connections are still free
        await leader.append("s1", "n1", entries(1, 1))
        assert await leader.last_seq("s1") == 1
    assert await asyncio.gather(*followers) == [entries(1, 1)] * 8


# --- outages -------------------------------------------------------------------


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, to stop, kill and restart."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    if server.proc is not None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


async def expect_unavailable(server: RedisServer, awaitable: Any) -> StoreUnavailable:
    async with asyncio.timeout(FAIL_FAST):
        with pytest.raises(StoreUnavailable) as caught:
            await awaitable
    message = str(caught.value)
    assert f"127.0.0.1:{server.port}" in message
    assert "REDIS_URL" in message
    return caught.value


async def test_outage_fails_fast_and_recovers(own_server: RedisServer) -> None:
    store = RedisStore.from_url(own_server.url)  # default timeouts: fail fast by default
    try:
        await store.create_session("s1", {"owner": "n1"})
        await store.acquire_lease("s1", "n1", LEASE)
        await store.append("s1", "n1", entries(1, 2))
        connects = store.stats.connects

        await asyncio.to_thread(own_server.stop)
        for call in (
            store.append("s1", "n1", entries(3, 1)),
            store.read_log("s1", 0),
            store.wait_log("s1", 2, timeout=10),
            store.get_meta("s1"),
            store.create_session("s2", {"owner": "n1"}),
            store.acquire_lease("s1", "n1", LEASE),
            store.lease_owner("s1"),
            store.last_seq("s1"),
            store.read_history("s1"),
        ):
            await expect_unavailable(own_server, call)
        appends = [store.append("s1", "n1", entries(3, 1)) for _ in range(5)]
        results = await asyncio.gather(*appends, return_exceptions=True)
        assert all(isinstance(r, StoreUnavailable) for r in results)
        assert not await store.ping()

        await asyncio.to_thread(own_server.start)  # same port, empty: no persistence
        assert await store.ping()
        assert await store.get_meta("s1") is None
        assert await store.acquire_lease("s1", "n1", LEASE)
        await store.append("s1", "n1", entries(1, 1))  # the scripts are back
        assert await store.read_log("s1", 0) == entries(1, 1)
        assert store.stats.connects > connects
        assert store.stats.noscript_reloads == 0  # loaded on connect, never missed
    finally:
        await store.close()


async def test_appends_survive_a_restart_while_idle(own_server: RedisServer) -> None:
    """The group commit keeps its connection; a restart closes it; no append may fail for that."""
    store = RedisStore.from_url(own_server.url)
    try:
        await store.acquire_lease("s1", "n1", LEASE)
        await store.append("s1", "n1", entries(1, 1))
        await asyncio.to_thread(own_server.restart)
        assert await store.acquire_lease("s1", "n1", LEASE)  # the data went with it
        await store.append("s1", "n1", entries(1, 1))
        assert await store.read_log("s1", 0) == entries(1, 1)
    finally:
        await store.close()


async def test_crash_wakes_blocked_followers_with_an_error(own_server: RedisServer) -> None:
    store = RedisStore.from_url(own_server.url)
    try:
        await store.acquire_lease("s1", "n1", LEASE)
        follower = asyncio.create_task(store.wait_log("s1", 0, timeout=30))

        async def blocked() -> bool:
            info = await store._r.info("clients")
            return int(info["blocked_clients"]) == 1

        await poll_until(blocked, "the follower blocks")
        await asyncio.to_thread(own_server.kill)
        await expect_unavailable(own_server, follower)
    finally:
        await store.close()


async def test_a_hung_redis_fails_within_the_socket_timeout(own_server: RedisServer) -> None:
    """SIGSTOP: the TCP connection stays up but nothing answers (a network partition)."""
    assert own_server.proc is not None
    store = RedisStore.from_url(own_server.url, socket_timeout=0.5, connect_timeout=0.5)
    try:
        await store.acquire_lease("s1", "n1", LEASE)
        await store.append("s1", "n1", entries(1, 1))

        os.kill(own_server.proc.pid, signal.SIGSTOP)
        await expect_unavailable(own_server, store.append("s1", "n1", entries(2, 1)))
        await expect_unavailable(own_server, store.read_log("s1", 0))
        await expect_unavailable(own_server, store.wait_log("s1", 5, timeout=0.2))
        assert not await store.ping()
        # A new connection's handshake must time out too, not retry inside itself.
        fresh = RedisStore.from_url(own_server.url, socket_timeout=0.5, connect_timeout=0.5)
        try:
            await expect_unavailable(own_server, fresh.get_meta("s1"))
            await expect_unavailable(own_server, fresh.append("s1", "n1", entries(2, 1)))
        finally:
            await fresh.close()

        os.kill(own_server.proc.pid, signal.SIGCONT)
        # The timed-out append may or may not have landed: the caller re-reads.
        last = await store.last_seq("s1")
        assert last in (1, 2)
        await store.append("s1", "n1", entries(last + 1, 1))
        assert await store.last_seq("s1") == last + 1
    finally:
        await store.close()


async def test_construction_needs_no_redis() -> None:
    port = free_port()  # nothing listens there
    store = RedisStore.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        assert not await store.ping()
        async with asyncio.timeout(FAIL_FAST):
            with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port} is unreachable"):
                await store.get_meta("s1")
            with pytest.raises(
                StoreUnavailable, match=r"may or may not be stored|nothing was stored"
            ):
                await store.append("s1", "n1", entries(1, 1))
    finally:
        await store.close()


# --- URLs ----------------------------------------------------------------------


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    """A redis-server listening only on a unix socket."""
    binary = shutil.which("redis-server")
    assert binary is not None
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield sock
    proc.terminate()
    proc.wait(5)


async def test_unix_socket_url(unix_socket: Path) -> None:
    store = RedisStore.from_url(f"unix://{unix_socket}")
    try:

        async def up() -> bool:
            return await store.ping()

        await poll_until(up, "redis on a unix socket answers")
        await store.acquire_lease("s1", "n1", LEASE)
        await store.append("s1", "n1", [LogEntry(1, b"x")])
        assert await store.read_log("s1", 0) == [LogEntry(1, b"x")]
    finally:
        await store.close()


def test_resp3_urls_are_refused() -> None:
    with pytest.raises(ValueError, match="RESP2"):
        RedisStore.from_url("redis://127.0.0.1:6379/0?protocol=3")


async def test_a_fenced_append_is_lease_lost_even_with_no_retry_window(
    redis_url: str, stores: list[RedisStore], raw: aioredis.Redis
) -> None:
    """A bare XADD the fence refused goes again as the script, which says why: that second
    send is not a retry of a failure, so a store that retries nothing
    (``--store-retry-window 0``) still tells the old owner ``LeaseLost``, not that Redis
    refused the append."""
    old = make(stores, redis_url, retry_window=0.0)
    new = make(stores, redis_url)
    await old.create_session("s1", {"owner": "n1"})
    assert await old.acquire_lease("s1", "n1", LEASE)
    await old.append("s1", "n1", entries(1, 1))  # reads the log's end
    await old.append("s1", "n1", entries(2, 1))  # bare
    await raw.delete("rtgw:{s1}:lease")
    assert await new.acquire_lease("s1", "n2", LEASE)
    with pytest.raises(LeaseLost):
        await old.append("s1", "n1", entries(3, 1))
    assert [e.seq for e in await raw_log(raw, "s1")] == [1, 2]
