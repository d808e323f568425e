"""Real replicated Redis setups on loopback, for tests and benches.

- ``ReplicatedRedis``: one primary and one replica (``--replicaof``).
- ``SentinelRedis``: a primary, a replica and three sentinels watching them.
- ``ClusterRedis``: a 3-master / 3-replica Redis Cluster made by
  ``redis-cli --cluster create … --cluster-replicas 1``.

Failure detection is tuned for tests (cluster-node-timeout 1,000 ms, sentinel
down-after 3,000 ms), so a ``kill -9`` of a primary is followed by a promoted
replica within a few seconds. Every wait is bounded; readiness polls the real
server state (``INFO replication``, ``CLUSTER INFO``), as there is no event to
await across processes.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from tests.support.redis_server import free_port

__all__ = [
    "ClusterRedis",
    "RedisProcess",
    "ReplicatedRedis",
    "SentinelRedis",
    "on_the_replica",
    "wait_until",
]

NODE_TIMEOUT_MS = 1000
# Not lower: a sentinel pings once a second, and right after a switch-master its
# link to the new primary is fresh. With down-after at 1,000 ms a PING answered
# a little late marked the new primary down and made a second failover (seen
# in about 1 run in 8 on this 2-core machine).
SENTINEL_DOWN_AFTER_MS = 3000


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` (a cross-process condition with no event to await) until true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout:g}s")


async def on_the_replica(store: Any, sid: str) -> None:
    """Return once a replica of ``sid``'s master has every write made there so far.

    ``WAIT`` counts the replicas that have its connection's own last write, and the
    store's ``exchange`` opens a connection of its own: one that wrote nothing is
    answered at once, whatever the replica lags. So it follows a write of its own (the
    replication stream is ordered: every earlier write is there once this one is)."""
    mark = store._key(sid, "replicated-mark")
    replies = await store._core.topology.exchange(mark, [("SET", mark, "1"), ("WAIT", 1, 5000)])
    assert replies[1] == 1, f"no replica acknowledged {sid}'s writes within 5 s: {replies}"


def cluster_port(taken: set[int]) -> int:
    """A free port P whose cluster bus port P + 10000 is free (and below 65536) too.

    ``taken`` holds the ports (and bus ports) already given to nodes not yet
    started, which still look free; the new pair is added to it.
    """
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535 or {port, port + 10000} & taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        taken.update((port, port + 10000))
        return port
    raise RuntimeError("no free port pair for a cluster node")


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: run `apt-get install redis-server`")
    return path


class RedisProcess:
    """One redis-server (or sentinel) on 127.0.0.1 with the given extra arguments."""

    def __init__(
        self,
        workdir: Path,
        args: Sequence[str] = (),
        *,
        sentinel: bool = False,
        port: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.args = list(args)
        self.sentinel = sentinel
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0)

    def start(self, *, replica_of: int | None = None) -> None:
        """Start (or start again); ``replica_of``: as a replica of that port on 127.0.0.1."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.sentinel:
            conf = self.workdir / "sentinel.conf"
            conf.write_text(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                + "\n".join(self.args)
                + "\n"
            )
            command = [_binary("redis-server"), str(conf), "--sentinel"]
        else:
            command = [
                _binary("redis-server"),
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--loglevel",
                "warning",
                # Replicas sync at once (the default waits 5 s for more replicas).
                "--repl-diskless-sync-delay",
                "0",
                *self.args,
            ]
            if replica_of is not None:
                command += ["--replicaof", "127.0.0.1", str(replica_of)]
        with (self.workdir / "server.log").open("ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=out, cwd=self.workdir)
        wait_until(self._answers, f"redis on port {self.port} answers", 10.0)

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            tail = (self.workdir / "server.log").read_text(errors="replace")[-800:]
            raise RuntimeError(
                f"redis-server on port {self.port} exited with {self.proc.returncode}:\n{tail}"
            )
        with self.client() as c:
            return bool(c.ping())

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _replica_in_sync(primary: RedisProcess) -> bool:
    with primary.client() as c:
        info = c.info("replication")
    return int(info.get("connected_slaves", 0)) >= 1 and "online" in str(info.get("slave0", {}))


class ReplicatedRedis:
    """A primary and one replica of it."""

    def __init__(self, workdir: Path) -> None:
        self.primary = RedisProcess(workdir / "primary")
        self.replica: RedisProcess | None = None
        self.workdir = workdir

    def start(self, *, replica_via: int | None = None) -> None:
        """``replica_via``: the replica dials this port (a ``netem`` proxy to the primary)."""
        self.primary.start()
        self.replica = RedisProcess(self.workdir / "replica")
        self.replica.start(replica_of=replica_via or self.primary.port)
        wait_until(lambda: _replica_in_sync(self.primary), "the replica syncs")

    def stop(self) -> None:
        for proc in (self.replica, self.primary):
            if proc is not None:
                proc.stop()


class SentinelRedis:
    """A primary, a replica and three sentinels (quorum 2) watching master ``name``."""

    def __init__(self, workdir: Path, name: str = "gwmaster") -> None:
        self.name = name
        self.workdir = workdir
        self.servers = ReplicatedRedis(workdir)
        self.sentinels: list[RedisProcess] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.name}"

    def start(self) -> None:
        self.servers.start()
        for i in range(3):
            sentinel = RedisProcess(
                self.workdir / f"sentinel{i}",
                [
                    f"sentinel monitor {self.name} 127.0.0.1 {self.servers.primary.port} 2",
                    f"sentinel down-after-milliseconds {self.name} {SENTINEL_DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {self.name} 5000",
                    f"sentinel parallel-syncs {self.name} 1",
                ],
                sentinel=True,
            )
            sentinel.start()
            self.sentinels.append(sentinel)
        wait_until(self._sentinels_see_everything, "the sentinels find the replica and each other")

    def _sentinels_see_everything(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client() as c:
                fields = c.sentinel_master(self.name)
                if int(fields["num-slaves"]) < 1 or int(fields["num-other-sentinels"]) < 2:
                    return False
        return True

    def master_port(self) -> int:
        with self.sentinels[0].client() as c:
            _host, port = c.sentinel_get_master_addr_by_name(self.name)
        return int(port)

    def failed_over_from(self, port: int) -> bool:
        """Every sentinel names a primary other than ``port``.

        Only the leader performs a failover; the others learn of it from its
        hello messages (every 2 s). A primary restarted before they all know
        is, for a stale sentinel, the master again (it is up and says
        ``role:master``), and a client asking that sentinel writes to it until
        Sentinel demotes it: Redis Sentinel's documented window, not the
        store's to close.
        """
        for sentinel in self.sentinels:
            with sentinel.client() as c:
                _host, reported = c.sentinel_get_master_addr_by_name(self.name)
            if int(reported) == port:
                return False
        return True

    def by_port(self, port: int) -> RedisProcess:
        servers = [self.servers.primary, self.servers.replica]
        return next(s for s in servers if s is not None and s.port == port)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        self.servers.stop()


class ClusterRedis:
    """Three masters with one replica each, slots spread by ``redis-cli --cluster create``.

    ``full_coverage`` is Redis' ``cluster-require-full-coverage`` (its default,
    yes): every master refuses commands (``CLUSTERDOWN``) while any slot has no
    live master, so one master's failover stalls every shard. With no, the
    other masters keep serving their slots: what the gateway recommends
    (docs/operations.md).
    """

    def __init__(self, workdir: Path, *, full_coverage: bool = True) -> None:
        taken: set[int] = set()
        self.nodes = [
            RedisProcess(
                workdir / f"node{i}",
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    "--cluster-require-full-coverage",
                    "yes" if full_coverage else "no",
                    # Elections and syncs are notices: a failed test's report shows them.
                    "--loglevel",
                    "notice",
                ],
                port=cluster_port(taken),
            )
            for i in range(6)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3])
        return f"redis+cluster://{hosts}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [
                _binary("redis-cli"),
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
        wait_until(self.healthy, "the cluster is up with a replica per master", 30.0)

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok`` and each master has an online replica."""
        for node in self.nodes:
            if not node.alive:
                continue
            with node.client() as c:
                if c.cluster("info")["cluster_state"] != "ok":
                    return False
        masters = [n for n in self.nodes if n.alive and self.role(n) == "master"]
        return len(masters) == 3 and all(_replica_in_sync(m) for m in masters)

    def role(self, node: RedisProcess) -> str:
        with node.client() as c:
            return str(c.info("replication")["role"])

    def master_of(self, key: str) -> RedisProcess:
        """The live master that holds ``key``'s slot now."""
        for node in self.nodes:
            if not node.alive:
                continue
            with node.client() as c:
                slot = c.cluster("keyslot", key)
                for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(master[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError("no live node answers")

    def describe(self) -> str:
        """For a failed test's report: each node's role and offsets, and its log's tail
        (elections, syncs, state changes), as the cluster saw what happened."""
        lines = []
        for node in self.nodes:
            if node.alive:
                try:
                    with node.client() as c:
                        info = c.info("replication")
                    state = ", ".join(
                        f"{k}={info[k]}"
                        for k in ("role", "master_repl_offset", "slave0", "master_port")
                        if k in info
                    )
                except redis.RedisError as exc:
                    state = f"no answer ({exc})"
            else:
                state = "dead"
            lines.append(f"node :{node.port}: {state}")
            log = node.workdir / "server.log"
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-12:]
                lines.extend(f"    {line}" for line in tail)
        return "\n".join(lines)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
