"""Two gateway nodes on a real Redis Cluster (3 masters, 3 replicas) and on Sentinel.

Sessions live on both nodes, turns and resumes cross nodes, and a master is
killed (``kill -9``) while turns stream: once its replica is promoted every
session runs another turn with contiguous seqs, and with ``--durability
replicated`` every client's replay from the log equals what it received —
no event a client saw was lost with the master.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

from protocol.events import Event, Interrupt, Metric, Respond, User
from tests.multinode.conftest import SimFactory
from tests.multinode.test_failover import MESSAGE, assert_contiguous, logged
from tests.support.client import GatewayClient, text_of
from tests.support.procs import NodeProcess
from tests.support.redis_topologies import ClusterRedis, SentinelRedis, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SESSIONS_PER_NODE = 4
# Longer than a failover takes here (node timeout 1 s, then an election; more on
# a busy machine), as in production: a lease that expires while no primary
# answers moves sessions between nodes (their clients get 1012 and reconnect).
LEASE_TTL = 6.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterRedis]:
    topology = ClusterRedis(tmp_path / "cluster")
    topology.start()
    yield topology
    topology.stop()


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[SentinelRedis]:
    topology = SentinelRedis(tmp_path / "sentinel")
    topology.start()
    yield topology
    topology.stop()


def _node(sim: NodeProcess, name: str, url: str, workspaces: Path) -> NodeProcess:
    return NodeProcess(
        [
            "serve",
            "--port",
            "0",
            "--provider",
            "openai",
            "--openai-base-url",
            sim.url.removesuffix("/realtime"),
            "--redis",
            url,
            "--durability",
            "replicated",
            "--node-id",
            name,
            "--lease-ttl",
            str(LEASE_TTL),
            "--workspace-root",
            str(workspaces),
        ],
        env={"OPENAI_API_KEY": "sim-key"},
    ).start()


async def _connect_when_ready(node: NodeProcess, **resume: Any) -> GatewayClient:
    """Connect as a client would: a node answers 503 until it sees the new primary."""
    for _ in range(100):
        try:
            return await GatewayClient.connect(node.url, **resume)
        except InvalidStatus as exc:
            if exc.response.status_code != 503:
                raise
            await asyncio.sleep(0.2)  # a client's retry delay, not synchronisation
    raise TimeoutError(f"{node.url} still answers 503 after 20 s:\n{node.log}")


async def _replay(node: NodeProcess, client: GatewayClient) -> list[Event]:
    """Everything the log holds for the client's session, read through ``node``."""
    replay = await GatewayClient.connect(node.url, session_id=client.sid, after=0)
    await replay.until(lambda e: e.seq == client.last_seq)
    await replay.close()
    return logged(replay.events)


def _answer(events: list[Event]) -> str:
    """The respond text of the last turn's last attempt (after its user message and interrupts)."""
    last = max((i for i, e in enumerate(events) if isinstance(e, Interrupt | User)), default=-1)
    return text_of(events[last + 1 :], "respond")


async def test_two_nodes_on_a_cluster_survive_a_master_killed_mid_turn(
    start_sim: SimFactory, cluster: ClusterRedis, tmp_path: Path
) -> None:
    sim = start_sim("--tokens-per-second", "30")
    nodes = [_node(sim, f"node-{n}", cluster.url, tmp_path / "ws") for n in "ab"]
    try:
        clients = [
            await GatewayClient.connect(node.url)
            for node in nodes
            for _ in range(SESSIONS_PER_NODE)
        ]
        # A first turn on each session, then a resume on the other node.
        await asyncio.gather(*(c.turn("hello") for c in clients))
        for c in clients:
            assert text_of(c.events, "respond") == "Echo: hello"
        half = len(clients) // 2
        moved = []
        for i, c in enumerate(clients):
            other = nodes[1] if i < half else nodes[0]
            await c.close()
            m = await GatewayClient.connect(other.url, session_id=c.sid, after=c.last_seq)
            assert m.session.resumed
            m.events[:0] = c.events  # one client's view across both connections
            moved.append(m)
        clients = moved

        # Turns stream on every session while a master holding sessions dies.
        for c in clients:
            await c.user(MESSAGE)
        await asyncio.gather(*(c.until(lambda e: isinstance(e, Respond)) for c in clients))
        key = f"rtgw:{{{clients[0].sid}}}:log"
        victim = cluster.master_of(key)
        victim.kill()
        # Durability replicated: the promoted replica's sessions wait until it
        # has a replica again (issue 29); the killed node comes back as one.
        await asyncio.to_thread(
            wait_until, lambda: cluster.master_of(key) is not victim, "failover"
        )
        await asyncio.to_thread(victim.start)
        await asyncio.gather(*(c.until(lambda e: isinstance(e, Metric), 60) for c in clients))
        await asyncio.to_thread(
            wait_until, lambda: cluster.master_of("x") is not None, "the cluster answers"
        )
        for c in clients:
            assert _answer(c.events) == f"Echo: {MESSAGE}"

        # Every session runs another turn, seqs contiguous, replay equals what was received.
        again = await asyncio.gather(*(c.turn("after the failover", 60) for c in clients))
        for c, events in zip(clients, again, strict=True):
            assert text_of(events, "respond") == "Echo: after the failover"
            assert_contiguous(c.events)
        for i, c in enumerate(clients):
            assert await _replay(nodes[i % 2], c) == logged(c.events)
        for c in clients:
            await c.close()
    except BaseException:
        for node in nodes:  # what the nodes saw, for the failure report
            print(f"--- {node.args[-1]} log ---\n{node.log}")
        raise
    finally:
        for node in nodes:
            node.kill()


async def test_two_nodes_on_sentinel_run_a_turn_across_a_primary_failover(
    start_sim: SimFactory, sentinel: SentinelRedis, tmp_path: Path
) -> None:
    sim = start_sim("--tokens-per-second", "50")
    a, b = (_node(sim, f"node-{n}", sentinel.url, tmp_path / "ws") for n in "ab")
    try:
        client = await GatewayClient.connect(a.url)
        await client.turn("before the failover")
        old = sentinel.master_port()
        sentinel.by_port(old).kill()
        await asyncio.to_thread(
            wait_until, lambda: sentinel.failed_over_from(old), "a sentinel promotes the replica"
        )
        # Durability replicated: the new primary's sessions wait until it has a
        # replica again (issue 29); the killed node comes back as one.
        await asyncio.to_thread(sentinel.by_port(old).start, replica_of=sentinel.master_port())
        await client.close()
        moved = await _connect_when_ready(b, session_id=client.sid, after=client.last_seq)
        moved.events[:0] = client.events
        events = await moved.turn("after the failover", 60)
        assert text_of(events, "respond") == "Echo: after the failover"
        assert_contiguous(moved.events)
        assert await _replay(a, moved) == logged(moved.events)
        await moved.close()
    finally:
        a.kill()
        b.kill()
