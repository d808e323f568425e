"""Memory per idle connection and per idle session, and how many sessions one node holds.

Run: ``.venv/bin/python tests/bench/memory_bench.py [--quick]``

1. *Idle connections*: a fresh gateway (Redis store, simulator in its own
   process) is warmed up with a few turns, its RSS read, then ``--idle``
   clients connect and send nothing; once all are open the RSS is read
   again. ``(after - before) / N`` is what one idle connection costs the
   gateway: the WebSocket, its reader and writer, the session runtime (no
   upstream connection yet: it opens on the first turn). Median of
   ``--repeats`` fresh gateways.
2. *Idle sessions* (``--sessions``, 5,000): on another fresh gateway, N
   sessions ramped over ``--ramp`` seconds each run one turn and then stay
   connected until all have done theirs: every session is open at once, idle
   after its turn, with its client and its upstream WebSocket and its
   history. Reports errors, turn latencies, the peak of open sessions and
   the RSS per session.

Target: < 100 KiB per idle connection; 5,000 concurrent sessions without errors.

At scale (issue 33): ``--idle 20000 --idle-ramp 30 --sessions 20000 --ramp 80``
raises the open-file limit for this process and its children (the gateway
raises its soft limit to the hard one itself; as root the bench lifts the hard
one, as an operator's ``LimitNOFILE=`` would); the clients are split over
load tests of at most 10,000 sessions each, run at once. ``--base-src DIR``
runs the same on a gateway from another checkout (``git worktree add DIR
COMMIT``), interleaved, and prints the ratio. ``--profile PREFIX`` runs the
idle gateway with ``tracemalloc`` (``tests/bench/memhook``) and prints, per
idle connection, where the traced memory grew (by line) and which live
objects were added (by type): the profile that says what to cut.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import benchlib as B

from gateway.client.loadtest import LoadTest, LoadTestConfig
from gateway.client.report import LoadTestReport, format_report

KIB = 1024
MAX_PER_LOADTEST = 10_000  # LoadTestConfig's bound on sessions


async def warm_up(url: str) -> None:
    report = await LoadTest(LoadTestConfig(url=url, sessions=20, turns=2)).run()
    if not report.ok:
        raise RuntimeError(f"warm-up failed:\n{format_report(report)}")


@dataclass
class Fleet:
    """``n`` client sessions as several load tests at once (each at most 10,000)."""

    tests: list[LoadTest] = field(default_factory=list)
    tasks: list[asyncio.Task[LoadTestReport]] = field(default_factory=list)

    @classmethod
    def start(cls, n: int, **config: object) -> Fleet:
        fleet = cls()
        parts = -(-n // MAX_PER_LOADTEST)
        for i in range(parts):
            size = n // parts + (1 if i < n % parts else 0)
            lt = LoadTest(LoadTestConfig(sessions=size, **config))  # type: ignore[arg-type]
            fleet.tests.append(lt)
            fleet.tasks.append(asyncio.create_task(lt.run()))
        return fleet

    def count(self, name: str) -> int:
        return sum(getattr(lt.counters, name) for lt in self.tests)

    @property
    def done(self) -> bool:
        return all(t.done() for t in self.tasks)

    async def wait_open(self, n: int) -> bool:
        """Until ``n`` sessions are open at once (False if some failed or the run ended)."""
        while self.count("sessions_open") < n:
            if self.done or self.count("sessions_open") + self.count("sessions_failed") >= n:
                return False
            await asyncio.sleep(0.1)
        return True

    def stop(self) -> None:
        for lt in self.tests:
            lt.stop()

    async def reports(self) -> list[LoadTestReport]:
        return list(await asyncio.gather(*self.tasks))


def errors_of(reports: list[LoadTestReport]) -> dict[str, int]:
    errors: dict[str, int] = {}
    for report in reports:
        for kind, count in report.errors.items():
            errors[kind] = errors.get(kind, 0) + count
    return errors


# All clients come from 127.0.0.1 here, and one node is asked to hold them all:
# the node's per-address and per-node caps (HTTP 503 / closed handshakes
# beyond) are lifted; an operator sizing a node for this does the same.
SCALE_ENV = {"GATEWAY_MAX_CONNECTIONS": "0", "GATEWAY_UNAUTHENTICATED_PER_ADDRESS": "0"}


def gateway(sim_url: str, redis_url: str | None, src: Path | None, prefix: str | None) -> B.Proc:
    proc = profiled(B.gateway_proc(sim_url, redis_url), prefix)
    proc.env.update(SCALE_ENV)
    if src is not None:
        proc.cwd = src  # ``python -m gateway.cli`` imports from its cwd
    # Traced, its imports take a while.
    return proc.start(timeout=180 if prefix else 60)


def profiled(proc: B.Proc, prefix: str | None) -> B.Proc:
    """``proc`` with the memory hook on (tracemalloc from the start; SIGUSR1 dumps)."""
    if prefix:
        hook = str(Path(__file__).resolve().parent / "memhook")
        proc.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [hook, proc.env.get("PYTHONPATH", "")])
        )
        proc.env["BENCH_MEMHOOK"] = prefix
    return proc


async def dump(proc: B.Proc, prefix: str, n: int) -> str:
    """Ask the hooked process for its ``n``-th snapshot; its file prefix."""
    os.kill(proc.pid, signal.SIGUSR1)
    await asyncio.to_thread(wait_for_file, Path(f"{prefix}.{n}.done"))
    return f"{prefix}.{n}"


def wait_for_file(path: Path, timeout: float = 600.0) -> None:
    """Poll for a file another process writes last (no event crosses processes)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was not written within {timeout:g}s")
        time.sleep(0.2)


def profile_report(before: str, after: str, n: int, top: int = 25) -> str:
    """Where traced memory grew between two dumps, and which objects were added, per ``n``."""
    old = tracemalloc.Snapshot.load(before + ".snap")
    new = tracemalloc.Snapshot.load(after + ".snap")
    lines = [f"traced memory per idle connection, by line (top {top}):"]
    stats = new.compare_to(old, "lineno")
    total = sum(s.size_diff for s in stats)
    lines.append(f"  total traced growth: {total / n:,.0f} B per connection")
    for stat in stats[:top]:
        frame = stat.traceback[0]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        lines.append(f"  {stat.size_diff / n:8,.0f} B  {stat.count_diff / n:6.2f} blocks  {where}")
    types_old = json.loads(Path(before + ".types").read_text())
    types_new = json.loads(Path(after + ".types").read_text())
    grown = sorted(
        ((types_new[k] - types_old.get(k, 0), k) for k in types_new),
        reverse=True,
    )
    lines.append("live objects added per idle connection (gc-tracked types):")
    for diff, name in grown[:top]:
        if diff / n >= 0.5:
            lines.append(f"  {diff / n:6.2f}  {name}")
    return "\n".join(lines)


async def idle_run(
    sim_url: str,
    redis_url: str | None,
    n: int,
    ramp: float,
    src: Path | None = None,
    prefix: str | None = None,
) -> tuple[int, int, int, dict[str, int]]:
    """RSS before and with the idle connections open, and how many were, on a fresh gateway."""
    gw = gateway(sim_url, redis_url, src, prefix)
    try:
        await warm_up(gw.url)
        await asyncio.sleep(1.0)
        before = gw.rss()
        if prefix:
            first = await dump(gw, prefix, 1)
        fleet = Fleet.start(n, url=gw.url, turns=0, ramp=ramp, hold=ramp + 120, connect_timeout=60)
        ok = await fleet.wait_open(n)
        await asyncio.sleep(2.0)
        after = gw.rss()
        opened = fleet.count("sessions_open")
        if prefix:
            print(profile_report(first, await dump(gw, prefix, 2), opened))
        fleet.stop()  # done measuring: stop holding
        errors = errors_of(await fleet.reports())
        if not ok:
            errors.setdefault("not_all_open", 1)
        if errors:
            print("".join(gw.output[-20:]), file=sys.stderr)
        return before, after, opened, errors
    finally:
        gw.stop()


@dataclass
class ManyRun:
    n: int
    before: int
    peak: int
    open: int
    """Sessions open at the peak reading (all of them, unless some failed)."""
    reports: list[LoadTestReport]

    @property
    def turns_ok(self) -> int:
        return sum(r.turns_ok for r in self.reports)


async def many_run(
    sim_url: str, redis_url: str | None, n: int, ramp: float, src: Path | None = None
) -> ManyRun:
    """``n`` sessions each doing one turn, then all open and idle at once."""
    gw = gateway(sim_url, redis_url, src, None)
    try:
        await warm_up(gw.url)
        await asyncio.sleep(1.0)
        before = gw.rss()
        fleet = Fleet.start(
            n,
            url=gw.url,
            turns=1,
            ramp=ramp,
            hold=ramp + 60,
            connect_timeout=60,
            turn_timeout=60,
            duration=ramp + 240,
        )
        peak, opened = before, 0
        while not fleet.done:
            await asyncio.sleep(0.5)
            rss = gw.rss()
            if rss > peak:
                peak, opened = rss, fleet.count("sessions_open")
            finished = fleet.count("turns_ok") + fleet.count("turns_failed")
            if fleet.count("sessions_open") == n and finished == n:
                await asyncio.sleep(2.0)
                peak, opened = max(peak, gw.rss()), fleet.count("sessions_open")
                break
        fleet.stop()
        reports = await fleet.reports()
        if errors_of(reports):
            print("".join(gw.output[-30:]), file=sys.stderr)
        return ManyRun(n, before, peak, opened, reports)
    finally:
        gw.stop()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=int, default=2000, help="idle connections per repeat")
    parser.add_argument("--idle-ramp", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=5000, help="idle sessions (0: skip)")
    parser.add_argument("--ramp", type=float, default=50.0)
    parser.add_argument("--no-redis", action="store_true", help="gateway with the memory store")
    parser.add_argument("--quick", action="store_true", help="1 repeat; 1,000 sessions")
    parser.add_argument(
        "--base-src",
        type=Path,
        default=None,
        metavar="DIR",
        help="also measure a gateway run from this checkout, interleaved (A/B)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PREFIX",
        help="tracemalloc the idle gateway; files PREFIX.N.* (slows the gateway)",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.sessions, args.ramp, args.idle = 1, 1000, 5.0, 1000
    # The gateway holds a client and an upstream socket per session; this
    # process the clients' ends; the simulator the upstreams' other ends.
    limit = B.raise_nofile(2 * max(args.idle, args.sessions) + 4096)
    print(f"  open-file limit {limit:,}", file=sys.stderr)
    trees: dict[str, Path | None] = {"this": None}
    if args.base_src is not None:
        trees["base"] = args.base_src
    idle_rows: list[list[object]] = []
    per_conn: dict[str, list[float]] = {name: [] for name in trees}
    many: dict[str, ManyRun] = {}
    failed = False
    with tempfile.TemporaryDirectory() as tmp, B.redis_server(Path(tmp)) as redis:
        redis_url = None if args.no_redis else redis.url
        with B.sim_proc(tokens_per_second=0, chunk_size=4) as sim:
            for i in range(args.repeats):
                order = list(trees.items())
                if i % 2:
                    order.reverse()
                for name, src in order:
                    profile = args.profile if i == 0 and name == "this" else None
                    before, after, opened, errors = await idle_run(
                        sim.url, redis_url, args.idle, args.idle_ramp, src, profile
                    )
                    per = (after - before) / max(opened, 1) / KIB
                    per_conn[name].append(per)
                    failed |= bool(errors)
                    idle_rows.append(
                        [
                            f"{name} idle #{i + 1}",
                            opened,
                            before / 2**20,
                            after / 2**20,
                            per,
                            str(errors or "none"),
                        ]
                    )
                    print(
                        f"  {name} idle run {i + 1}: {per:.1f} KiB/connection",
                        file=sys.stderr,
                        flush=True,
                    )
            if args.sessions:
                for name, src in trees.items():
                    many[name] = await many_run(sim.url, redis_url, args.sessions, args.ramp, src)
    store = "memory" if args.no_redis else "redis"
    print(f"\nmemory: gateway RSS (store {store}), a fresh gateway per run")
    for name in trees:
        idle_rows.append(
            [f"{name} median", args.idle, float("nan"), float("nan"), B.median(per_conn[name]), ""]
        )
    print(
        B.table(
            ["run", "open", "RSS before MiB", "RSS after MiB", "KiB/conn", "errors"],
            idle_rows,
        )
    )
    print(f"\nidle connection: {B.median(per_conn['this']):.1f} KiB (target < 100 KiB)")
    if "base" in trees:
        ratio = B.median(per_conn["this"]) / B.median(per_conn["base"])
        print(f"  against {args.base_src}: {B.median(per_conn['base']):.1f} KiB; ratio {ratio:.2f}")
    for name, run in many.items():
        reports = run.reports
        errors = errors_of(reports)
        print(
            f"\n{name}: one node, {run.n:,} idle sessions (one turn each, then all held open; "
            f"ramp {args.ramp:g}s):"
            f"\n  peak open {sum(r.sessions_peak_open for r in reports):,} (at the RSS peak "
            f"{run.open:,}), turns ok "
            f"{run.turns_ok:,}/{run.n:,}, failed {sum(r.turns_failed for r in reports):,}, "
            f"errors {errors or 'none'}"
            f"\n  gateway RSS {run.before / 2**20:.0f} MiB -> {run.peak / 2**20:.0f} MiB "
            f"({(run.peak - run.before) / max(run.open, 1) / KIB:.1f} KiB per idle session with its "
            "upstream connection)"
            + "".join(
                f"\n  load test {i + 1}: connect p50 {r.connect.p50_ms:.1f} ms p99 "
                f"{r.connect.p99_ms:.1f} ms; turn p50 {r.turn.p50_ms:.1f} ms p99 "
                f"{r.turn.p99_ms:.1f} ms"
                for i, r in enumerate(reports)
            )
        )
        failed |= bool(errors) or run.turns_ok != run.n
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
