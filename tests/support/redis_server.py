"""A real ``redis-server`` subprocess on loopback, for tests.

Tests run against the real server, not a fake: the store's Lua scripts,
stream ids, TTLs and reconnect behaviour are exactly what production sees.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RedisServer", "free_port"]


# Servers a test starts get ports below the kernel's ephemeral range, each worker
# (pytest-xdist's ``gw0``…) its own block, handed out in turn and not again until
# the block wraps. With ``bind(0)`` ports, a server killed by a failover test
# left its port free for the next server any worker started, and the test's
# clients, still dialling the dead node's address, were answered by that
# stranger: a Redis with none of the data (a lost lease, ``last_seq`` 0; seen in
# CI on two Cluster failover tests). A cluster node's bus port is its port +
# 10000, so handed-out ports stay below 20000 and bus ports below 30000.
_PORTS_FROM, _PORTS_TO, _BLOCKS = 10_000, 20_000, 8
_next_port: list[int] = []


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker[2:].isdigit() else 0
    size = (_PORTS_TO - _PORTS_FROM) // _BLOCKS
    start = _PORTS_FROM + (index % _BLOCKS) * size
    return range(start, start + size)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1, free now and not handed out before in this run (until
    this worker's block of 1,250 wraps)."""
    if _ephemeral_low() < _PORTS_TO + 10_000:  # an unusual range: take the kernel's pick
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    block = _block()
    if not _next_port:  # a random start, so two suites on one machine rarely meet
        _next_port.append(random.randrange(len(block)))
    for _ in range(len(block)):
        port = block[_next_port[0] % len(block)]
        _next_port[0] += 1
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {block}: stop other test runs on this machine")


class RedisServer:
    """Start, stop and restart one redis-server bound to 127.0.0.1."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        durable: bool = False,
        extra: Sequence[str] = (),
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: run `apt-get install redis-server` "
                "(.ci/run does this on a fresh machine)"
            )
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        # durable: an append-only file fsynced on every write, so a restart
        # (or a crash) keeps every acknowledged write, as production should.
        self.durable = durable
        self.extra = list(extra)  # more of redis-server's options (--requirepass X, …)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "yes" if self.durable else "no",
                "--appendfsync",
                "always",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "yes",
                "--loglevel",
                "warning",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        # Polling a port for readiness has no event to await; the loop is bounded.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
