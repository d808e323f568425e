"""A Cluster failover leaves the promoted master without the store's scripts.

Redis 7 does not replicate ``SCRIPT LOAD``: a replica's script cache is
empty, so after a failover the first appends the promoted master gets are
answered ``NOSCRIPT``. The group commit loads the script there and sends them
again at once: nothing of them ran, so this is a second send, not a failure
held for a backoff. Held, it once spent the append's retry window: an append
whose window ended right then failed, and under ``--store-retry-window 0``
(and once in CI, where the store's view missed a master when it loaded its
scripts) every first append a master answered ``NOSCRIPT`` failed.

Real redis-server processes (tests/support/redis_topologies.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.store import LogEntry, RedisStore, StoreUnavailable
from gateway.store.redis_scripts import APPEND
from tests.support.redis_topologies import ClusterRedis, RedisProcess, on_the_replica, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def event(sid: str, seq: int) -> LogEntry:
    return LogEntry(seq, f'{{"sid":"{sid}","seq":{seq}}}'.encode())


def every_live_node_names_another_master(
    cluster: ClusterRedis, key: str, victim: RedisProcess
) -> bool:
    """Each live node's ``CLUSTER SLOTS`` gives ``key``'s slot to a master other than
    ``victim``: whichever node the store asks next, it learns the promoted one."""
    for node in cluster.nodes:
        if not node.alive:
            continue
        with node.client() as c:
            slot = c.cluster("keyslot", key)
            owners = [
                int(master[1])
                for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS")
                if start <= slot <= end
            ]
        if owners != [owners[0]] or owners[0] == victim.port:
            return False
    return True


@contextlib.asynccontextmanager
async def failed_over(
    tmp_path: Path, retry_window: float
) -> AsyncIterator[tuple[ClusterRedis, RedisStore, str]]:
    """A store that appended seq 1 to session ``s`` (on a replica too), whose master was
    then killed; yielded once every live node names the promoted master. The store
    has not been told: its next append goes where it last knew."""
    cluster = ClusterRedis(tmp_path, full_coverage=False)
    await asyncio.to_thread(cluster.start)
    store = RedisStore.from_url(
        cluster.url, socket_timeout=1.0, connect_timeout=0.5, retry_window=retry_window
    )
    key = store._key("s", "log")
    try:
        assert await store.keep_leases(["s"], "n1", 60.0) == [True]
        await store.append("s", "n1", [event("s", 1)])  # the lane is connected
        # On the replica before the kill, so the promoted master has seq 1.
        await on_the_replica(store, "s")
        victim = cluster.master_of(key)
        victim.kill()
        await asyncio.to_thread(
            wait_until,
            lambda: every_live_node_names_another_master(cluster, key, victim),
            "the failover, known to every live node",
        )
        yield cluster, store, key
    finally:
        async with asyncio.timeout(15):
            await store.close()
        await asyncio.to_thread(cluster.stop)


async def test_the_promoted_masters_noscript_spends_no_retry_window(tmp_path: Path) -> None:
    # A window of 100 ms: the append is held once (the killed master refuses
    # the connection) and sent again 50 ms later to the promoted master, which
    # answers NOSCRIPT; held once more, its next backoff (100 ms) would end past
    # the window and fail it. Sent again at once, it is stored.
    async with failed_over(tmp_path, retry_window=0.1) as (cluster, store, key):
        reloads = store.stats.noscript_reloads
        promoted = cluster.master_of(key)
        with promoted.client() as c:
            assert c.script_exists(APPEND.sha) == [False]

        await store.append("s", "n1", [event("s", 2)])
        assert store.stats.noscript_reloads == reloads + 1  # the promoted master's
        with promoted.client() as c:
            assert c.script_exists(APPEND.sha) == [True]
        assert await store.read_log("s", 0) == [event("s", 1), event("s", 2)]


async def test_a_store_that_retries_nothing_still_finds_the_promoted_master(
    tmp_path: Path,
) -> None:
    """``--store-retry-window 0`` fails an append at once instead of holding it, and the
    failure must still make the store learn the new layout: it once learnt it only
    while it held appends, so a store that held none sent every later append of the
    shard to the dead master, for good."""
    async with failed_over(tmp_path, retry_window=0.0) as (_, store, _key):
        with pytest.raises(StoreUnavailable):  # sent where the store last knew: dead
            await store.append("s", "n1", [event("s", 2)])
        failures = 0
        async with asyncio.timeout(20):
            while True:  # a few may fail (sent to the dead master): none is held
                try:
                    await store.append("s", "n1", [event("s", 2)])
                    break
                except StoreUnavailable:
                    failures += 1
                    await asyncio.sleep(0.05)
        assert failures < 20, failures
        assert await store.read_log("s", 0) == [event("s", 1), event("s", 2)]
