"""``RedisStore`` on a real Redis Cluster (3 masters, 3 replicas), on Sentinel, and replicated.

The same store operations as on one Redis (appends, fencing, resume reads,
control messages, counters), then what only these setups have: sessions spread
over masters, sharded pub/sub, a primary ``kill -9``-ed mid-appends with its
replica promoted, and ``durability="replicated"`` keeping every append that was
reported stored.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot

from gateway.store import (
    Durability,
    LeaseLost,
    LogEntry,
    RedisStore,
    SeqConflict,
    StoreUnavailable,
    open_redis_client,
    open_store,
)
from gateway.store.redis_connect import parse_hosts
from tests.store.conftest import poll_until
from tests.support.redis_topologies import (
    ClusterRedis,
    RedisProcess,
    ReplicatedRedis,
    SentinelRedis,
    on_the_replica,
    wait_until,
)

LEASE = 30.0


def event(sid: str, seq: int) -> LogEntry:
    return LogEntry(seq, f'{{"sid":"{sid}","seq":{seq}}}'.encode())


# --- no server -------------------------------------------------------------------


@pytest.mark.parametrize("sid", ["s1", "a-b_c.9", "x}y", "{odd}", "日本"])
def test_a_sessions_keys_share_one_slot(sid: str) -> None:
    store = RedisStore.from_url("redis+cluster://127.0.0.1:1")
    slots = {
        key_slot(store._key(sid, kind).encode()) for kind in ("meta", "log", "history", "lease")
    }
    assert len(slots) == 1


@pytest.mark.parametrize("key", ["config:alice", "config:a.b_c-9", "config:"])
def test_a_byte_quotas_keys_share_one_slot(key: str) -> None:
    store = RedisStore.from_url("redis+cluster://127.0.0.1:1")
    assert len({key_slot(k.encode()) for k in store._quota_keys(key)}) == 1


def test_cluster_and_sentinel_urls_are_parsed() -> None:
    url = parse_hosts("rediss+cluster://user:p%40ss@10.0.0.1:7000,[::1]:7001?x=1")
    assert url.tls and url.hosts == [("10.0.0.1", 7000), ("::1", 7001)]
    assert (url.username, url.password, url.query) == ("user", "p@ss", {"x": "1"})
    url = parse_hosts("redis+sentinel://a:26379,b:26380/mymaster")
    assert not url.tls and url.hosts == [("a", 26379), ("b", 26380)] and url.path == "mymaster"


@pytest.mark.parametrize(
    "url, fix",
    [
        ("redis+cluster://127.0.0.1", "bad host:port"),
        ("redis+cluster://127.0.0.1:7000/3", "only database 0"),
        ("redis+sentinel://127.0.0.1:26379", "no master name"),
    ],
)
def test_bad_urls_say_how_to_fix_them(url: str, fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        open_store(url)


async def test_factory_opens_cluster_and_sentinel_stores_without_connecting() -> None:
    for url, kind in [
        ("redis+cluster://127.0.0.1:1,127.0.0.1:2", "redis-cluster"),
        ("redis+sentinel://127.0.0.1:1/m", "redis-sentinel"),
    ]:
        store = open_store(url, durability="replicated")
        try:
            assert isinstance(store, RedisStore)
            assert (store.kind, store.durability) == (kind, "replicated")
            assert not await store.ping()
        finally:
            await store.close()


# --- shared setups ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRedis]:
    setup = ClusterRedis(Path(tmp_path_factory.mktemp("cluster")))
    setup.start()
    yield setup
    setup.stop()


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelRedis]:
    setup = SentinelRedis(Path(tmp_path_factory.mktemp("sentinel")))
    setup.start()
    yield setup
    setup.stop()


@pytest.fixture
async def cluster_store(cluster: ClusterRedis) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(cluster.url, prefix=f"t{os.urandom(3).hex()}")
    yield store
    await store.close()


@pytest.fixture
async def sentinel_store(sentinel: SentinelRedis) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(sentinel.url, prefix=f"t{os.urandom(3).hex()}")
    yield store
    await store.close()


async def exercise(
    store: RedisStore, peer: RedisStore, server_of: Callable[[str], RedisProcess]
) -> None:
    """What a node does with its store, on any topology; ``peer`` is another node.

    ``server_of(key)`` is the server that holds ``key`` now.
    """
    assert await store.ping()
    sids = [f"s{i}" for i in range(40)]
    assert await store.create_session("s0", {"owner": "n1"})
    assert not await store.create_session("s0", {"owner": "n2"})
    assert await store.keep_leases(sids, "n1", LEASE) == [True] * 40
    # One group commit for sessions on every master; each settles on its own.
    results = await store.append_many(
        [(sid, "n1", [event(sid, 1), event(sid, 2)], [b"h-" + sid.encode()]) for sid in sids]
    )
    assert results == [None] * 40
    # Fencing: another node cannot write, and seqs must follow on.
    with pytest.raises(LeaseLost):
        await peer.append("s1", "n2", [event("s1", 3)])
    with pytest.raises(SeqConflict):
        await store.append("s1", "n1", [event("s1", 5)])
    # Resume reads, as a reconnecting client's node does.
    assert await peer.read_log("s7", 1) == [event("s7", 2)]
    assert (await peer.first_seq("s7"), await peer.last_seq("s7")) == (1, 2)
    assert await peer.read_history("s7") == [b"h-s7"]
    assert await peer.get_meta("s0") == {"owner": "n1"}
    # A follower on the peer wakes on the owner's append.
    follower = asyncio.create_task(peer.wait_log("s9", 2, timeout=10))
    holder = server_of(store._key("s9", "log"))

    async def blocked() -> bool:
        with holder.client() as c:
            return int(c.info("clients")["blocked_clients"]) > 0

    await poll_until(blocked, "the follower blocks in XREAD")
    await store.append("s9", "n1", [event("s9", 3)])
    async with asyncio.timeout(5):
        assert await follower == [event("s9", 3)]
    # Counters and slots of the per-key limits.
    assert await store.incr_window("turns:k1:m", 2, 60) == 2
    assert await peer.incr_window("turns:k1:m", 1, 60) == 3
    assert await store.acquire_slot("conns:k1", "a", 1, 30)
    assert not await peer.acquire_slot("conns:k1", "b", 1, 30)
    await store.release_slot("conns:k1", "a")
    assert await peer.acquire_slot("conns:k1", "b", 1, 30)
    # A byte quota's keys, and a page cut by bytes (issue 29): one slot each.
    assert await store.hold_bytes("config:k1", "s1", 10, 15, 30) == (True, 10)
    assert await peer.hold_bytes("config:k1", "s2", 10, 15, 30) == (False, 10)
    assert await peer.read_log("s7", 0, 10, max_bytes=1) == [event("s7", 1)]
    # Control messages between nodes.
    received: list[bytes] = []
    got = asyncio.Event()

    def on_message(data: bytes) -> None:
        received.append(data)
        got.set()

    listener = asyncio.create_task(peer.listen("node-b", on_message))
    try:
        async with asyncio.timeout(10):
            while not got.is_set():  # published before the subscription is lost: send again
                await store.publish("node-b", b"stop s1")
                with_timeout = asyncio.create_task(got.wait())
                await asyncio.wait({with_timeout}, timeout=0.2)
                with_timeout.cancel()
        assert received[0] == b"stop s1"
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    await store.release_lease("s1", "n1")
    assert await peer.lease_owner("s1") is None


async def test_cluster_store(cluster: ClusterRedis, cluster_store: RedisStore) -> None:
    peer = RedisStore.from_url(cluster.url, prefix=cluster_store.prefix)
    try:
        await exercise(cluster_store, peer, cluster.master_of)
    finally:
        await peer.close()
    # The sessions really are spread over the three masters, and the 40
    # appends went in one batch: one pipeline per master, each with all of
    # that master's sessions (a lane per master since issue 29).
    ports = [cluster.master_of(cluster_store._key(f"s{i}", "log")).port for i in range(40)]
    assert len(set(ports)) == 3
    assert cluster_store.stats.max_batch == max(ports.count(p) for p in set(ports))


async def test_a_cluster_store_closes_while_a_topology_refresh_holds_its_client(
    cluster: ClusterRedis,
) -> None:
    # A refresh that does not end (the blocking client's CLUSTER SLOTS has no socket
    # timeout: a node that accepts and never answers) holds the client's lock, which
    # aclose takes: the store closes anyway, its connections with it.
    store = RedisStore.from_url(cluster.url, prefix=f"t{os.urandom(3).hex()}")
    await store.acquire_lease("s1", "n1", 30)
    await store.append("s1", "n1", [event("s1", 1)])
    topology = store._core.topology
    log_key = store._key("s1", "log")
    await topology.blocking(log_key, "XREAD", "COUNT", "1", "STREAMS", log_key, "0")
    blocking = topology._blocking

    def connected() -> list[object]:
        nodes = blocking.nodes_manager.nodes_cache.values()
        return [conn for node in nodes for conn in node._connections if conn.is_connected]

    assert connected()  # the XREAD's
    lock = blocking._lock
    assert lock is not None  # made by the first initialize
    held = asyncio.Event()

    async def refresh_that_never_ends() -> None:
        async with lock:
            held.set()
            await asyncio.Event().wait()

    stuck = asyncio.get_running_loop().create_task(refresh_that_never_ends())
    try:
        await held.wait()
        await asyncio.wait_for(store.close(), 20)  # it waited for good before
        assert connected() == []
    finally:
        stuck.cancel()
        await asyncio.wait({stuck})


async def test_the_plain_client_for_other_redis_users_takes_cluster_urls(
    cluster: ClusterRedis,
) -> None:
    """``gateway.auth``'s API keys hash needs a client for the same URL as the store."""
    client = open_redis_client(cluster.url)
    try:
        await client.hset("rtgw:keys", "digest1", "key-a")
        assert await client.hget("rtgw:keys", "digest1") == b"key-a"
    finally:
        await client.aclose()


async def test_cluster_control_messages_are_sharded(
    cluster: ClusterRedis, cluster_store: RedisStore
) -> None:
    """SSUBSCRIBE on the channel's shard: only that master carries the subscription."""
    listener = asyncio.create_task(cluster_store.listen("node-x", lambda data: None))
    channel = f"{cluster_store.prefix}:ctl:node-x"
    owner = cluster.master_of(channel)
    try:

        async def subscribed() -> bool:
            with owner.client() as c:
                return channel.encode() in c.execute_command("PUBSUB", "SHARDCHANNELS")

        await poll_until(subscribed, "the shard channel is subscribed")
        for node in cluster.nodes:
            if node.port != owner.port and cluster.role(node) == "master":
                with node.client() as c:
                    assert channel.encode() not in c.execute_command("PUBSUB", "SHARDCHANNELS")
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)


async def test_sentinel_store(sentinel: SentinelRedis, sentinel_store: RedisStore) -> None:
    peer = RedisStore.from_url(sentinel.url, prefix=sentinel_store.prefix)
    try:
        await exercise(sentinel_store, peer, lambda key: sentinel.by_port(sentinel.master_port()))
    finally:
        await peer.close()
    assert sentinel_store.kind == "redis-sentinel"


# --- replicated durability -------------------------------------------------------------


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[ReplicatedRedis]:
    setup = ReplicatedRedis(tmp_path)
    setup.start()
    yield setup
    if setup.replica is not None and setup.replica.proc is not None:
        os.kill(setup.replica.proc.pid, signal.SIGCONT)
    setup.stop()


@pytest.mark.slow
async def test_replicated_appends_are_on_the_replica_when_reported_stored(
    replicated: ReplicatedRedis,
) -> None:
    assert replicated.replica is not None and replicated.replica.proc is not None
    # Generous: on a loaded machine a healthy replica may take a while to ack.
    store = RedisStore.from_url(
        replicated.primary.url, durability="replicated", replica_timeout=3.0
    )
    try:
        await store.acquire_lease("s1", "n1", LEASE)
        await store.append("s1", "n1", [event("s1", 1), event("s1", 2)])
        # Reported stored: the replica already has it (no waiting here).
        with replicated.replica.client() as c:
            assert len(c.xrange("rtgw:{s1}:log")) == 2

        os.kill(replicated.replica.proc.pid, signal.SIGSTOP)  # the replica stops acking
        async with asyncio.timeout(15):
            with pytest.raises(StoreUnavailable, match="replica"):
                await store.append("s1", "n1", [event("s1", 3)])
        assert store.stats.unreplicated == 1
        # "Maybe stored": it is on the primary; the caller learns that from last_seq.
        assert await store.last_seq("s1") == 3
        os.kill(replicated.replica.proc.pid, signal.SIGCONT)
        await store.append("s1", "n1", [event("s1", 4)])
    finally:
        await store.close()


# --- failovers ------------------------------------------------------------------------


class Writers:
    """Sessions appending as fast as the store answers, as a node's sessions do.

    ``stored[sid]`` is the last seq an append reported stored. After a
    ``StoreUnavailable`` ("maybe stored") a writer reads ``last_seq`` to learn
    what landed and goes on from there, as the gateway's unsure-batch logic does.
    """

    def __init__(
        self,
        store: RedisStore,
        sids: list[str],
        *,
        rounds: bool = False,
        explain: Callable[[], str] | None = None,
    ) -> None:
        self.store = store
        self.explain = explain  # what the servers say, for a stalled run's report
        self.sids = sids
        # rounds: append as the node's log writer does (``submit_appends``,
        # the append pipe on one server) rather than with ``append``.
        self.rounds = rounds
        self.stored = dict.fromkeys(sids, 0)
        self.failures = 0
        self.last_error: dict[str, str] = {}  # each session's newest failure, for a report
        self._stop = False
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        assert await self.store.keep_leases(self.sids, "n1", 120.0) == [True] * len(self.sids)
        self._tasks = [asyncio.create_task(self._write(sid)) for sid in self.sids]

    async def _write(self, sid: str) -> None:
        seq = 0
        while not self._stop:
            try:
                if self.rounds:
                    await self._round(sid, seq + 1)
                else:
                    await self.store.append(sid, "n1", [event(sid, seq + 1)])
            except StoreUnavailable as exc:
                self.failures += 1
                self.last_error[sid] = str(exc)[:200]
                seq = await self._last_seq(sid)
            except Exception as exc:  # the writer ends: its report says why
                self.last_error[sid] = f"{type(exc).__name__}: {str(exc)[:200]}"
                raise
            else:
                seq += 1
                self.stored[sid] = seq

    def halt(self) -> None:
        """No append after the ones in flight: a failed test's writers would otherwise
        keep the store's lanes busy, and its close waiting, for good."""
        self._stop = True

    async def _round(self, sid: str, seq: int) -> None:
        answered: asyncio.Future[list[BaseException | None]] = (
            asyncio.get_running_loop().create_future()
        )
        self.store.submit_appends([(sid, "n1", [event(sid, seq)], [])], answered.set_result)
        (result,) = await answered
        if result is not None:
            raise result

    async def _last_seq(self, sid: str) -> int:
        while True:
            try:
                return await self.store.last_seq(sid)
            except StoreUnavailable:
                await asyncio.sleep(0.1)  # the store is failing over: no event to await

    async def progressed(self, by: int) -> None:
        """Return once every session has had ``by`` more appends reported stored."""
        base = dict(self.stored)

        async def moved() -> bool:
            return all(self.stored[sid] >= base[sid] + by for sid in self.sids)

        try:
            async with asyncio.timeout(30):
                while not await moved():  # noqa: ASYNC110 - progress has no single event
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(self.report(base, by)) from None

    def report(self, base: dict[str, int], by: int) -> str:
        """What a stalled run needs for a diagnosis: who moved, and where each writer waits."""
        lines = [
            f"not every session had {by} more appends stored within 30 s "
            f"(failures so far: {self.failures}; store: {self.store.stats})"
        ]
        for sid, task in zip(self.sids, self._tasks, strict=True):
            where = " -> ".join(_await_chain(task.get_coro())) if not task.done() else "done"
            lines.append(
                f"  {sid}: {base[sid]} -> {self.stored[sid]}; waits in {where}; last failure: "
                f"{self.last_error.get(sid, 'none')}"
            )
        if self.explain is not None:
            lines.append(self.explain())
        return "\n".join(lines)

    async def stop(self) -> None:
        self._stop = True
        async with asyncio.timeout(15):  # each writer finishes its append in flight
            await asyncio.gather(*self._tasks)

    async def check_nothing_reported_stored_was_lost(self) -> None:
        for sid in self.sids:
            log = await self.store.read_log(sid, 0, limit=1_000_000)
            assert len(log) >= self.stored[sid], f"{sid}: appends reported stored were lost"
            assert log == [event(sid, seq) for seq in range(1, len(log) + 1)], sid


def _await_chain(awaitable: object) -> list[str]:
    """Where a suspended coroutine waits: each frame down its chain of awaits."""
    chain = []
    while awaitable is not None:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            chain.append(type(awaitable).__name__)
            break
        chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
    return chain


def failover_store(url: str, **options: Any) -> RedisStore:
    return RedisStore.from_url(
        url, socket_timeout=1.0, connect_timeout=0.5, retry_window=2.0, **options
    )


async def close_within(store: RedisStore, seconds: float) -> None:
    """Close, bounded: a store that cannot close fails the test here rather than at
    the test's timeout, and says where its close waited and what every other task
    was doing (their await chains), with the appends the group commit held."""
    commit = store._commit
    closing = asyncio.get_running_loop().create_task(store.close(), name="store.close")
    done, _ = await asyncio.wait({closing}, timeout=seconds)
    if done:
        closing.result()
        return
    others = asyncio.all_tasks() - {closing, asyncio.current_task()}
    busy = [
        f"  {task.get_name()}: " + " -> ".join(_await_chain(task.get_coro()))
        for task in [closing, *others]
        if not task.done()
    ]
    closing.cancel()
    await asyncio.wait({closing})
    raise AssertionError(
        f"the store did not close within {seconds} s; held appends: "
        f"{len(commit._held)}, queued: {len(commit._intake)}, "
        f"lanes: {[(n, len(lane.queue), lane.busy) for n, lane in commit._lanes.items()]}\n"
        + "\n".join(busy)
    )


async def restart(node: RedisProcess) -> None:
    await asyncio.to_thread(node.start)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("durability", ["replicated", "local"])
async def test_cluster_master_killed_mid_appends(tmp_path: Path, durability: Durability) -> None:
    """kill -9 a master: its replica takes over and the store keeps working.

    With durability=replicated no append reported stored is lost. With local
    durability the last ones before the kill may be (replication is
    asynchronous), which is what the setting is for: only progress is checked.
    """
    cluster = ClusterRedis(tmp_path)
    await asyncio.to_thread(cluster.start)
    store = failover_store(cluster.url, durability=durability, replica_timeout=1.0)
    writers = Writers(store, [f"f{i}" for i in range(24)], explain=cluster.describe)
    try:
        await writers.start()
        await writers.progressed(5)

        victim = cluster.master_of(store._key("f0", "log"))
        # The leases on the replica before the kill: replication is asynchronous, and a
        # lease the promoted master never had ends its writer (LeaseLost), durably or not.
        await on_the_replica(store, "f0")
        victim.kill()
        # The replica is promoted by the cluster itself (node timeout 1 s).
        await asyncio.to_thread(
            wait_until, lambda: cluster.master_of(store._key("f0", "log")) is not victim, "failover"
        )
        if durability == "replicated":
            # WAIT 1 needs a replica again: the killed node comes back as one.
            await restart(victim)
            await asyncio.to_thread(wait_until, cluster.healthy, "the cluster is whole again", 30.0)
        await writers.progressed(20)  # every session, including those of the killed master
        await writers.stop()
        assert writers.failures > 0  # the kill was felt, and survived
        if durability == "replicated":
            await writers.check_nothing_reported_stored_was_lost()
    finally:
        writers.halt()
        await close_within(store, 15)
        await asyncio.to_thread(cluster.stop)


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_sentinel_master_killed_mid_appends(tmp_path: Path) -> None:
    """kill -9 the primary: Sentinel promotes the replica; the store follows it."""
    setup = SentinelRedis(tmp_path)
    await asyncio.to_thread(setup.start)
    store = failover_store(setup.url, durability="replicated", replica_timeout=1.0)
    writers = Writers(store, [f"f{i}" for i in range(8)])
    try:
        await writers.start()
        await writers.progressed(5)

        old_port = setup.master_port()
        victim = setup.by_port(old_port)
        victim.kill()
        await asyncio.to_thread(
            wait_until,
            lambda: setup.failed_over_from(old_port),
            "every sentinel knows the failover",
        )
        # Back as a replica of the new primary, as a node restarted by an
        # operator that asks Sentinel for the primary first. Started empty and
        # as a primary it would be one until Sentinel demotes it (~8 s), and a
        # candidate for promotion meanwhile: with no persistence, an empty one.
        await asyncio.to_thread(victim.start, replica_of=setup.master_port())
        await writers.progressed(20)
        await writers.stop()
        await writers.check_nothing_reported_stored_was_lost()
    finally:
        writers.halt()
        await close_within(store, 15)
        await asyncio.to_thread(setup.stop)


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_the_append_pipe_follows_a_sentinel_failover(tmp_path: Path) -> None:
    """The log writer's rounds ride the append pipe; a failover moves it to the new primary.

    The demoted primary answers READONLY or drops the connection: either way
    the round is sent again or reported "maybe stored", the pipe reconnects
    through Sentinel, and every session's log stays one gapless sequence.
    """
    setup = SentinelRedis(tmp_path)
    await asyncio.to_thread(setup.start)
    store = failover_store(setup.url)
    writers = Writers(store, [f"p{i}" for i in range(8)], rounds=True)
    try:
        await writers.start()
        await writers.progressed(5)
        assert store.stats.pipe_rounds > 0

        old_port = setup.master_port()
        with setup.sentinels[0].client() as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", setup.name)
        await asyncio.to_thread(
            wait_until, lambda: setup.master_port() != old_port, "sentinel failover"
        )
        await writers.progressed(5)  # the new primary takes appends
        before = store.stats.pipe_rounds
        await writers.progressed(5)
        assert store.stats.pipe_rounds > before  # and they ride the pipe again
        await writers.stop()
        for sid in writers.sids:  # one gapless sequence (durability=local may drop a tail)
            log = await store.read_log(sid, 0, limit=1_000_000)
            assert log == [event(sid, seq) for seq in range(1, len(log) + 1)], sid
            assert len(log) >= 10
    finally:
        writers.halt()
        await close_within(store, 15)
        await asyncio.to_thread(setup.stop)


@pytest.mark.slow
async def test_cluster_redirects_after_a_manual_failover_are_followed(
    cluster: ClusterRedis, cluster_store: RedisStore
) -> None:
    """The store's slot map goes stale (MOVED); appends and listeners follow on their own."""
    store = cluster_store
    await store.acquire_lease("m1", "n1", LEASE)
    await store.append("m1", "n1", [event("m1", 1)])
    old = cluster.master_of(store._key("m1", "log"))
    channel = f"{store.prefix}:ctl:"
    received: list[bytes] = []
    # A listener on a channel that lives on the same master.
    name = next(f"n{i}" for i in range(10_000) if cluster.master_of(channel + f"n{i}") is old)
    listener = asyncio.create_task(store.listen(name, received.append))
    try:
        replica = next(
            n
            for n in cluster.nodes
            if n.alive
            and cluster.role(n) == "slave"
            and n.client().info("replication")["master_port"] == old.port
        )
        with replica.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")  # graceful: the old master becomes a replica
        await asyncio.to_thread(
            wait_until,
            lambda: cluster.master_of(store._key("m1", "log")) is replica,
            "manual failover",
        )
        await store.append("m1", "n1", [event("m1", 2)])  # routed to the old master: MOVED
        assert await store.read_log("m1", 0) == [event("m1", 1), event("m1", 2)]
        assert store.stats.redirects >= 1

        async def delivered() -> bool:
            await store.publish(name, b"ping")
            return bool(received)

        await poll_until(delivered, "the listener subscribes again at the new master")
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
