"""Memory and CPU per idle connection and per idle session at 20,000 connections on one machine.

Run: ``.venv/bin/python tests/bench/idle_scale_bench.py [--connections 20000] [--workers 3]
[--sessions 18000] [--ramp 200] [--base-src DIR] [--repeats 1]``

This machine caps every process at 20,000 open files (the hard limit; no
``CAP_SYS_RESOURCE`` to lift it), and a gateway process reports itself not
ready from 90% of its limit on. So one machine serves 20,000 connections the
way the project runs a machine's cores: ``gateway serve --workers N``, N node
processes on one port (``SO_REUSEPORT``), and the clients come from several
processes (``idle_clients.py``), each under the limit. The simulator is one
process, so at most ``--sessions`` (18,000) of the connections run a turn.

Per tree (this checkout, and ``--base-src DIR`` when given, interleaved):

1. a fresh gateway (Redis store) is warmed up (20 sessions × 2 turns); the
   RSS of its processes (supervisor + workers, summed) is read;
2. ``--connections`` clients connect over ``--ramp`` seconds and send
   nothing; once all are open the RSS is read again, and the gateway's CPU
   over ``--window`` seconds of idleness (server keepalive pings, lease
   renewals): **per idle connection** (a WebSocket, its reader and writer,
   a session runtime; no upstream connection yet);
3. ``--sessions`` of them run one turn each (``--turn-rate`` a second),
   then all idle again: RSS and CPU again. **Per idle session** = per idle
   connection + (RSS after − RSS before the turns) / sessions: what a
   session that had a turn holds while it waits for the next one (its
   upstream WebSocket, its history, the turn machine's state).

Figures are medians over ``--repeats``; with ``--base-src``, the ratio
this ÷ base from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import benchlib as B

from gateway.client.loadtest import LoadTest, LoadTestConfig

SCALE_ENV = {"GATEWAY_MAX_CONNECTIONS": "0", "GATEWAY_UNAUTHENTICATED_PER_ADDRESS": "0"}
KIB = 1024


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [pid], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def tree_rss(pid: int) -> int:
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, RuntimeError):
            total += B.rss_bytes(p)
    return total


def tree_cpu(pid: int) -> float:
    total = 0.0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError):
            total += B.cpu_seconds(p)
    return total


class Clients:
    """One ``idle_clients.py`` process."""

    def __init__(self, url: str, n: int, ramp: float) -> None:
        self.n = n
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("idle_clients.py")),
                url,
                str(n),
                str(ramp),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=B.ROOT,
            env={**os.environ, "PYTHONPATH": str(B.ROOT)},
        )

    def wait_for(self, word: str) -> tuple[int, int]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            head, *counts = line.split()
            if head == word:
                return int(counts[0]), int(counts[1])
        raise RuntimeError(f"idle_clients exited ({self.proc.wait()}) before {word!r}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class Result:
    tree: str
    opened: int
    failed: int
    turned: int
    turn_failed: int
    per_connection_kib: float
    per_session_kib: float
    idle_cpu_conn: float  # cores per 10,000 idle connections
    idle_cpu_session: float  # cores per 10,000 idle sessions (after a turn)
    rss_mib: tuple[float, float, float]


async def measure(
    tree: str, src: Path | None, sim_url: str, redis_url: str, args: argparse.Namespace
) -> Result:
    port = B.free_port()
    gw = B.gateway_proc(sim_url, redis_url)
    gw.args[gw.args.index("--port") + 1] = str(port)  # the workers share a fixed port
    gw.args += ["--workers", str(args.workers)]
    gw.env.update(SCALE_ENV)
    if src is not None:
        gw.cwd = src
    gw.start(timeout=90)
    clients: list[Clients] = []
    try:
        report = await LoadTest(LoadTestConfig(url=gw.url, sessions=20, turns=2)).run()
        if not report.ok:
            raise RuntimeError(f"warm-up failed: {report.errors}")
        await asyncio.sleep(2.0)
        rss0 = tree_rss(gw.pid)
        per_proc = -(-args.connections // args.client_procs)
        for i in range(args.client_procs):
            n = min(per_proc, args.connections - i * per_proc)
            clients.append(Clients(gw.url, n, args.ramp))
        opened = failed = 0
        for c in clients:
            ok, bad = await asyncio.to_thread(c.wait_for, "ready")
            opened += ok
            failed += bad
        await asyncio.sleep(3.0)
        rss1 = tree_rss(gw.pid)
        cpu_a = tree_cpu(gw.pid)
        await asyncio.sleep(args.window)
        idle_cpu_conn = (tree_cpu(gw.pid) - cpu_a) / args.window
        # Turns on the first --sessions connections (each client process its share).
        share = -(-args.sessions // args.client_procs)
        turned = turn_failed = 0
        rate = args.turn_rate / args.client_procs
        for c in clients:
            c.send(f"turn {rate} {share}")
        for c in clients:
            ok, bad = await asyncio.to_thread(c.wait_for, "turned")
            turned += ok
            turn_failed += bad
        await asyncio.sleep(3.0)
        rss2 = tree_rss(gw.pid)
        cpu_b = tree_cpu(gw.pid)
        await asyncio.sleep(args.window)
        idle_cpu_session = (tree_cpu(gw.pid) - cpu_b) / args.window
        per_conn = (rss1 - rss0) / max(opened, 1) / KIB
        per_session = per_conn + (rss2 - rss1) / max(turned, 1) / KIB
        return Result(
            tree,
            opened,
            failed,
            turned,
            turn_failed,
            per_conn,
            per_session,
            idle_cpu_conn / max(opened, 1) * 10_000,
            (idle_cpu_session - idle_cpu_conn) / max(turned, 1) * 10_000
            + idle_cpu_conn / max(opened, 1) * 10_000,
            (rss0 / 2**20, rss1 / 2**20, rss2 / 2**20),
        )
    finally:
        for c in clients:
            c.stop()
        gw.stop()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=18_000, help="of them, run a turn")
    parser.add_argument("--workers", type=int, default=3, help="gateway node processes")
    parser.add_argument("--client-procs", type=int, default=3)
    parser.add_argument("--ramp", type=float, default=200.0, help="seconds to open them all")
    parser.add_argument("--turn-rate", type=float, default=100.0, help="turns started per second")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of idle CPU measured")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--base-src", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    limit = B.raise_nofile()
    print(f"  open-file limit per process {limit:,}", file=sys.stderr)
    trees: list[tuple[str, Path | None]] = [("this", None)]
    if args.base_src is not None:
        trees.append(("base", args.base_src))
    results: list[Result] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        B.redis_server(Path(tmp)) as redis,
        B.sim_proc(tokens_per_second=0, chunk_size=4) as sim,
    ):
        for repeat in range(args.repeats):
            order = trees if repeat % 2 == 0 else trees[::-1]
            for name, src in order:
                started = time.monotonic()
                result = await measure(name, src, sim.url, redis.url, args)
                results.append(result)
                print(
                    f"  {name} #{repeat + 1}: {result.opened:,} open ({result.failed} failed), "
                    f"{result.per_connection_kib:.1f} KiB/connection, {result.turned:,} turned "
                    f"({result.turn_failed} failed), {result.per_session_kib:.1f} KiB/session; "
                    f"RSS MiB {result.rss_mib}; {time.monotonic() - started:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"\nidle scale: {args.connections:,} connections on one machine (gateway --workers "
        f"{args.workers}, Redis store), {args.sessions:,} of them after one turn; RSS of the "
        f"gateway's processes summed; medians of {args.repeats}"
    )
    rows = []
    med: dict[str, dict[str, float]] = {}
    for name, _ in trees:
        mine = [r for r in results if r.tree == name]
        med[name] = {
            k: B.median([getattr(r, k) for r in mine])
            for k in (
                "opened",
                "per_connection_kib",
                "per_session_kib",
                "idle_cpu_conn",
                "idle_cpu_session",
            )
        }
        m = med[name]
        rows.append(
            [
                name,
                int(m["opened"]),
                m["per_connection_kib"],
                m["per_session_kib"],
                m["idle_cpu_conn"],
                m["idle_cpu_session"],
            ]
        )
    print(
        B.table(
            [
                "tree",
                "open",
                "KiB / idle connection",
                "KiB / idle session",
                "cores / 10k idle conns",
                "cores / 10k idle sessions",
            ],
            rows,
        )
    )
    if "base" in med:
        for k, label in (
            ("per_connection_kib", "per idle connection"),
            ("per_session_kib", "per idle session"),
        ):
            print(f"  this ÷ base, {label}: {med['this'][k] / med['base'][k]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
