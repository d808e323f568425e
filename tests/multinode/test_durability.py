"""Durability and failover as a client sees them (issue 29), on real Redis servers.

- ``--durability replicated`` with the replica paused (SIGSTOP): no logged
  event reaches the client until the replica resumes; the client is told once,
  in words that say why; ``/readyz`` and the metrics show it.
- A Sentinel or Cluster failover that leaves a primary without a replica:
  under "replicated" its sessions wait, under "replicated-or-local" they go on.
- A Cluster master killed: sessions on the other masters do not stall
  (under 300 ms), and a message sent to a session of the failing master is
  held and delivered, not bounced with a ``store`` error.

Each gateway runs in-process on the built-in simulator; Redis is real
processes (tests/support/redis_topologies.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import running_gateway
from gateway.config import load_config
from gateway.edge.server import Gateway
from gateway.store import (
    Durability,
    LogEntry,
    RedisStore,
    SeqConflict,
    StoreUnavailable,
    Unreplicated,
)
from protocol.events import Error
from tests.support.client import GatewayClient
from tests.support.redis_topologies import (
    ClusterRedis,
    RedisProcess,
    ReplicatedRedis,
    SentinelRedis,
    on_the_replica,
    wait_until,
)

pytestmark = pytest.mark.slow

LEASE = 30.0


def event(sid: str, seq: int) -> LogEntry:
    return LogEntry(seq, f'{{"sid":"{sid}","seq":{seq}}}'.encode())


@contextlib.asynccontextmanager
async def gateway_on(store: str, tmp_path: Path, **settings: Any) -> AsyncIterator[Gateway]:
    config = load_config(
        {
            "port": 0,
            "store": store,
            "workspace_root": str(tmp_path / "workspaces"),
            "lease_ttl": 3.0,
            **settings,
        },
        env={},
    )
    async with running_gateway(config) as gw:
        yield gw


async def http_get(gw: Gateway, path: str) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{gw.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(get)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    return 0.0


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    """Poll an HTTP-visible condition (readiness is cached 1 s: no event to await)."""
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 - state seen through HTTP only
            await asyncio.sleep(0.1)


# --- the replica paused ----------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_no_logged_event_reaches_a_client_while_the_replica_is_paused(
    tmp_path: Path,
) -> None:
    setup = ReplicatedRedis(tmp_path / "redis")
    await asyncio.to_thread(setup.start)
    assert setup.replica is not None and setup.replica.proc is not None
    pid = setup.replica.proc.pid
    try:
        async with gateway_on(
            setup.primary.url, tmp_path, durability="replicated", replica_timeout=0.3
        ) as gw:
            client = await GatewayClient.connect(gw.url)
            await client.turn("hello")
            before = client.last_seq
            os.kill(pid, signal.SIGSTOP)
            try:
                await client.user("and again")
                notice = await client.next(timeout=10)
                assert isinstance(notice, Error) and notice.code == "store", notice
                assert "replica" in notice.content and "held" in notice.content
                # Nothing logged comes while no replica confirms: not the user's
                # message, not the turn (was: both, 10 ms after the notice).
                with pytest.raises(TimeoutError):
                    await client.next(timeout=2.0)

                async def not_ready() -> bool:
                    status, body = await http_get(gw, "/readyz")
                    return status == 503 and "replica" in body

                await until(not_ready, "/readyz to say the store holds events")
                _, metrics = await http_get(gw, "/metrics")
                assert metric(metrics, "rtgw_store_holding_sessions") == 1
                assert metric(metrics, "rtgw_store_unconfirmed_masters") == 1
            finally:
                os.kill(pid, signal.SIGCONT)
            got = await client.until_type("end", timeout=20)
            logged = [e for e in got if not isinstance(e, Error)]
            assert [e.seq for e in logged] == list(range(before + 1, before + 1 + len(logged)))
            assert not [e for e in got if isinstance(e, Error)]  # said once, not per retry

            async def ready() -> bool:
                return (await http_get(gw, "/readyz"))[0] == 200

            await until(ready, "/readyz to be ready again")
            await client.close()
        with setup.replica.client() as c:  # everything the client saw, the replica has
            (key,) = c.keys("rtgw:*:log")
            assert len(c.xrange(key)) >= client.last_seq
    finally:
        os.kill(pid, signal.SIGCONT)
        await asyncio.to_thread(setup.stop)


# --- a failover that leaves a primary without a replica ------------------------------------


def failover_store(url: str, durability: Durability) -> RedisStore:
    return RedisStore.from_url(
        url,
        socket_timeout=1.0,
        connect_timeout=0.5,
        retry_window=2.0,
        durability=durability,
        replica_timeout=1.0,  # a replica on a loaded 2-core machine may take 300 ms
    )


async def append_or(store: RedisStore, sid: str, seq: int) -> BaseException | None:
    try:
        await store.append(sid, "n1", [event(sid, seq)])
    except StoreUnavailable as exc:
        return exc
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("durability", ["replicated", "replicated-or-local"])
async def test_a_sentinel_primary_left_without_a_replica(
    tmp_path: Path, durability: Durability
) -> None:
    setup = SentinelRedis(tmp_path)
    await asyncio.to_thread(setup.start)
    store = failover_store(setup.url, durability)
    try:
        assert await store.acquire_lease("s", "n1", LEASE)
        assert await append_or(store, "s", 1) is None
        old = setup.master_port()
        setup.by_port(old).kill()
        await asyncio.to_thread(wait_until, lambda: setup.failed_over_from(old), "failover")

        async def next_append() -> BaseException | None:
            seq = await store.last_seq("s") + 1
            return await append_or(store, "s", seq)

        outcome = await _settled(next_append)
        if durability == "replicated":  # the promoted replica has none: its sessions wait
            assert isinstance(outcome, Unreplicated), outcome
            assert store.degraded() is not None
        else:  # the named mode: on, unconfirmed, and it says so
            assert outcome is None
            assert store.unconfirmed() and store.degraded() is None
    finally:
        async with asyncio.timeout(15):
            await store.close()
        await asyncio.to_thread(setup.stop)


async def _settled(attempt: Any) -> BaseException | None:
    """The first outcome that is not "unreachable" (the client still finding the new primary)."""
    async with asyncio.timeout(30):
        while True:
            outcome = await attempt()
            if outcome is None or isinstance(outcome, Unreplicated):
                return outcome  # type: ignore[no-any-return]
            await asyncio.sleep(0.2)  # failing over: no event to await from here


@pytest.mark.timeout(150)
@pytest.mark.parametrize("durability", ["replicated", "replicated-or-local"])
async def test_a_cluster_shard_left_without_a_replica(
    tmp_path: Path, durability: Durability
) -> None:
    cluster = ClusterRedis(tmp_path)
    await asyncio.to_thread(cluster.start)
    store = failover_store(cluster.url, durability)
    try:
        sids = [f"c{i}" for i in range(12)]
        assert await store.keep_leases(sids, "n1", LEASE) == [True] * len(sids)
        for sid in sids:
            assert await append_or(store, sid, 1) is None
        victim = cluster.master_of(store._key("c0", "log"))
        healthy = [s for s in sids if cluster.master_of(store._key(s, "log")) is not victim]
        victim.kill()
        await asyncio.to_thread(
            wait_until, lambda: cluster.master_of(store._key("c0", "log")) is not victim, "failover"
        )

        async def next_append() -> BaseException | None:
            return await append_or(store, "c0", await store.last_seq("c0") + 1)

        outcome = await _settled(next_append)
        if durability == "replicated":
            assert isinstance(outcome, Unreplicated), outcome
        else:
            assert outcome is None and store.unconfirmed()
        for sid in healthy:  # the other shards keep their replicas and go on
            assert await append_or(store, sid, await store.last_seq(sid) + 1) is None
        # The killed node comes back as a replica: the shard confirms again.
        await asyncio.to_thread(victim.start)
        await asyncio.to_thread(wait_until, cluster.healthy, "the cluster is whole again", 30.0)
        async with asyncio.timeout(20):  # a replica just synced may miss a first WAIT
            while await _settled(next_append) is not None:
                pass
        assert await store.confirmed_seq("c0") == await store.last_seq("c0")
    finally:
        async with asyncio.timeout(15):
            await store.close()
        await asyncio.to_thread(cluster.stop)


# --- a master killed: the other shards do not stall; a message is not bounced -------------


async def healthy_shard_stall(cluster: ClusterRedis, store: RedisStore) -> tuple[float, float]:
    """Append on 24 sessions while the master of ``h0`` is killed and replaced.

    Returns the longest append on the surviving masters and the longest of the
    victim's sessions (a failed one counts until its retry), from the kill until
    the failover is over.
    """
    sids = [f"h{i}" for i in range(24)]
    assert await store.keep_leases(sids, "n1", LEASE) == [True] * len(sids)
    victim = cluster.master_of(store._key("h0", "log"))
    on_victim = {s for s in sids if cluster.master_of(store._key(s, "log")) is victim}
    worst = victim_worst = 0.0
    measuring = False
    stop = asyncio.Event()
    appended = dict.fromkeys(sids, 0)
    progress = asyncio.Condition()

    async def write(sid: str) -> None:
        nonlocal worst, victim_worst
        seq = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await store.append(sid, "n1", [event(sid, seq + 1)])
                seq += 1
                async with progress:
                    appended[sid] += 1
                    progress.notify_all()
            except (StoreUnavailable, SeqConflict):
                # The append may or may not be stored: the log's end says. Asked during
                # the failover, that may fail too, and the next append then conflicts
                # (it was stored): asked again after that, as the store's contract says.
                with contextlib.suppress(StoreUnavailable):
                    seq = await store.confirmed_seq(sid)
            took = time.monotonic() - started
            if measuring and sid not in on_victim:
                worst = max(worst, took)
            elif measuring:
                victim_worst = max(victim_worst, took)

    async def every_session_appends() -> None:
        """Until each session has appended once more than now (every lane sent)."""
        since = dict(appended)
        async with asyncio.timeout(30), progress:
            await progress.wait_for(lambda: all(appended[s] > since[s] for s in sids))

    tasks = [asyncio.create_task(write(sid)) for sid in sids]
    try:
        await every_session_appends()  # warm: every lane connected and busy
        # The leases on the replica before the kill: replication is asynchronous, and
        # a lease the promoted master never had is lost (the writer would stop).
        await on_the_replica(store, "h0")
        measuring = True
        victim.kill()
        await asyncio.to_thread(
            wait_until, lambda: cluster.master_of(store._key("h0", "log")) is not victim, "failover"
        )
        await every_session_appends()  # the new master took the failed shard's appends
    finally:
        stop.set()
        async with asyncio.timeout(15):
            await asyncio.gather(*tasks)
    return worst, victim_worst


@pytest.mark.timeout(120)
async def test_a_master_kill_stalls_only_its_own_shard(tmp_path: Path) -> None:
    # Redis' default (full coverage) has every master answer CLUSTERDOWN until
    # the failover is over: no client can keep the other shards going then.
    cluster = ClusterRedis(tmp_path, full_coverage=False)
    await asyncio.to_thread(cluster.start)
    store = failover_store(cluster.url, "local")
    try:
        worst, victim = await healthy_shard_stall(cluster, store)
        print(f"stall: healthy shards {worst * 1000:.0f} ms, the failed one {victim * 1000:.0f} ms")
        # Under 300 ms on a quiet machine (67 ms median measured; one pipeline for all
        # shards stalled them ~1.9 s, as long as the failed one). A machine starved of
        # CPU slows every shard alike: the healthy ones must still not wait for the
        # failed one's failover.
        assert worst < 0.3 or worst < 0.5 * victim, (
            f"sessions on healthy shards stalled {worst * 1000:.0f} ms "
            f"(the failed shard's {victim * 1000:.0f} ms)"
        )
    finally:
        async with asyncio.timeout(15):
            await store.close()
        await asyncio.to_thread(cluster.stop)


@pytest.mark.timeout(120)
async def test_a_message_sent_while_its_shard_fails_over_needs_no_resend(tmp_path: Path) -> None:
    cluster = ClusterRedis(tmp_path, full_coverage=False)
    await asyncio.to_thread(cluster.start)
    try:
        # The retry window covers this cluster's failover (node timeout 1 s, ~2-3 s).
        # "replicated-or-local": what the client saw before the kill is on the replica
        # that takes over. Under "local" a replica that lagged (the suite's load) could
        # take over without the session's log, and the session is then lost (1012),
        # as documented; the promise tested here is the held message's.
        async with gateway_on(
            cluster.url, tmp_path, store_retry_window=8.0, durability="replicated-or-local"
        ) as gw:
            client = await GatewayClient.connect(gw.url)
            await client.turn("hello")
            victim: RedisProcess = cluster.master_of(f"rtgw:{{{client.sid}}}:log")
            victim.kill()
            await client.user("sent while the shard fails over")
            got = await client.until_type("end", timeout=40)
            bounced = [e for e in got if isinstance(e, Error)]
            assert not bounced, bounced
            await client.close()
    finally:
        await asyncio.to_thread(cluster.stop)
