"""Shared plumbing of the benchmarks: processes, CPU and memory readings, tables.

Every server a benchmark measures (gateway, relay, simulator, redis) runs as
its own process, bound to 127.0.0.1, so its CPU time and RSS can be read from
``/proc`` without counting the load generator. The load generator is the
``gateway.client.loadtest`` engine running in the benchmark's own process.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.redis_server import RedisServer, free_port  # noqa: E402

__all__ = [
    "OTHER_LIMIT",
    "ROOT",
    "CpuSample",
    "Proc",
    "RedisServer",
    "Servers",
    "cpu_seconds",
    "free_port",
    "gateway_proc",
    "median",
    "output_tail",
    "pin",
    "raise_nofile",
    "redis_server",
    "relay_proc",
    "rss_bytes",
    "servers",
    "sim_proc",
    "start_py_spy",
    "table",
    "wait_for_quiet_machine",
]

OTHER_LIMIT = 0.1
"""Cores other processes may use during a measured run before it is measured again."""

_LISTENING = re.compile(r"listening on (ws://\S+)")
_TICK = os.sysconf("SC_CLK_TCK")


def raise_nofile(need: int = 0) -> int:
    """Soft open-file limit up to the hard limit (children inherit it), as ``gateway
    serve`` raises its own; with ``need`` above the hard limit, the hard limit too
    where this process may (root: ``CAP_SYS_RESOURCE``), as an operator's
    ``LimitNOFILE=`` would."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if need > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
            soft, hard = need, need
        except (ValueError, OSError):
            pass  # not allowed: the hard limit it is
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    # After "pid (comm)": state is field 3; utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _TICK


@dataclass(frozen=True)
class RedisCounters:
    """What a Redis server says it did (``INFO``): its own CPU, commands, bytes in.

    Redis's CPU from ``INFO cpu`` (``used_cpu_user`` + ``used_cpu_sys``: every
    thread of the server, as ``/proc`` would count it, but read from the server
    that served the gateway even when it runs elsewhere). Subtract two readings
    and divide by the events of the window for a per-event figure.
    """

    cpu_s: float
    commands: int
    net_input_bytes: int
    used_memory: int

    def __sub__(self, other: RedisCounters) -> RedisCounters:
        return RedisCounters(
            self.cpu_s - other.cpu_s,
            self.commands - other.commands,
            self.net_input_bytes - other.net_input_bytes,
            self.used_memory - other.used_memory,
        )


def redis_counters(url: str) -> RedisCounters:
    """One ``INFO`` of the Redis at ``url`` (a short-lived connection of its own)."""
    import redis  # the project's dependency; imported here so benches without Redis skip it

    client = redis.Redis.from_url(url)
    try:
        info = client.info("all")
    finally:
        client.close()
    return RedisCounters(
        float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        int(info["total_commands_processed"]),
        int(info["total_net_input_bytes"]),
        int(info["used_memory"]),
    )


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy (not idle or iowait) since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK


class CpuSample:
    """CPU seconds of several processes at one instant (``None`` pid = this process).

    ``share`` also reports ``other``: CPU the rest of the machine used meanwhile
    (other tests, other users). Figures taken while ``other`` is high are noise.
    """

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.t = time.perf_counter()
        self.machine = machine_busy_seconds()
        self.cpu = {
            name: (time.process_time() if pid is None else cpu_seconds(pid))
            for name, pid in pids.items()
        }

    def share(self, later: CpuSample) -> dict[str, float]:
        """Each process's CPU use between the two samples, in cores (1.0 = one core busy)."""
        wall = later.t - self.t
        shares = {name: (later.cpu[name] - self.cpu[name]) / wall for name in self.cpu}
        machine = (later.machine - self.machine) / wall
        shares["other"] = max(0.0, machine - sum(shares.values()))
        return shares


def wait_for_quiet_machine(limit: float = 0.25, timeout: float = 600.0) -> float:
    """Wait (up to ``timeout``) until the machine's CPU use over 2 s is below ``limit`` cores.

    Benchmarks on a shared 2-core machine are meaningless while something else
    runs; returns the last reading so the caller can print it either way.
    """
    deadline = time.monotonic() + timeout
    while True:
        before, t0 = machine_busy_seconds(), time.monotonic()
        time.sleep(2.0)
        busy = (machine_busy_seconds() - before) / (time.monotonic() - t0)
        if busy < limit or time.monotonic() > deadline:
            return busy
        print(
            f"  (machine busy: {busy:.2f} cores used by other processes; waiting)", file=sys.stderr
        )


class Proc:
    """A server subprocess that prints ``… listening on ws://…`` once ready.

    A server that prints something else (LiteLLM's uvicorn) passes the line
    that says it is ready as ``ready_line`` and its ``url``; with only ``url``
    it is ready once that port accepts connections.
    """

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        ready_line: str | None = None,
        url: str = "",
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.cwd = cwd or ROOT
        self.args = list(args)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.url = ""
        self._ready_line = ready_line
        self._known_url = url
        self.output: list[str] = []
        self._ready = threading.Event()
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> Proc:
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )
        threading.Thread(target=self._read, daemon=True).start()
        if self._known_url and self._ready_line is None:
            self.url = self._known_url
            self._ready.set()
        if not self._ready.wait(timeout) or not self.url:
            self.stop()
            raise RuntimeError(f"{self.name} did not start:\n{''.join(self.output)}")
        # ``gateway sim`` prints its line before it binds: wait for the port too.
        host, _, port = self.url.split("/")[2].rpartition(":")
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError as exc:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    output = "".join(self.output)
                    raise RuntimeError(f"{self.name} is not accepting:\n{output}") from exc
                time.sleep(0.05)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if len(self.output) < 2000:
                self.output.append(line)
            if self._ready_line is not None:
                if self._ready_line in line and not self.url:
                    self.url = self._known_url
                    self._ready.set()
                continue
            m = _LISTENING.search(line)
            if m and not self.url:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> Proc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sim_proc(*, tokens_per_second: float = 0.0, chunk_size: int = 4) -> Proc:
    """``gateway sim`` on a free port (its URL is ``ws://127.0.0.1:P/v1/realtime``)."""
    port = free_port()
    return Proc(
        "sim",
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tokens-per-second",
            str(tokens_per_second),
            "--chunk-size",
            str(chunk_size),
        ],
    )


def gateway_proc(sim_url: str, redis_url: str | None) -> Proc:
    """``gateway serve`` with the OpenAI adapter pointed at a separate simulator process."""
    base = sim_url.removesuffix("/realtime")
    args = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--provider",
        "openai",
        "--model",
        "sim",
        "--log-level",
        "WARNING",
    ]
    if redis_url:
        args += ["--redis", redis_url]
    env = {"GATEWAY_OPENAI_BASE_URL": base, "OPENAI_API_KEY": "sim", "REDIS_URL": ""}
    # Extra gateway settings for experiments: BENCH_GATEWAY_ENV="GATEWAY_LEASE_TTL=60 ...".
    for pair in os.environ.get("BENCH_GATEWAY_ENV", "").split():
        name, _, value = pair.partition("=")
        env[name] = value
    return Proc("gateway", args, env)


def relay_proc(sim_url: str, *, passthrough: bool = False) -> Proc:
    """The minimal relay of ``relay_baseline.py`` in front of the same simulator
    (``passthrough``: every frame forwarded verbatim, both ways)."""
    return Proc(
        "relay",
        [
            sys.executable,
            str(ROOT / "tests" / "bench" / "relay_baseline.py"),
            "--upstream",
            sim_url.removesuffix("/realtime"),
            "--port",
            "0",
            *(["--passthrough"] if passthrough else []),
        ],
    )


@contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (numbers right-aligned)."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            if v != v:
                return "-"
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.2f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [
        "  ".join(
            h.rjust(w) if i else h.ljust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    ]
    for r in cells:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return "\n".join(lines)


def py_spy_path() -> str:
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        raise RuntimeError("py-spy is not installed: .venv/bin/pip install py-spy")
    return spy


async def start_py_spy(pid: int, seconds: float, out: Path) -> asyncio.subprocess.Process:
    """``py-spy record`` of ``pid`` for ``seconds``, collapsed stacks to ``out`` (raw format).

    Install it with ``.venv/bin/pip install py-spy``. ``--nonblocking`` samples
    without pausing the process, so the measured run is not slowed down.
    """
    return await asyncio.create_subprocess_exec(
        py_spy_path(),
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, round(seconds))),
        "--rate",
        "200",
        "--format",
        "raw",
        "--nonblocking",
        "--output",
        str(out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@dataclass
class Servers:
    """The processes of one benchmark: redis, the simulator, the gateway, the relay."""

    redis: RedisServer
    sim: Proc
    gateway: Proc
    relay: Proc | None

    def pids(self, server: Proc) -> dict[str, int | None]:
        """What ``CpuSample`` reads: the measured server, the simulator, redis, this client."""
        assert self.redis.proc is not None
        return {
            "server": server.pid,
            "sim": self.sim.pid,
            "client": None,
            "redis": self.redis.proc.pid,
        }


@contextmanager
def servers(
    *,
    tokens_per_second: float,
    chunk_size: int,
    use_redis: bool = True,
    relay: bool = True,
) -> Iterator[Servers]:
    """Start redis, the simulator, a gateway on both (and the relay); stop them after."""
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        redis = stack.enter_context(redis_server(Path(tmp)))
        sim = stack.enter_context(
            sim_proc(tokens_per_second=tokens_per_second, chunk_size=chunk_size)
        )
        gateway = stack.enter_context(gateway_proc(sim.url, redis.url if use_redis else None))
        relay_server = stack.enter_context(relay_proc(sim.url)) if relay else None
        yield Servers(redis, sim, gateway, relay_server)


def descendants(pid: int) -> list[int]:
    """The live processes ``pid`` started, and theirs (LiteLLM may fork workers)."""
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
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def pin_tasks(pids: Sequence[int], cpus: Sequence[int]) -> None:
    """Every thread of ``pids`` on ``cpus`` (``taskset -a``: threads started later
    inherit it)."""
    listed = ",".join(map(str, cpus))
    for pid in dict.fromkeys(pids):
        subprocess.run(["taskset", "-a", "-cp", listed, str(pid)], check=True, capture_output=True)


def pin(srv: Servers) -> str:
    """Give the measured servers a core of their own: gateway and relay on the last
    CPU, the harness (simulator, redis, this client) on the others.

    On 2 cores, four busy processes otherwise share both cores and the kernel's
    time slicing shows up as latency of whichever server is measured.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "not pinned (one CPU)"
    harness = cpus[:-1]
    assert srv.redis.proc is not None
    pin_tasks([srv.sim.pid, srv.redis.proc.pid, os.getpid()], harness)
    pin_tasks([proc.pid for proc in (srv.gateway, srv.relay) if proc is not None], cpus[-1:])
    return f"server on CPU {cpus[-1]}, simulator + redis + client on CPU {harness}"


def output_tail(proc: Proc, lines: int = 20) -> str:
    return "".join(proc.output[-lines:])
