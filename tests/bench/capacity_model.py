"""Nodes, cores and Redis shards for N concurrent sessions, from measured figures.

Run: ``.venv/bin/python tests/bench/capacity_model.py [--sessions 10000,100000,1000000]
[--headroom 0.6] [--FIGURE VALUE ...]``

Every default below is a figure measured in this repository (docs/capacity.md
names the bench and the command that produced each); a flag replaces one, so
the table can be redone from a new measurement or another machine. Nothing
here measures anything: it is arithmetic, written out so it can be checked.

The model, per workload (text, voice):

- **events/s** = sessions × each session's mean event rate (logged events
  the gateway delivers; for voice also the client's audio frames in, which
  cost node CPU but are not logged);
- **node cores** = the CPU of those events (µs per event, measured per node
  core at load) ÷ ``--headroom`` of a core (a node is one event loop: one
  core; ``gateway serve --workers N`` runs one per core);
- **node memory** = sessions × memory per session (idle connection + what a
  session that had a turn holds), against ``--node-memory-gib`` per core;
  the larger of the CPU and memory counts is the node count;
- **Redis shards (CPU)** = the Redis CPU of the appends (Redis µs per
  event, measured: a round carries many sessions' events, so this is per
  event, not per command) plus lease renewals (one script call per session
  every ``lease_ttl / 3``) ÷ ``--headroom`` of a shard's one core;
- **Redis shards (memory)** = sessions × bytes stored per session
  (events per session-minute × bytes per event × the minutes a log holds,
  bounded by ``max_log`` entries) ÷ ``--shard-memory-gib`` (×2 with a
  replica per master, counted as machines, not shards);
- **the first bottleneck**: which of CPU and memory sets the node count, and
  which sets the shard count.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

KIB = 1024
GIB = 1024**3


@dataclass(frozen=True)
class Workload:
    name: str
    events_per_s: float
    """Logged events a session delivers per second, averaged over its life."""
    frames_per_s: float
    """Audio frames relayed per second, in and out (node CPU, not logged)."""


@dataclass(frozen=True)
class Row:
    workload: str
    sessions: int
    events_per_s: float
    node_cores_cpu: int
    node_cores_memory: int
    redis_shards_cpu: int
    redis_shards_memory: int
    redis_ops_per_s: float
    stored_gib: float
    bottleneck: str

    @property
    def node_cores(self) -> int:
        return max(self.node_cores_cpu, self.node_cores_memory)

    @property
    def redis_shards(self) -> int:
        return max(self.redis_shards_cpu, self.redis_shards_memory)


def plan(w: Workload, sessions: int, a: argparse.Namespace) -> Row:
    events = sessions * w.events_per_s
    frames = sessions * w.frames_per_s
    # Node CPU: events and inbound frames, at most --headroom of each core.
    node_cpu_s = (events * a.node_us_per_event + frames * a.node_us_per_frame) / 1e6
    node_cpu_s += sessions / 10_000 * a.idle_cores_per_10k
    node_cores_cpu = math.ceil(node_cpu_s / a.headroom)
    # Node memory: every session has had a turn (the worst case of a busy fleet).
    memory = sessions * a.session_kib * KIB
    node_cores_memory = math.ceil(memory / (a.node_memory_gib * GIB * a.headroom))
    # Redis CPU: appends (per event, group commit included) + lease renewals.
    renewals = sessions / (a.lease_ttl / 3)
    redis_cpu_s = (events * a.redis_us_per_event + renewals * a.redis_us_per_renewal) / 1e6
    redis_shards_cpu = math.ceil(redis_cpu_s / a.headroom)
    ops = events * a.redis_cmds_per_event + renewals
    # Redis memory: what a session's log holds (bounded by max_log) at once.
    held = min(w.events_per_s * 60 * a.log_minutes, a.max_log)
    stored = sessions * (held * a.stored_bytes_per_event + a.session_overhead_bytes)
    redis_shards_memory = math.ceil(stored / (a.shard_memory_gib * GIB * a.headroom))
    node_limit = "CPU" if node_cores_cpu >= node_cores_memory else "memory"
    redis_limit = "CPU" if redis_shards_cpu >= redis_shards_memory else "memory"
    return Row(
        w.name,
        sessions,
        events,
        node_cores_cpu,
        node_cores_memory,
        redis_shards_cpu,
        redis_shards_memory,
        ops,
        stored / GIB,
        f"nodes: {node_limit}; Redis: {redis_limit}",
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", default="10000,100000,1000000")
    p.add_argument("--headroom", type=float, default=0.6, help="share of a core/memory to plan to")
    g = p.add_argument_group("workloads (assumptions: change them to yours)")
    g.add_argument(
        "--text-events-per-s",
        type=float,
        default=3.3,
        help="a 100-delta reply every 30 s (default 3.3)",
    )
    g.add_argument(
        "--voice-events-per-s",
        type=float,
        default=5.0,
        help="logged events of a voice session: transcripts, controls (default 5)",
    )
    g.add_argument(
        "--voice-frames-per-s",
        type=float,
        default=60.0,
        help="audio frames relayed: 50 in (20 ms frames) + 10 out (default 60)",
    )
    m = p.add_argument_group("measured (docs/capacity.md: where each comes from)")
    m.add_argument("--node-us-per-event", type=float, default=80.0)
    m.add_argument("--node-us-per-frame", type=float, default=17.0)
    m.add_argument("--idle-cores-per-10k", type=float, default=0.16)
    m.add_argument("--session-kib", type=float, default=59.6)
    m.add_argument("--redis-us-per-event", type=float, default=8.1)
    m.add_argument("--redis-cmds-per-event", type=float, default=1.3)
    m.add_argument("--redis-us-per-renewal", type=float, default=5.9)
    m.add_argument("--stored-bytes-per-event", type=float, default=98.5)
    m.add_argument(
        "--session-overhead-bytes",
        type=float,
        default=2000.0,
        help="meta, lease, history keys of a session (an assumption, not measured)",
    )
    c = p.add_argument_group("deployment")
    c.add_argument("--node-memory-gib", type=float, default=2.0, help="per node core")
    c.add_argument("--shard-memory-gib", type=float, default=25.0)
    c.add_argument("--lease-ttl", type=float, default=10.0)
    c.add_argument("--max-log", type=float, default=10_000)
    c.add_argument(
        "--log-minutes",
        type=float,
        default=30.0,
        help="minutes of events a live session's log holds",
    )
    a = p.parse_args()
    workloads = [
        Workload("text", a.text_events_per_s, 0.0),
        Workload("voice", a.voice_events_per_s, a.voice_frames_per_s),
    ]
    print(
        f"headroom {a.headroom:.0%} of each core and each memory budget; node: one core, "
        f"{a.node_memory_gib:g} GiB; shard: one Redis master core, {a.shard_memory_gib:g} GiB "
        f"(+ its replica); lease_ttl {a.lease_ttl:g} s; logs hold {a.log_minutes:g} min "
        f"(≤ {a.max_log:,.0f} events)"
    )
    header = (
        f"{'workload':8} {'sessions':>10} {'events/s':>11} {'node cores':>11} "
        f"{'(cpu/mem)':>11} {'shards':>7} {'(cpu/mem)':>10} {'Redis ops/s':>12} "
        f"{'stored GiB':>11}  first bottleneck"
    )
    print(header)
    for w in workloads:
        for n in (int(s) for s in a.sessions.split(",")):
            r = plan(w, n, a)
            print(
                f"{r.workload:8} {r.sessions:>10,} {r.events_per_s:>11,.0f} {r.node_cores:>11,} "
                f"{f'{r.node_cores_cpu}/{r.node_cores_memory}':>11} {r.redis_shards:>7,} "
                f"{f'{r.redis_shards_cpu}/{r.redis_shards_memory}':>10} "
                f"{r.redis_ops_per_s:>12,.0f} {r.stored_gib:>11,.1f}  {r.bottleneck}"
            )


if __name__ == "__main__":
    main()
