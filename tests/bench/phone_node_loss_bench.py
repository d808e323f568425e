"""Calls and node loss, measured: a drain keeps calls, a dead node ends them, sessions stay.

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/phone_node_loss_bench.py [--rounds R]``

Two ``gateway serve`` nodes (the in-process simulator, Twilio's auth token
set, ``--lease-ttl 2``) on one ``redis-server``; this process is the carrier
(``SimulatedCall``, speech made with espeak-ng). Each round:

1. **SIGTERM during a call** (``--drain-phone-timeout`` 600): the node goes
   on serving it. Printed: the answer's latency to an utterance said after
   the SIGTERM, the caller's hang-up → the process's exit.
2. **SIGTERM, the call goes on past ``--drain-phone-timeout 2``**: SIGTERM →
   the carrier's socket closed by the node (1001).
3. **kill -9 during a call**: kill → the carrier sees the socket die; kill →
   the session's events readable through the other node's HTTP API (the
   caller's turn up to the kill); kill → a call back into the
   session (a stream token for it, through the other node) answered
   (the dead node's lease must expire first: ``--lease-ttl``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from gateway.client.carrier import CallSetup, SimulatedCall
from tests.support.carrier import AUTH_TOKEN, espeak
from tests.support.procs import NodeProcess
from tests.support.redis_server import RedisServer, free_port

LEASE_TTL = 2.0


class Node:
    def __init__(self, redis_url: str, name: str, workdir: Path, *extra: str) -> None:
        self.api_port = free_port()
        self.proc = NodeProcess(
            [
                "serve",
                "--port",
                "0",
                "--api-port",
                str(self.api_port),
                "--redis",
                redis_url,
                "--node-id",
                name,
                "--lease-ttl",
                str(LEASE_TTL),
                "--workspace-root",
                str(workdir / "workspaces"),
                "--sim-tokens-per-second",
                "100",
                *extra,
            ],
            env={"GATEWAY_PHONE_TWILIO_AUTH_TOKEN": AUTH_TOKEN},
        ).start()
        self.api = f"http://127.0.0.1:{self.api_port}"

    def call(self, **parameters: str) -> SimulatedCall:
        url = f"{self.proc.base}/v1/phone/twilio"
        return SimulatedCall(
            CallSetup(
                url=url,
                auth_token=AUTH_TOKEN,
                parameters=parameters,
                webhook_url=f"{self.api}/v1/phone/twilio/voice",
            )
        )

    def sid(self) -> str:
        self.proc.wait_for_lines(r"\(twilio\) on session")
        line = [x for x in self.proc.output if "(twilio) on session" in x][-1]
        return line.split("on session ")[1].split()[0]

    def request(self, path: str, body: Any = None) -> Any:
        data = None if body is None else msgspec.json.encode(body)
        request = urllib.request.Request(
            self.api + path, data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return msgspec.json.decode(response.read())


async def drain_keeps_the_call(redis: str, workdir: Path) -> tuple[float, float]:
    node = Node(redis, "drain-a", workdir)
    try:
        call = node.call()
        await call.dial()
        await asyncio.to_thread(node.sid)
        node.proc.terminate()
        await asyncio.to_thread(node.proc.wait_for_lines, "draining: 1 phone calls")
        await call.say(espeak("Are you still there?"))
        answer = await call.answered()
        await call.heard_all()
        hung_up = time.monotonic()
        await call.hang_up()
        await asyncio.to_thread(node.proc.wait, 30)
        return answer, time.monotonic() - hung_up
    finally:
        node.proc.kill()


async def drain_timeout_ends_the_call(redis: str, workdir: Path) -> float:
    node = Node(redis, "drain-b", workdir, "--drain-phone-timeout", "2")
    try:
        call = node.call()
        await call.dial()
        await asyncio.to_thread(node.sid)
        start = time.monotonic()
        node.proc.terminate()
        await call.wait_closed(30)
        assert call.closed is not None and call.closed[0] == 1001, call.closed
        return time.monotonic() - start
    finally:
        node.proc.kill()


async def death_ends_the_call(redis: str, workdir: Path) -> tuple[float, float, float]:
    a = Node(redis, "dead-a", workdir)
    b = Node(redis, "dead-b", workdir)
    try:
        call = a.call()
        await call.dial()
        sid = await asyncio.to_thread(a.sid)
        await call.say(espeak("Hello, I am calling about my order."))
        await call.answered()
        killed = time.monotonic()
        a.proc.proc.kill()  # type: ignore[union-attr]
        await call.wait_closed(30)
        closed = time.monotonic() - killed
        async with asyncio.timeout(30):
            while True:  # the caller's turn (the answer's text may have died with the node)
                try:
                    page = await asyncio.to_thread(b.request, f"/v1/sessions/{sid}/events")
                except urllib.error.URLError:
                    page = {"events": []}
                if any(e["type"] == "speech_stopped" for e in page["events"]):
                    break
                await asyncio.sleep(0.005)
        readable = time.monotonic() - killed
        minted = await asyncio.to_thread(b.request, "/v1/phone/tokens", {"session_id": sid})
        back = b.call(token=minted["stream_token"])
        await back.dial()
        await back.say(espeak("Hello again."))
        await back.answered()
        answered = time.monotonic() - killed
        await back.hang_up()
        return closed, readable, answered
    finally:
        a.proc.kill()
        b.proc.kill()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        redis = RedisServer(workdir / "redis")
        redis.start()
        try:
            drains, exits, timeouts, closes, reads, backs = [], [], [], [], [], []
            for round_ in range(1, ns.rounds + 1):
                answer, exit_after = await drain_keeps_the_call(redis.url, workdir)
                cut = await drain_timeout_ends_the_call(redis.url, workdir)
                closed, readable, back = await death_ends_the_call(redis.url, workdir)
                drains.append(answer)
                exits.append(exit_after)
                timeouts.append(cut)
                closes.append(closed)
                reads.append(readable)
                backs.append(back)
                print(
                    f"round {round_}: drain: answer after SIGTERM {answer * 1000:.0f} ms, "
                    f"hang-up → exit {exit_after * 1000:.0f} ms; drain timeout 2 s: SIGTERM → "
                    f"call closed {cut:.2f} s; kill -9: → socket closed {closed * 1000:.0f} ms, "
                    f"→ session readable elsewhere {readable * 1000:.0f} ms, → call back "
                    f"answered {back:.2f} s"
                )
            med = statistics.median
            print(
                f"median of {ns.rounds}: answer while draining {med(drains) * 1000:.0f} ms; "
                f"hang-up → exit {med(exits) * 1000:.0f} ms; drain timeout 2 s → closed "
                f"{med(timeouts):.2f} s; kill → closed {med(closes) * 1000:.0f} ms, readable "
                f"{med(reads) * 1000:.0f} ms, call back answered {med(backs):.2f} s "
                f"(lease {LEASE_TTL:g} s)"
            )
        finally:
            redis.stop()


if __name__ == "__main__":
    asyncio.run(main())
