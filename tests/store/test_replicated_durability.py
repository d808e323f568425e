"""Durability means what it says (issue 29), on real servers: a primary and its replica.

Under ``durability="replicated"`` an append no replica confirmed is not
"stored": it fails with ``Unreplicated``, and ``confirmed_seq`` does not say
it is stored because the primary has it; only a replica's confirmation
(asked again) does. ``replicated-or-local`` is the named mode that sends
anyway, and says so in ``unconfirmed``. The replica is paused with SIGSTOP:
it keeps its connection but acknowledges nothing, as a stalled or partitioned
replica does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.store import LogEntry, RedisStore, StoreUnavailable, Unreplicated
from tests.support.redis_topologies import ReplicatedRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

LEASE = 30.0


def event(sid: str, seq: int) -> LogEntry:
    return LogEntry(seq, f'{{"sid":"{sid}","seq":{seq}}}'.encode())


class Paused:
    """SIGSTOP a server process while inside; SIGCONT on the way out, whatever happens."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> Paused:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[ReplicatedRedis]:
    setup = ReplicatedRedis(tmp_path)
    setup.start()
    yield setup
    if setup.replica is not None and setup.replica.proc is not None:
        os.kill(setup.replica.proc.pid, signal.SIGCONT)
    setup.stop()


def replica_pid(setup: ReplicatedRedis) -> int:
    assert setup.replica is not None and setup.replica.proc is not None
    return setup.replica.proc.pid


async def test_an_unconfirmed_append_is_not_stored_until_a_replica_confirms_it(
    replicated: ReplicatedRedis,
) -> None:
    store = RedisStore.from_url(
        replicated.primary.url, durability="replicated", replica_timeout=1.0
    )
    try:
        await store.acquire_lease("s1", "n1", LEASE)
        await store.append("s1", "n1", [event("s1", 1)])
        assert await store.confirmed_seq("s1") == 1
        assert store.degraded() is None
        with Paused(replica_pid(replicated)):
            with pytest.raises(Unreplicated, match="replica"):
                await store.append("s1", "n1", [event("s1", 2)])
            assert await store.last_seq("s1") == 2  # the primary has it...
            with pytest.raises(Unreplicated):  # ...which is not what counts
                await store.confirmed_seq("s1")
            reason = store.degraded()
            assert reason is not None and "replica" in reason and "hold" in reason
            assert store.unconfirmed() != []
        # Resumed: asked again, the replica confirms the whole log.
        assert await store.confirmed_seq("s1") == 2
        assert store.degraded() is None and store.unconfirmed() == []
        with replicated.replica.client() as c:  # type: ignore[union-attr]
            assert len(c.xrange("rtgw:{s1}:log")) == 2
    finally:
        await store.close()


async def test_replicated_or_local_sends_unconfirmed_appends_and_says_so(
    replicated: ReplicatedRedis,
) -> None:
    # A timeout a loaded machine's healthy replica meets: the first append must be confirmed.
    timeout = 1.0
    store = RedisStore.from_url(
        replicated.primary.url, durability="replicated-or-local", replica_timeout=timeout
    )
    try:
        await store.acquire_lease("s1", "n1", LEASE)
        await store.append("s1", "n1", [event("s1", 1)])
        assert store.stats.unreplicated == 0
        with Paused(replica_pid(replicated)):
            await store.append("s1", "n1", [event("s1", 2)])  # waits replica_timeout once
            assert store.stats.unreplicated == 1
            assert store.unconfirmed() != []
            assert store.degraded() is None  # available: readiness stays 200
            started = time.monotonic()
            for seq in range(3, 8):  # degraded: no longer a replica_timeout per append
                await store.append("s1", "n1", [event("s1", seq)])
            assert time.monotonic() - started < 5 * timeout
            assert await store.confirmed_seq("s1") == 7  # as stored as this mode promises
        async with asyncio.timeout(10):
            seq = 8
            while store.unconfirmed():  # the short WAIT notices the replica back
                await store.append("s1", "n1", [event("s1", seq)])
                seq += 1
    finally:
        await store.close()


async def test_an_append_that_failed_in_flight_is_settled_by_a_replica(
    replicated: ReplicatedRedis,
) -> None:
    """The log writer's settling: last_seq says "landed", confirmed_seq says "not yet"."""
    store = RedisStore.from_url(
        replicated.primary.url, durability="replicated", replica_timeout=1.0
    )
    try:
        await store.acquire_lease("s1", "n1", LEASE)
        with Paused(replica_pid(replicated)):
            results = await store.append_many([("s1", "n1", [event("s1", 1)], [])])
            assert isinstance(results[0], StoreUnavailable)
            for _ in range(3):  # asked as often as the writer retries: never "stored"
                with pytest.raises(Unreplicated):
                    await store.confirmed_seq("s1")
        assert await store.confirmed_seq("s1") == 1
    finally:
        await store.close()
