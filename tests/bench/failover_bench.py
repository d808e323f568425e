"""How long sessions on healthy Redis Cluster shards stall while one master is killed.

Run: ``python tests/bench/failover_bench.py [--sessions 24] [--repeats 3] [--timeline]``

Starts a 3-master / 3-replica cluster (tests/support/redis_topologies.py, node
timeout 1 s, ``cluster-require-full-coverage no`` unless ``--full-coverage``:
with Redis' default every master refuses commands until the failover is
over, whatever the client does), has ``--sessions`` sessions append one event at a time as fast as
the store answers, ``kill -9``s the master of the first session, and waits for
its replica to take over. Printed per run: the longest append of a session on
a surviving master from the kill until 0.5 s after the failover (the
healthy-shard stall: issue 29's goal is under 100 ms), the p99 of those
appends, and how many appends of the killed master's sessions failed.
``--timeline`` also prints the slowest healthy appends with when they started,
relative to the kill.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.store import LogEntry, RedisStore, StoreUnavailable  # noqa: E402
from tests.support.redis_topologies import ClusterRedis, wait_until  # noqa: E402

EVENT = b'{"type":"respond","session":"s","seq":0,"text":"some token"}'


async def one_run(sessions: int, timeline: bool, full_coverage: bool) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory(prefix="rtgw-failover-") as tmp:
        cluster = ClusterRedis(Path(tmp), full_coverage=full_coverage)
        await asyncio.to_thread(cluster.start)
        store = RedisStore.from_url(
            cluster.url, socket_timeout=1.0, connect_timeout=0.5, retry_window=2.0
        )
        try:
            return await measure(cluster, store, sessions, timeline)
        finally:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(15):
                    await store.close()
            await asyncio.to_thread(cluster.stop)


async def measure(
    cluster: ClusterRedis, store: RedisStore, sessions: int, timeline: bool
) -> tuple[float, float, int]:
    sids = [f"b{i}" for i in range(sessions)]
    await store.keep_leases(sids, "n1", 120.0)
    victim = cluster.master_of(store._key(sids[0], "log"))
    on_victim = {s for s in sids if cluster.master_of(store._key(s, "log")) is victim}
    healthy: list[tuple[float, float, str]] = []  # (started, took, sid) while measuring
    failures = 0
    window: list[float] = []  # [kill time] once measuring
    stop = asyncio.Event()

    async def write(sid: str) -> None:
        nonlocal failures
        seq = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await store.append(sid, "n1", [LogEntry(seq + 1, EVENT)])
                seq += 1
            except StoreUnavailable:
                failures += sid in on_victim
                with contextlib.suppress(StoreUnavailable):
                    seq = await store.confirmed_seq(sid)
            if window and sid not in on_victim:
                healthy.append((started - window[0], time.monotonic() - started, sid))

    tasks = [asyncio.create_task(write(sid)) for sid in sids]
    try:
        await asyncio.sleep(0.5)  # warm: every lane connected and busy
        window.append(time.monotonic())
        victim.kill()
        await asyncio.to_thread(
            wait_until, lambda: cluster.master_of(store._key(sids[0], "log")) is not victim, "fo"
        )
        failed_over = time.monotonic() - window[0]
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        async with asyncio.timeout(15):
            await asyncio.gather(*tasks)
    took = sorted(t for _, t, _ in healthy)
    worst = took[-1] if took else 0.0
    p99 = took[int(len(took) * 0.99)] if took else 0.0
    if timeline:
        print(f"  failover seen after {failed_over:.2f}s; {len(took)} healthy appends")
        for started, t, sid in sorted(healthy, key=lambda h: -h[1])[:5]:
            print(f"  {sid} started at +{started * 1000:.0f} ms, took {t * 1000:.0f} ms")
    return worst, p99, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeline", action="store_true")
    parser.add_argument(
        "--full-coverage",
        action="store_true",
        help="run Redis with cluster-require-full-coverage yes (its default): every master "
        "answers CLUSTERDOWN until the failover is over",
    )
    args = parser.parse_args()
    worsts = []
    for run in range(args.repeats):
        worst, p99, failures = asyncio.run(
            one_run(args.sessions, args.timeline, args.full_coverage)
        )
        worsts.append(worst)
        print(
            f"run {run + 1}: healthy-shard stall {worst * 1000:.0f} ms "
            f"(p99 {p99 * 1000:.1f} ms); killed master's appends failed: {failures}"
        )
    print(f"median healthy-shard stall: {statistics.median(worsts) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
