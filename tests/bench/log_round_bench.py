"""Redis commands, Redis CPU and client CPU per logged event of the log writer's rounds, A/B.

Run: ``.venv/bin/python tests/bench/log_round_bench.py [--base-src DIR]
[--sessions 1,10,50,200] [--rounds 400] [--repeats 5] [--cluster]``

The load of a node's log writer on one Redis: rounds of ``--sessions`` appends
(one ~60-byte event per session, as at 20 deltas/s each a session's events
are further apart than a round) sent with ``RedisStore.submit_appends`` (the
append pipe on one server, the group commit on a Cluster), one round in
flight, back to back. For each checkout (this one, and ``--base-src DIR``, e.g.
``git worktree add DIR main``) a worker process imports the gateway from that
tree and runs ``--rounds`` rounds on a shared redis-server of its own; the
checkouts alternate repeat by repeat (interleaved, rotated), medians printed:

- ``cmds/ev``: Redis's own count (``INFO``'s ``total_commands_processed``,
  the calls scripts make included) per event;
- ``redis µs/ev``: Redis's CPU (user + sys, ``INFO``) per event;
- ``client µs/ev``: the worker's CPU per event (packing, reading replies);
- ``round µs``: wall time per round (one round trip, on a shared machine).

With ``--cluster`` the store runs on an own 3-master Redis Cluster (its
masters' counters summed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EVENT = b'{"type":"respond","session":"s","seq":0,"text":"some token"}'


async def worker(url: str, cluster_urls: list[str], sessions: int, rounds: int) -> dict[str, Any]:
    """Runs in the tree under test (``sys.path[0]``): one measurement, as a dict."""
    import benchlib as B

    import gateway
    from gateway.store import LogEntry, RedisStore

    store = RedisStore.from_url(url)
    prefix = f"b{time.monotonic_ns()}"
    sids = [f"{prefix}-{i}" for i in range(sessions)]
    seq = 0

    async def round_() -> None:
        nonlocal seq
        seq += 1
        done: asyncio.Future[list[BaseException | None]] = (
            asyncio.get_running_loop().create_future()
        )
        batches = [(sid, "n1", [LogEntry(seq, EVENT)], []) for sid in sids]
        store.submit_appends(batches, done.set_result)
        results = await done
        failed = [r for r in results if r is not None]
        if failed:
            raise RuntimeError(f"append failed: {failed[0]!r}")

    try:
        for sid in sids:
            await store.create_session(sid, {"owner": "n1"})
            assert await store.acquire_lease(sid, "n1", 600.0)
        for _ in range(20):  # warm up: the pipe connects, the memo learns the logs' ends
            await round_()
        masters = cluster_urls or [url]
        info0 = [B.redis_counters(m) for m in masters]
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            await round_()
        cpu1, t1 = time.process_time(), time.perf_counter()
        info1 = [B.redis_counters(m) for m in masters]
    finally:
        await store.close()
    used = [b - a for a, b in zip(info0, info1, strict=True)]
    events = rounds * sessions
    return {
        "tree": gateway.__file__,
        "cmds_per_event": (sum(u.commands for u in used) - len(masters)) / events,
        "redis_us_per_event": sum(u.cpu_s for u in used) / events * 1e6,
        "client_us_per_event": (cpu1 - cpu0) / events * 1e6,
        "round_us": (t1 - t0) / rounds * 1e6,
        "pipe_rounds": store.stats.pipe_rounds,
    }


def run_worker(
    tree: Path, args: argparse.Namespace, url: str, cluster: list[str]
) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            str(tree),
            "--url",
            url,
            "--cluster-urls",
            ",".join(cluster),
            "--sessions",
            str(args.sessions_one),
            "--rounds",
            str(args.rounds),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["tree"]).resolve().parents[1] != tree.resolve():
        raise SystemExit(f"the worker imported the gateway from {result['tree']}, not {tree}")
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-src", type=Path, default=None, help="the other checkout (A/B)")
    p.add_argument("--sessions", default="1,10,50,200", help="sessions per round, comma-separated")
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cluster", action="store_true", help="an own 3-master Redis Cluster")
    p.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--url", default="", help=argparse.SUPPRESS)
    p.add_argument("--cluster-urls", default="", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker is not None:  # a measurement, in the tree given
        import benchlib  # noqa: F401 - imported first: it may put this tree on sys.path

        for name in [m for m in sys.modules if m == "gateway" or m.startswith("gateway.")]:
            del sys.modules[name]
        sys.path.insert(0, str(args.worker.resolve()))
        cluster = [u for u in args.cluster_urls.split(",") if u]
        result = asyncio.run(worker(args.url, cluster, int(args.sessions), args.rounds))
        print(json.dumps(result))
        return 0

    sys.path.insert(0, str(ROOT))
    from tests.support.redis_server import RedisServer
    from tests.support.redis_topologies import ClusterRedis

    trees = [("this", ROOT)] + ([("base", args.base_src)] if args.base_src else [])
    levels = [int(s) for s in args.sessions.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        if args.cluster:
            topo = ClusterRedis(Path(tmp))
            topo.start()
            url = topo.url
            masters = [n.url for n in topo.nodes if topo.role(n) == "master"]
            stop = topo.stop
        else:
            server = RedisServer(Path(tmp))
            server.start()
            url, masters = server.url, []
            stop = server.stop
        try:
            print(
                f"{'sessions':>8} {'tree':>5} {'cmds/ev':>8} {'redis µs/ev':>12} "
                f"{'client µs/ev':>13} {'round µs':>9}   (medians of {args.repeats})"
            )
            for level in levels:
                args.sessions_one = level
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
                for k in range(args.repeats):
                    order = trees[k % len(trees) :] + trees[: k % len(trees)]
                    for name, tree in order:
                        runs[name].append(run_worker(tree, args, url, masters))
                for name, _ in trees:
                    med = {
                        key: sorted(r[key] for r in runs[name])[len(runs[name]) // 2]
                        for key in (
                            "cmds_per_event",
                            "redis_us_per_event",
                            "client_us_per_event",
                            "round_us",
                        )
                    }
                    print(
                        f"{level:>8} {name:>5} {med['cmds_per_event']:>8.2f} "
                        f"{med['redis_us_per_event']:>12.1f} "
                        f"{med['client_us_per_event']:>13.1f} {med['round_us']:>9.0f}",
                        flush=True,
                    )
        finally:
            stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
