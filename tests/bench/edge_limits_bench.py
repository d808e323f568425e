"""Issue 29's probes, on a real node: what one client sends costs the node and Redis this much.

Run: ``.venv/bin/python tests/bench/edge_limits_bench.py [--events 300] [--slow 1100] [--minted 200]``

One ``gateway serve`` process (default settings, Redis store, HTTP API on,
no keys: loopback) and a real ``redis-server``; ``StallProbe`` watches
``/healthz`` and another tenant's turns during each probe.

1. *Export*: one session gets ``--events`` ``configured`` events of
   ``--event-kb`` KB each (``configure`` frames with a large client-tool
   schema); then the transcript is exported with ``?limit=300`` page after
   page. Reports the pages (events, bytes), the node's RSS growth (sampled
   every 5 ms) and the slowest ``/healthz``. Main: one 251 MB page, +845 MB.
2. *Slow connections*: ``--slow`` connections from 11 addresses to both
   ports each send half a request line and stall. Reports the node's
   descriptors, the slowest ``/healthz``, a new WebSocket handshake and turn
   meanwhile, and when the node had closed them all. Main: held 45 s+, out of
   descriptors at ~1,030.
3. *Minted sessions*: ``--minted`` ``POST /v1/sessions`` with ``--config-kb``
   KB configurations, never connected to. Reports how many were made and
   refused, Redis' memory growth and the TTL of an unused session. Main:
   all made, +212 MB, each kept 86,397 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import orjson
import redis

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.edge.conftest import poll_until  # noqa: E402
from tests.support.client import GatewayClient, text_of  # noqa: E402
from tests.support.procs import NodeProcess  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.stall import StallProbe  # noqa: E402

MB = 1_000_000


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class PeakRss:
    """The highest RSS of a process while the block runs (sampled every 5 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = rss(pid)
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss(self.pid))


def configure(size: int) -> dict[str, object]:
    schema = {"type": "object", "description": "x" * size}
    return {"type": "configure", "tools": [{"name": "big", "parameters": schema}]}


async def export_probe(node: NodeProcess, api: str, events: int, event_kb: int) -> None:
    client = await GatewayClient.connect(node.url)
    for _ in range(events):
        await client.send(configure(event_kb * 1000))
        await client.until_type("configured", timeout=30)
    sid = client.sid
    await client.close()
    assert node.proc is not None
    pages: list[tuple[int, int]] = []
    with StallProbe(node.http, interval=0.02) as probe, PeakRss(node.proc.pid) as peak:
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            after, more = 0, True
            while more:
                async with http.get(f"{api}/v1/sessions/{sid}/events?after={after}&limit=300") as r:
                    raw = await r.read()
                page = orjson.loads(raw)
                pages.append((len(page["events"]), len(raw)))
                after, more = page["next_after"], page["has_more"]
        elapsed = time.monotonic() - started
    sizes = sorted(b for _, b in pages)
    print(f"export: {events} events of {event_kb} KB in {len(pages)} pages, {elapsed:.1f} s")
    print(
        f"  page events {min(n for n, _ in pages)}-{max(n for n, _ in pages)}, "
        f"bytes {sizes[0] / MB:.2f}-{sizes[-1] / MB:.2f} MB; "
        f"node RSS {peak.before / MB:.0f} MB, peak +{(peak.peak - peak.before) / MB:.1f} MB"
    )
    print(f"  {probe.summary()}")


def stall(port: int, source: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.sendall(b"GET /v1/realtime HT")
    return sock


def descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


async def slow_probe(node: NodeProcess, api_port: int, count: int) -> None:
    assert node.proc is not None
    ws_port = int(node.base.rsplit(":", 1)[1])
    sources = [f"127.0.0.{n}" for n in range(10, 21)]
    with StallProbe(node.http, node.url, interval=0.05) as probe:
        started = time.monotonic()
        socks = [stall((ws_port, api_port)[i % 2], sources[i % len(sources)]) for i in range(count)]
        opened = time.monotonic() - started
        pid = node.proc.pid
        await poll_until(lambda: descriptors(pid) >= count, "the node accepts them all")
        held = descriptors(node.proc.pid)
        t0 = time.monotonic()
        client = await GatewayClient.connect(node.url, open_timeout=10)
        handshake = time.monotonic() - t0
        turn = text_of(await client.turn("hello", timeout=20), "respond")
        turn_s = time.monotonic() - t0
        await client.close()
        for sock in socks:
            sock.settimeout(30)
            with contextlib.suppress(OSError):
                sock.recv(1)  # b"" or a reset: closed by the node
        closed_after = time.monotonic() - started
        for sock in socks:
            sock.close()
    print(f"slow connections: {count} opened in {opened:.1f} s; the node held {held} descriptors")
    print(
        f"  new handshake {handshake * 1000:.0f} ms, turn done {turn_s * 1000:.0f} ms "
        f"({'ok' if 'Echo: hello' in turn else 'WRONG'}); all closed by the node "
        f"{closed_after:.1f} s after the first was opened"
    )
    print(f"  {probe.summary()}")


async def minted_probe(api: str, redis_url: str, count: int, config_kb: int) -> None:
    raw = redis.Redis.from_url(redis_url)
    before = int(raw.info("memory")["used_memory"])
    body = orjson.dumps(
        {
            "tools": [
                {
                    "name": "big",
                    "parameters": {"type": "object", "description": "x" * (config_kb * 1000)},
                }
            ]
        }
    )
    statuses: dict[int, int] = {}
    first_sid = ""
    message = ""
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        for _ in range(count):
            async with http.post(
                f"{api}/v1/sessions", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                statuses[r.status] = statuses.get(r.status, 0) + 1
                answer = await r.json()
                if r.status == 201 and not first_sid:
                    first_sid = answer["session_id"]
                elif r.status != 201 and not message:
                    message = answer["error"]["message"]
    elapsed = time.monotonic() - started
    after = int(raw.info("memory")["used_memory"])
    ttl = raw.ttl(f"rtgw:{{{first_sid}}}:meta")
    raw.close()
    print(
        f"minted: {count} sessions of {config_kb} KB in {elapsed:.1f} s: {statuses}; "
        f"Redis +{(after - before) / MB:.0f} MB; an unused one's TTL {ttl} s"
    )
    if message:
        print(f"  refusal: {message}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--event-kb", type=int, default=840)
    parser.add_argument("--slow", type=int, default=1100)
    parser.add_argument("--minted", type=int, default=200)
    parser.add_argument("--config-kb", type=int, default=1000)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # what the node starts with
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "redis").mkdir()
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        node = NodeProcess(
            ["serve", "--port", "0", "--api-port", "0", "--redis", server.url],
            env={"REDIS_URL": ""},
        )
        try:
            node.start()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        try:
            found = re.search(r"HTTP API:\s+(http://[^/\s]+)/", node.log)
            assert found, node.log
            api = found.group(1)
            limit_line = next(line for line in node.output if "nofile" in line)
            print(f"node: {limit_line.strip().split(': ', 1)[-1]}")
            await export_probe(node, api, args.events, args.event_kb)
            await slow_probe(node, int(api.rsplit(":", 1)[1]), args.slow)
            await minted_probe(api, server.url, args.minted, args.config_kb)
        finally:
            node.kill()
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
