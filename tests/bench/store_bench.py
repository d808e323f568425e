"""Appends per second and client CPU per append of ``RedisStore``'s group commit.

Run: ``python tests/bench/store_bench.py [--sessions 1000] [--seconds 3] [--repeats 5]
[--url redis://…] [--durability local|replicated] [--replica] [--cluster] [--parser-replies]``

Load: ``--sessions`` tasks, each appending one ~60-byte event at a time to its
own session as fast as the store answers (the shape of a node streaming tokens
for that many sessions at once). Measured for ``--seconds`` after a warm-up;
``--repeats`` runs, the median printed. CPU is this process's (the client's)
user+system time divided by the appends made, so it is the store client's cost
per append (the server's CPU is not counted). Latency is each append's own
round trip (queued → stored), p50 and p99.

Without ``--url`` it starts its own redis-server (with ``--replica`` one
replica of it, for ``--durability replicated``; with ``--cluster`` a Redis
Cluster of three masters with a replica each). The servers' side, from their
``INFO`` before and after the window (the masters', summed): Redis CPU per
append (``redis_us_per_append``: what one master core spends on one append,
so ``1e6 / redis_us_per_append`` appends/s fill a master's core), commands
per append, and memory stored per append (``used_memory`` growth; the log
bound is not reached in a run). The client is one Python process: with
``--cluster`` it, not Redis, is the limit of appends/s; the per-append Redis
CPU is what sizes a shard (docs/capacity.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import benchlib as B  # noqa: E402

from gateway.store import LogEntry, open_store  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.redis_topologies import ClusterRedis, ReplicatedRedis  # noqa: E402

EVENT = b'{"type":"respond","session":"s","seq":0,"text":"some token"}'


async def one_run(
    url: str,
    sessions: int,
    seconds: float,
    options: dict[str, object],
    parser_replies: bool = False,
    masters: Sequence[str] = (),
) -> dict[str, float]:
    store = open_store(url, **options)  # type: ignore[arg-type]
    if parser_replies:
        store._commit.sender.bulk_replies = False  # type: ignore[attr-defined]
    try:
        sids = [f"b{time.monotonic_ns()}-{i}" for i in range(sessions)]
        await store.keep_leases(sids, "n1", 600.0)
        counts = [0] * sessions
        latencies: list[float] = []
        measuring = False
        stop = False

        async def writer(i: int) -> None:
            seq = 0
            while not stop:
                seq += 1
                started = time.perf_counter()
                await store.append(sids[i], "n1", [LogEntry(seq, EVENT)])
                if measuring:
                    counts[i] += 1
                    latencies.append(time.perf_counter() - started)

        tasks = [asyncio.create_task(writer(i)) for i in range(sessions)]
        await asyncio.sleep(min(1.0, seconds / 2))  # warm-up
        measuring = True
        info0 = [B.redis_counters(m) for m in masters]
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        cpu1, t1 = time.process_time(), time.perf_counter()
        info1 = [B.redis_counters(m) for m in masters]
        measuring = False
        stop = True
        await asyncio.gather(*tasks)
        total = sum(counts)
        latencies.sort()
        result = {
            "appends_per_s": total / (t1 - t0),
            "cpu_us_per_append": (cpu1 - cpu0) / max(total, 1) * 1e6,
            "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        }
        if masters:
            used = [b - a for a, b in zip(info0, info1, strict=True)]
            appends = max(total, 1)
            result["redis_us_per_append"] = sum(u.cpu_s for u in used) / appends * 1e6
            result["redis_cmds_per_append"] = (sum(u.commands for u in used) - 1) / appends
            result["redis_bytes_in_per_append"] = sum(u.net_input_bytes for u in used) / appends
            result["redis_stored_bytes_per_append"] = sum(u.used_memory for u in used) / appends
            result["redis_busiest_master_cores"] = max(u.cpu_s for u in used) / (t1 - t0)
        return result
    finally:
        await store.close()


async def renewals_run(url: str, sessions: int, rounds: int, master: str) -> dict[str, float]:
    """Redis CPU per lease renewal: ``keep_leases`` of ``sessions`` leases, ``rounds`` times
    (what every node does for its sessions every ``lease_ttl / 3``)."""
    store = open_store(url)
    try:
        sids = [f"r{time.monotonic_ns()}-{i}" for i in range(sessions)]
        await store.keep_leases(sids, "n1", 600.0)
        before = B.redis_counters(master)
        t0 = time.perf_counter()
        for _ in range(rounds):
            await store.keep_leases(sids, "n1", 600.0)
        wall = time.perf_counter() - t0
        used = B.redis_counters(master) - before
        n = sessions * rounds
        return {"renewals_per_s": n / wall, "redis_us_per_renewal": used.cpu_s / n * 1e6}
    finally:
        await store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="")
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--durability", default="local")
    p.add_argument("--replica", action="store_true", help="give the own server a replica")
    p.add_argument("--cluster", action="store_true", help="run on an own 3-master Redis Cluster")
    p.add_argument(
        "--renewals",
        type=int,
        default=0,
        metavar="N",
        help="also: Redis CPU per lease renewal, N leases renewed 10 times (one server)",
    )
    p.add_argument(
        "--parser-replies",
        action="store_true",
        help="read append replies through redis-py's parser, not in bulk (redis_fastpath)",
    )
    args = p.parse_args()
    options: dict[str, object] = {}
    if args.durability != "local":
        options["durability"] = args.durability
    with tempfile.TemporaryDirectory() as tmp:
        servers: list[RedisServer | ReplicatedRedis | ClusterRedis] = []
        url = args.url
        masters: list[str] = []  # whose INFO counts (own servers only)
        if not url and args.cluster:
            cluster = ClusterRedis(Path(tmp))
            cluster.start()
            servers.append(cluster)
            url = cluster.url
            masters = [n.url for n in cluster.nodes if cluster.role(n) == "master"]
        elif not url and args.replica:
            pair = ReplicatedRedis(Path(tmp))
            pair.start()
            servers.append(pair)
            url = pair.primary.url
            masters = [pair.primary.url]
        elif not url:
            primary = RedisServer(Path(tmp) / "primary")
            primary.start()
            servers.append(primary)
            url = primary.url
            masters = [primary.url]
        try:
            runs = [
                asyncio.run(
                    one_run(url, args.sessions, args.seconds, options, args.parser_replies, masters)
                )
                for _ in range(args.repeats)
            ]
            if args.renewals and len(masters) == 1:
                renewals = [
                    asyncio.run(renewals_run(url, args.renewals, 10, masters[0]))
                    for _ in range(args.repeats)
                ]
                runs = [run | more for run, more in zip(runs, renewals, strict=True)]
        finally:
            for server in servers:
                server.stop()
    shape = "cluster (3 masters)" if args.cluster else "replica" if args.replica else "one server"
    print(
        f"{args.sessions} sessions, {args.seconds:g} s x {args.repeats}, "
        f"durability={args.durability}, {shape}"
    )
    for name in runs[0]:
        values = [run[name] for run in runs]
        print(
            f"  {name:20s} median {statistics.median(values):10.1f}   runs {', '.join(f'{v:.1f}' for v in values)}"
        )


if __name__ == "__main__":
    main()
