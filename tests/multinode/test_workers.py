"""`gateway serve --workers N`: several processes, one port, sessions shared via Redis."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request

from tests.support.client import GatewayClient, text_of
from tests.support.procs import NodeProcess
from tests.support.redis_server import RedisServer, free_port


async def test_workers_share_the_port_and_the_sessions(durable_redis: RedisServer) -> None:
    port = free_port()
    args = ["serve", "--port", str(port), "--workers", "2", "--redis", durable_redis.url]
    node = NodeProcess([*args, "--node-id", "box"]).start()
    try:
        await asyncio.to_thread(node.wait_for_lines, "gateway listening on", 2)
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        clients = [await GatewayClient.connect(url) for _ in range(24)]
        # The kernel spreads connections over both workers (each its own node).
        assert {c.session.node for c in clients} == {"box-w0", "box-w1"}
        answers = await asyncio.gather(*(c.turn(f"hi {i}") for i, c in enumerate(clients)))
        for i, events in enumerate(answers):
            assert text_of(events, "respond") == f"Echo: hi {i}"
        # Any worker serves any session: resume each on whichever worker accepts it.
        for c in clients:
            await c.close()
        for c in clients[:6]:
            again = await GatewayClient.connect(url, session_id=c.sid, after=c.last_seq)
            events = await again.turn("more")
            assert text_of(events, "respond") == "Echo: more"
            await again.close()
    finally:
        node.terminate()
        assert node.wait(30) == 0, node.log


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def _series(text: str, name: str) -> float:
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == name:
            return float(value)
    return 0.0


async def test_metrics_of_every_worker_on_any_scrape(durable_redis: RedisServer) -> None:
    """Whichever worker answers /metrics, it reports the turns and connections of all."""
    port = free_port()
    args = ["serve", "--port", str(port), "--workers", "2", "--redis", durable_redis.url]
    node = NodeProcess(args).start()
    try:
        await asyncio.to_thread(node.wait_for_lines, "gateway listening on", 2)
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        clients = [await GatewayClient.connect(url) for _ in range(16)]
        assert len({c.session.node for c in clients}) == 2  # both workers serve some
        await asyncio.gather(*(c.turn(f"hi {i}") for i, c in enumerate(clients)))
        # Each scrape is a new connection, so the kernel spreads them too.
        scrapes = [await asyncio.to_thread(_scrape, port) for _ in range(6)]
        for text in scrapes:
            assert _series(text, "rtgw_turns_total") == 16
            assert _series(text, "rtgw_connections") == 16
        for c in clients:
            await c.close()
    finally:
        node.terminate()
        assert node.wait(30) == 0, node.log


def test_workers_need_a_shared_store() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "8765", "--workers", "2"],
        env={**os.environ, "REDIS_URL": ""},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "REDIS_URL" in out.stderr


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


async def test_a_crashed_worker_is_restarted(durable_redis: RedisServer) -> None:
    port = free_port()
    node = NodeProcess(
        ["serve", "--port", str(port), "--workers", "2", "--redis", durable_redis.url]
    ).start()
    try:
        await asyncio.to_thread(node.wait_for_lines, "gateway listening on", 2)
        assert node.proc is not None
        workers = _children(node.proc.pid)
        assert len(workers) == 2
        os.kill(workers[0], 9)
        await asyncio.to_thread(node.wait_for_lines, "gateway listening on", 3)
        assert len(_children(node.proc.pid)) == 2
        client = await GatewayClient.connect(f"ws://127.0.0.1:{port}/v1/realtime")
        assert text_of(await client.turn("still here"), "respond") == "Echo: still here"
        await client.close()
    finally:
        node.terminate()
        assert node.wait(30) == 0, node.log
