"""Real processes: one redis-server, one slowed simulator, gateway nodes.

Nodes are `gateway serve` subprocesses sharing the Redis and the simulator,
as they would behind a load balancer; tests kill, drain and restart them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.procs import NodeProcess
from tests.support.redis_server import RedisServer

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this directory slow (``pytestmark`` in a conftest marks nothing).

    The hook sees the whole session's items, so it marks only those under this directory.
    """
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.slow)


LEASE_TTL = 2.0


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server with an append-only file, so a restart keeps the data."""
    server = RedisServer(tmp_path / "redis", durable=True)
    server.start()
    yield server
    server.stop()


SimFactory = Callable[..., NodeProcess]
NodeFactory = Callable[..., NodeProcess]


@pytest.fixture
def start_sim() -> Iterator[SimFactory]:
    procs: list[NodeProcess] = []

    def start(*args: str) -> NodeProcess:
        proc = NodeProcess(["sim", "--port", "0", *args]).start()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture
def start_node(durable_redis: RedisServer, tmp_path: Path) -> Iterator[NodeFactory]:
    procs: list[NodeProcess] = []

    def start(sim: NodeProcess, name: str, *args: str, provider: str = "openai") -> NodeProcess:
        """A node on ``sim``, whose flavour ``provider`` names (openai or gemini)."""
        base = sim.url.removesuffix("/realtime") if provider == "openai" else sim.base
        proc = NodeProcess(
            [
                "serve",
                "--port",
                "0",
                "--provider",
                provider,
                f"--{provider}-base-url",
                base,
                "--redis",
                durable_redis.url,
                "--node-id",
                name,
                "--lease-ttl",
                str(LEASE_TTL),
                "--workspace-root",
                str(tmp_path / "workspaces"),
                *args,
            ],
            env={"OPENAI_API_KEY": "sim-key", "GEMINI_API_KEY": "sim-key"},
        ).start()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
