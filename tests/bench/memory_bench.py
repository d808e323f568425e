"""Memory per connection, and how many sessions one node holds.

Run: ``.venv/bin/python tests/bench/memory_bench.py [--quick]``

1. *Idle connections*: a fresh gateway (Redis store, simulator in its own
   process) is warmed up with a few turns, its RSS read, then ``--idle``
   sessions are opened and held open without sending anything; once all are
   open the RSS is read again. ``(after - before) / N`` is the memory one idle
   client session costs the gateway: the WebSocket, its reader/writer tasks,
   the session runtime and its flusher (no upstream connection yet: it is
   opened on the first turn). Median of ``--repeats`` fresh gateways.
2. *One node, many sessions*: ``--sessions`` (5,000) sessions ramped over
   ``--ramp`` seconds, each runs one turn and then stays connected until all
   have done theirs, so every session is open at once; the gateway then holds
   one client and one upstream WebSocket per session. Reports errors, turn
   latencies, the peak of open sessions and the RSS per session.

Target: < 100 KiB per idle connection; 5,000 concurrent sessions without errors.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import benchlib as B

from gateway.client.loadtest import LoadTest, LoadTestConfig
from gateway.client.report import LoadTestReport, format_report

KIB = 1024


async def wait_open(lt: LoadTest, n: int, task: asyncio.Task[LoadTestReport]) -> bool:
    """Until ``n`` sessions are open at once (False if the run ended first)."""
    while lt.counters.sessions_open < n:
        if task.done():
            return False
        await asyncio.sleep(0.1)
    return True


async def warm_up(url: str) -> None:
    report = await LoadTest(LoadTestConfig(url=url, sessions=20, turns=2)).run()
    if not report.ok:
        raise RuntimeError(f"warm-up failed:\n{format_report(report)}")


async def idle_run(
    sim_url: str, redis_url: str | None, n: int, ramp: float
) -> tuple[int, int, dict[str, int]]:
    """RSS before and with ``n`` idle sessions open, on a fresh gateway."""
    with B.gateway_proc(sim_url, redis_url) as gw:
        await warm_up(gw.url)
        await asyncio.sleep(1.0)
        before = gw.rss()
        config = LoadTestConfig(
            url=gw.url, sessions=n, turns=0, ramp=ramp, hold=ramp + 30, connect_timeout=30
        )
        lt = LoadTest(config)
        task = asyncio.create_task(lt.run())
        ok = await wait_open(lt, n, task)
        await asyncio.sleep(1.0)
        after = gw.rss()
        lt.stop()  # done measuring: stop holding
        errors = dict((await task).errors)
        if not ok:
            errors.setdefault("not_all_open", 1)
        if errors:
            print("".join(gw.output[-20:]), file=sys.stderr)
        return before, after, errors


async def many_run(
    sim_url: str, redis_url: str | None, n: int, ramp: float
) -> tuple[LoadTestReport, int, int, int]:
    """``n`` sessions each doing one turn, all open at once; report, RSS before/peak, sim conns."""
    with B.gateway_proc(sim_url, redis_url) as gw:
        await warm_up(gw.url)
        await asyncio.sleep(1.0)
        before = gw.rss()
        config = LoadTestConfig(
            url=gw.url,
            sessions=n,
            turns=1,
            ramp=ramp,
            hold=ramp + 20,
            connect_timeout=30,
            turn_timeout=60,
            duration=ramp + 180,
        )
        lt = LoadTest(config)
        task = asyncio.create_task(lt.run())
        peak = before
        all_open_and_done = False
        while not task.done():
            await asyncio.sleep(0.5)
            peak = max(peak, gw.rss())
            c = lt.counters
            if c.sessions_open == n and c.turns_ok + c.turns_failed == n:
                all_open_and_done = True
                await asyncio.sleep(1.0)
                peak = max(peak, gw.rss())
                break
        if all_open_and_done:
            lt.stop()
        report = await task
        if report.errors:
            print("".join(gw.output[-30:]), file=sys.stderr)
        return report, before, peak, n


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=int, default=2000, help="idle sessions per repeat")
    parser.add_argument("--idle-ramp", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--ramp", type=float, default=50.0)
    parser.add_argument("--no-redis", action="store_true", help="gateway with the memory store")
    parser.add_argument("--quick", action="store_true", help="1 repeat; 1,000 sessions")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.sessions, args.ramp, args.idle = 1, 1000, 5.0, 1000
    B.raise_nofile()
    idle_rows = []
    per_conn: list[float] = []
    failed = False
    with tempfile.TemporaryDirectory() as tmp, B.redis_server(Path(tmp)) as redis:
        redis_url = None if args.no_redis else redis.url
        with B.sim_proc(tokens_per_second=0, chunk_size=4) as sim:
            for i in range(args.repeats):
                before, after, errors = await idle_run(
                    sim.url, redis_url, args.idle, args.idle_ramp
                )
                per = (after - before) / args.idle / KIB
                per_conn.append(per)
                failed |= bool(errors)
                idle_rows.append(
                    [
                        f"idle #{i + 1}",
                        args.idle,
                        before / 2**20,
                        after / 2**20,
                        per,
                        str(errors or "none"),
                    ]
                )
                print(f"  idle run {i + 1}: {per:.1f} KiB/connection", file=sys.stderr, flush=True)
            report, before, peak, n = await many_run(sim.url, redis_url, args.sessions, args.ramp)
    store = "memory" if args.no_redis else "redis"
    print(f"\nmemory: gateway RSS (store {store}), fresh gateway per run")
    idle_rows.append(["median", args.idle, float("nan"), float("nan"), B.median(per_conn), ""])
    print(
        B.table(
            ["run", "sessions", "RSS before MiB", "RSS after MiB", "KiB/conn", "errors"], idle_rows
        )
    )
    print(f"\nidle connection: {B.median(per_conn):.1f} KiB (target < 100 KiB)")
    print(
        f"\none node, {n:,} sessions (one turn each, then all held open; ramp {args.ramp:g}s):"
        f"\n  peak open {report.sessions_peak_open:,}, turns ok {report.turns_ok:,}/{n:,}, "
        f"failed {report.turns_failed:,}, errors {report.errors or 'none'}"
        f"\n  gateway RSS {before / 2**20:.0f} MiB -> {peak / 2**20:.0f} MiB "
        f"({(peak - before) / n / KIB:.1f} KiB per session with its upstream connection)"
        f"\n  connect p50 {report.connect.p50_ms:.1f} ms p99 {report.connect.p99_ms:.1f} ms; "
        f"turn p50 {report.turn.p50_ms:.1f} ms p99 {report.turn.p99_ms:.1f} ms"
    )
    failed |= bool(report.errors) or report.turns_ok != n
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
