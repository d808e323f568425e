"""Workspaces on a root that nodes of several stores share, with real node processes (issue 29).

A second node on the same machine with another store used to remove the live
sessions' workspaces of the first at its start (its store did not know
them); a ``DELETE`` during another node's turn, right after a Redis restart,
left the workspace that turn wrote again on disk with no sweep to remove it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from gateway.sessions.workspaces import NAMESPACE_KEY
from protocol.events import Result
from tests.multinode.conftest import NodeFactory, SimFactory
from tests.support.client import GatewayClient
from tests.support.procs import NodeProcess
from tests.support.redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(90)

# Waits here are for other processes' files and sweeps: nothing to await but the disk.
POLL = 0.02


async def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(POLL)


def one(pattern: str, root: Path) -> Path:
    found = list(root.glob(pattern))
    assert len(found) == 1, (pattern, sorted(p.relative_to(root) for p in root.rglob("*")))
    return found[0]


@pytest.fixture
def other_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis-other")
    server.start()
    yield server
    server.stop()


async def test_nodes_of_other_stores_on_one_root_keep_each_others_workspaces(
    start_sim: SimFactory, durable_redis: RedisServer, other_redis: RedisServer, tmp_path: Path
) -> None:
    sim = start_sim()
    root = tmp_path / "workspaces"
    nodes: list[NodeProcess] = []

    def node(name: str, *store: str) -> NodeProcess:
        """A node on the default store (memory), or on ``--redis URL``; one root for all."""
        proc = NodeProcess(
            [
                "serve",
                "--port",
                "0",
                "--openai-base-url",
                sim.url.removesuffix("/realtime"),
                "--node-id",
                name,
                "--workspace-root",
                str(root),
                *store,
            ],
            env={"OPENAI_API_KEY": "sim-key", "REDIS_URL": ""},
        )
        nodes.append(proc)
        return proc.start()

    async def write(proc: NodeProcess, text: str) -> tuple[str, int]:
        client = await GatewayClient.connect(proc.url)
        args = json.dumps({"path": "a.txt", "content": text})
        events = await client.turn(f"/tool write {args}")
        assert any(isinstance(e, Result) for e in events), events
        await client.close()
        return client.sid, client.last_seq

    try:
        on_redis = node("on-redis", "--redis", durable_redis.url)
        in_memory = node("in-memory")
        redis_sid, redis_seq = await write(on_redis, "kept in redis")
        memory_sid, _ = await write(in_memory, "kept in memory")
        redis_file = one(f"store.*/{redis_sid}/a.txt", root)
        memory_file = one(f"memory.*/{memory_sid}/a.txt", root)

        # A second memory node starts on the same root: its start sweep removes only
        # what is nobody's (a workspace from before namespaces, untouched for a day).
        legacy = root / secrets.token_urlsafe(18)
        legacy.mkdir()
        two_days_ago = time.time() - 2 * 86400
        os.utime(legacy, (two_days_ago, two_days_ago))
        second_memory = node("second-memory")
        second_memory.wait_for_lines(rf"removed 1 workspace\(s\).*{legacy.name}")
        assert redis_file.read_text() == "kept in redis"
        assert memory_file.read_text() == "kept in memory"

        # The first memory node dies: its sessions died with it, and a node of yet
        # another store (a second Redis) reclaims their workspaces at its start.
        in_memory.kill()
        other = node("on-other-redis", "--redis", other_redis.url)
        dead = memory_file.parents[1].name
        other.wait_for_lines(rf"removed 1 workspace\(s\).*{dead}")
        assert not memory_file.exists()
        assert redis_file.read_text() == "kept in redis"
        assert len(list(root.glob("memory.*/"))) == 1  # the live second memory node's
        identities = {
            redis.Redis.from_url(server.url).get(f"rtgw:secret:{NAMESPACE_KEY}")
            for server in (durable_redis, other_redis)
        }
        assert len(identities) == 2 and None not in identities  # one namespace per Redis

        # The first Redis's session goes on with its files.
        client = await GatewayClient.connect(on_redis.url, session_id=redis_sid, after=redis_seq)
        events = await client.turn('/tool read {"path": "a.txt"}')
        result = next(e for e in events if isinstance(e, Result))
        assert "kept in redis" in result.content
        await client.close()
    finally:
        for proc in nodes:
            proc.kill()


def delete(api: str, sid: str) -> int:
    request = urllib.request.Request(f"{api}/v1/sessions/{sid}", method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_a_delete_that_raced_a_redis_restart_is_finished_by_the_next_sweep(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer, tmp_path: Path
) -> None:
    sim = start_sim()
    api_port = free_port()
    sweeps = ("--workspace-sweep-every", "1")
    driver = start_node(sim, "node-a", "--enable-shell", *sweeps)
    other = start_node(sim, "node-b", "--api-port", str(api_port), *sweeps)
    started, go, done = tmp_path / "started", tmp_path / "go", tmp_path / "done"
    # A tool of the turn still writes into its workspace after the delete.
    command = (
        f'touch "{started}"; while [ ! -e "{go}" ]; do sleep 0.05; done; '
        f'mkdir -p "$HOME" && echo late > "$HOME/late.txt" && touch "{done}"'
    )
    client = await GatewayClient.connect(driver.url)
    await client.user("/tool shell " + json.dumps({"command": command}))
    await until(started.exists, "the shell tool runs on node-a")
    workspace = one(f"workspaces/store.*/{client.sid}", tmp_path)

    # node-a misses the Deleted message: its subscription is down while Redis restarts.
    assert driver.proc is not None
    os.kill(driver.proc.pid, signal.SIGSTOP)
    try:
        durable_redis.restart()
        api = f"http://127.0.0.1:{api_port}"
        status = 503
        for _ in range(20):  # node-b's first command after the restart may find it down
            status = await asyncio.to_thread(delete, api, client.sid)
            if status != 503:
                break
            await asyncio.sleep(0.25)
        assert status == 204, other.log
        go.touch()
        await until(done.exists, "the racing tool wrote its workspace again")
    finally:
        os.kill(driver.proc.pid, signal.SIGCONT)
    await until(
        lambda: not workspace.exists(),
        f"a sweep removes the deleted session's workspace:\n{other.log}\n{driver.log}",
    )
    await client.close()
