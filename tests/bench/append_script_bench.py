"""Redis's own CPU per append, and replication bytes per append, for two APPEND scripts.

Run: ``.venv/bin/python tests/bench/append_script_bench.py --base-src DIR [--replica]
[--rounds 60] [--sessions 500] [--repeats 6]``

The same load for both: rounds of ``--sessions`` appends (one ~60-byte event
each, one session each) pipelined on one connection, to one redis-server
(with ``--replica``, one replica of it), the scripts alternating run by run.
Measured from the server's ``INFO``: CPU (user + sys) and the replication
offset per append; a log's ``MEMORY USAGE`` per event at the end. ``DIR``
is another checkout (``git worktree add DIR COMMIT``) whose
``gateway/store/redis_scripts.py`` gives the other script.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import redis

ROOT = Path(__file__).resolve().parents[2]
EVENT = b'{"type":"respond","session":"s","seq":0,"text":"some token"}'


def scripts_of(tree: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"scripts_{name}", tree / "gateway/store/redis_scripts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-src", type=Path, required=True)
    p.add_argument("--replica", action="store_true")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--sessions", type=int, default=500)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--port", type=int, default=46379)
    args = p.parse_args()
    scripts = {
        "base": scripts_of(args.base_src, "base").APPEND,
        "this": scripts_of(ROOT, "this").APPEND,
    }
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2 if args.replica else 1):
            extra = ["--replicaof", "127.0.0.1", str(args.port)] if i else []
            procs.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--port",
                        str(args.port + i),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(Path(tmp)),
                        "--dbfilename",
                        f"dump{i}.rdb",
                        *extra,
                    ],
                    stdout=subprocess.DEVNULL,
                )
            )
        time.sleep(1.5)  # the replica's first sync (a bench: no readiness protocol)
        try:
            r = redis.Redis(port=args.port)
            for script in scripts.values():
                r.script_load(script.src)
            seqs: dict[str, int] = {}

            def info() -> tuple[float, int]:
                i = r.info("all")
                return float(i["used_cpu_user"]) + float(i["used_cpu_sys"]), int(
                    i["master_repl_offset"]
                )

            flagged = {name: "ARGV[6] == '1'" in script.src for name, script in scripts.items()}

            def run(name: str) -> tuple[float, float]:
                sha = scripts[name].sha
                cpu0, off0 = info()
                for _ in range(args.rounds):
                    pipe = r.pipeline(transaction=False)
                    for k in range(args.sessions):
                        sid = f"{name}{k}"
                        seq = seqs[sid] = seqs.get(sid, 0) + 1
                        if seq == 1:
                            r.set(f"rtgw:{{{sid}}}:lease", "n1")
                        keys = [f"rtgw:{{{sid}}}:{kind}" for kind in ("meta", "log", "history")]
                        # Since issue 43 the script takes a ``check`` flag before the data
                        # (the store sends 0 once it knows where the log ends).
                        check = ("1" if seq == 1 else "0",) if flagged[name] else ()
                        pipe.evalsha(
                            sha, 4, *keys, f"rtgw:{{{sid}}}:lease", "n1", 86_400_000, 10_000,
                            seq, 1, *check, EVENT,
                        )  # fmt: skip
                    if not all(x == 1 for x in pipe.execute()):
                        sys.exit(f"{name}: an append was refused")
                cpu1, off1 = info()
                n = args.rounds * args.sessions
                return (cpu1 - cpu0) / n * 1e6, (off1 - off0) / n

            results: dict[str, list[tuple[float, float]]] = {"base": [], "this": []}
            for rep in range(args.repeats):
                for name in ("base", "this") if rep % 2 == 0 else ("this", "base"):
                    results[name].append(run(name))
            print(
                f"{args.rounds} rounds x {args.sessions} appends, {args.repeats} runs each, "
                f"{'with' if args.replica else 'no'} replica"
            )
            for name, runs in results.items():
                cpu = [c for c, _ in runs]
                print(
                    f"  {name}: Redis µs/append median {statistics.median(cpu):.2f} "
                    f"(runs {', '.join(f'{c:.2f}' for c in cpu)}); replication bytes/append "
                    f"{statistics.median([b for _, b in runs]):.0f}"
                )
            events = seqs["this0"]
            used = r.memory_usage("rtgw:{this0}:log", samples=0) or 0
            print(f"  a log of {events} events: {used:,} bytes ({used / events:.1f} per event)")
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
