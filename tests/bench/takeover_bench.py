"""Forwarded commands and takeovers when Redis is a real network away (issue 33).

Run: ``.venv/bin/python tests/bench/takeover_bench.py [--redis-rtts 0,0.5,1,2] [--repeats 5]
[--lease-ttl 2] [--forwards 10]``

Two ``gateway serve`` nodes, A and B, share one Redis through a
``tests.support.netem`` proxy (every node's Redis link has the RTT under
test, so the pub/sub that carries commands between nodes crosses it twice:
B → Redis → A) and one simulator (paced at ``--rate`` chunks/s). The RTTs are
interleaved: repeat *k* measures every RTT before repeat *k* + 1, the link's
RTT changed live between them.

1. **Forwarded command.** A session is driven by A (a client stays attached
   there); a second client follows it through B. Turn by turn, alternately,
   the client on A sends a message (*direct*) and the client on B does
   (*forwarded*: B publishes it to A, A logs the ``user`` event, B's
   follower reads it from the log). Per turn: send → the ``user`` event back
   at the sender (the command taken and logged), and send → the turn's first
   content chunk at the sender. *Added* is forwarded − direct (medians).

2. **Takeover after ``kill -9``.** A fresh node A drives a session; a client
   follows it through B. The lease's remaining time is read from Redis (not
   through the proxy), then A is killed with SIGKILL:

   - *idle*: right after the kill the client on B sends a message; B holds
     it until the lease expires, takes the session over and runs it;
   - *mid-turn*: A was streaming a turn to both clients; B's follower sees
     the lease free, takes over, emits ``interrupt`` and reruns the turn.

   Reported from the lease's expiry (kill time + its remaining TTL, what no
   network can shorten): to the first event B's client gets from the new
   driver (``user`` / ``interrupt``) and to the first content chunk. The
   expiry itself comes ``lease_ttl`` × (2/3 … 1) after the kill (renewals
   every ``lease_ttl / 3``).

Every figure is a median over the repeats (p90 beside it); nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import benchlib as B
import orjson
import redis
from websockets.asyncio.client import ClientConnection, connect

from tests.support.netem import Link, NetemProcess

CONTENT = frozenset({"think", "respond"})


class Client:
    """A client connection whose events are read (and timed) as they come."""

    def __init__(self, ws: ClientConnection, session: dict[str, Any]) -> None:
        self.ws = ws
        self.sid: str = session["session_id"]
        self.last_seq: int = session["seq"]
        self.queue: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, sid: str | None = None, after: int | None = None) -> Client:
        query = f"?session_id={sid}&after={after}" if sid is not None else ""
        ws = await connect(url + query, max_size=None, compression=None, open_timeout=30)
        session = orjson.loads(await ws.recv())
        return cls(ws, session)

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            async for frame in self.ws:
                t = time.perf_counter()
                event = orjson.loads(frame)
                self.last_seq = event.get("seq", self.last_seq)
                self.queue.put_nowait((t, event))

    async def user(self, text: str) -> float:
        t = time.perf_counter()
        await self.ws.send(orjson.dumps({"type": "user", "content": text}).decode())
        return t

    async def until(self, kinds: set[str] | frozenset[str], timeout: float = 60) -> float:
        """The arrival time of the next event of one of ``kinds`` (skipping others)."""
        async with asyncio.timeout(timeout):
            while True:
                t, event = await self.queue.get()
                if event["type"] in kinds:
                    return t

    async def turn_done(self, timeout: float = 60) -> None:
        await self.until({"end"}, timeout)
        await self.until({"metric"}, timeout)

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(Exception):
            await self.ws.close()


@dataclass
class Figures:
    samples: dict[tuple[str, float], list[float]] = field(default_factory=dict)

    def add(self, name: str, rtt: float, seconds: float) -> None:
        self.samples.setdefault((name, rtt), []).append(seconds * 1000)

    def get(self, name: str, rtt: float) -> list[float]:
        return self.samples.get((name, rtt), [])


def node(sim_url: str, redis_url: str, name: str, lease_ttl: float) -> B.Proc:
    proc = B.gateway_proc(sim_url, redis_url)
    proc.args += ["--node-id", name, "--lease-ttl", str(lease_ttl)]
    return proc


async def forwarded(
    a: B.Proc, b: B.Proc, rtt: float, figures: Figures, args: argparse.Namespace
) -> None:
    on_a = await Client.connect(a.url)
    await on_a.user("warm up")
    await on_a.turn_done()
    on_b = await Client.connect(b.url, on_a.sid, on_a.last_seq)
    try:
        for i in range(args.forwards):
            for name, sender, other in (("direct", on_a, on_b), ("forwarded", on_b, on_a)):
                sent = await sender.user(f"message {i}")
                logged = await sender.until({"user"})
                first = await sender.until(CONTENT)
                figures.add(f"{name} → user event", rtt, logged - sent)
                figures.add(f"{name} → first chunk", rtt, first - sent)
                await sender.turn_done()
                await other.turn_done()
    finally:
        await on_a.close()
        await on_b.close()


def lease_expiry(direct: redis.Redis, sid: str) -> float:
    """When the session's lease expires, on this process's perf_counter clock."""
    t = time.perf_counter()
    pttl = int(direct.pttl(f"rtgw:{{{sid}}}:lease"))
    return t + max(pttl, 0) / 1000


async def takeover(
    mode: str,
    a: B.Proc,
    b: B.Proc,
    direct: redis.Redis,
    rtt: float,
    figures: Figures,
) -> None:
    on_a = await Client.connect(a.url)
    await on_a.user("warm up")
    await on_a.turn_done()
    on_b = await Client.connect(b.url, on_a.sid, on_a.last_seq)
    try:
        if mode == "mid-turn":
            await on_a.user("a turn that is cut by the crash " * 3)
            await on_b.until(CONTENT)
        expires = lease_expiry(direct, on_a.sid)
        killed = time.perf_counter()
        assert a.proc is not None
        a.proc.kill()
        if mode == "idle":
            await on_b.user("after the crash")
            first_event = await on_b.until({"user"})
        else:
            first_event = await on_b.until({"interrupt"})
        first_chunk = await on_b.until(CONTENT)
        await on_b.turn_done()
        figures.add(f"{mode}: kill → lease expiry", rtt, expires - killed)
        figures.add(f"{mode}: expiry → first event", rtt, first_event - expires)
        figures.add(f"{mode}: expiry → first chunk", rtt, first_chunk - expires)
    finally:
        await on_a.close()
        await on_b.close()
        a.proc.wait(10) if a.proc is not None else None


def summary(figures: Figures, rtts: list[float]) -> str:
    names = list(dict.fromkeys(name for name, _ in figures.samples))
    headers = ["figure (ms)"] + [f"RTT {r:g} ms p50 / p90" for r in rtts]
    rows: list[list[object]] = []
    for name in names:
        row: list[object] = [name]
        for rtt in rtts:
            got = sorted(figures.get(name, rtt))
            if not got:
                row.append("-")
                continue
            p90 = got[min(len(got) - 1, int(len(got) * 0.9))]
            row.append(f"{statistics.median(got):8.1f} / {p90:8.1f}")
        rows.append(row)
    for kind in ("user event", "first chunk"):
        row = [f"forwarded − direct → {kind}"]
        for rtt in rtts:
            fwd, dct = figures.get(f"forwarded → {kind}", rtt), figures.get(f"direct → {kind}", rtt)
            row.append(
                f"{statistics.median(fwd) - statistics.median(dct):8.1f}" if fwd and dct else "-"
            )
        rows.append(row)
    return B.table(headers, rows)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-rtts", default="0,0.5,1,2", help="ms, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--forwards", type=int, default=10, help="turns of each kind per repeat")
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--rate", type=float, default=50.0, help="the simulator's chunks/s")
    parser.add_argument("--modes", default="forward,idle,mid-turn")
    args = parser.parse_args()
    rtts = [float(r) for r in args.redis_rtts.split(",")]
    modes = args.modes.split(",")
    figures = Figures()
    B.raise_nofile()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = stack.enter_context(B.redis_server(tmp / "redis"))
        netem = stack.enter_context(NetemProcess())
        port = netem.add("redis", ("127.0.0.1", server.port), Link())
        redis_url = f"redis://127.0.0.1:{port}/0"
        sim = stack.enter_context(B.sim_proc(tokens_per_second=args.rate))
        direct = redis.Redis(host="127.0.0.1", port=server.port)
        b = stack.enter_context(node(sim.url, redis_url, "b", args.lease_ttl))
        serial = 0
        for repeat in range(args.repeats):
            for rtt in rtts[repeat % len(rtts) :] + rtts[: repeat % len(rtts)]:
                netem.set_link("redis", Link(rtt=rtt / 1000, jitter=rtt / 1000 / 2 * 0.1))
                for mode in modes:
                    serial += 1
                    a = node(sim.url, redis_url, f"a{serial}", args.lease_ttl).start()
                    try:
                        if mode == "forward":
                            await forwarded(a, b, rtt, figures, args)
                        else:
                            await takeover(mode, a, b, direct, rtt, figures)
                    finally:
                        a.stop()
                print(f"  repeat {repeat + 1}, RTT {rtt:g} ms done", file=sys.stderr, flush=True)
        direct.close()
    print(
        f"\nforwarded commands and takeovers, Redis RTT {', '.join(map(str, rtts))} ms "
        f"(netem proxy), lease_ttl {args.lease_ttl:g} s, {args.repeats} repeats interleaved, "
        f"simulator at {args.rate:g} chunks/s"
    )
    print(summary(figures, rtts))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
