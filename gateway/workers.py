"""``gateway serve --workers N``: one node per CPU core on one machine.

A gateway node is one asyncio event loop, so it uses one core. N worker
processes bind the same port with ``SO_REUSEPORT`` (the kernel spreads new
connections between them) and share sessions through Redis exactly as nodes
on different machines do: each is a node with its own id (``ID-w0``,
``ID-w1``, …). The supervisor forwards SIGTERM/SIGINT (each worker drains),
and restarts a worker that crashed. It also gives the workers one metrics
directory, so ``/metrics`` on any worker reports them all (``gateway.metrics``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from types import FrameType

from prometheus_client import multiprocess

from gateway.config import Config, ConfigError
from gateway.metrics import MULTIPROC_ENV

__all__ = ["check_workers", "supervise"]

log = logging.getLogger("gateway.workers")


def check_workers(config: Config) -> None:
    """Refuse settings that cannot work with several workers, saying what to set."""
    if config.workers == 1:
        return
    if not config.store:
        raise ConfigError(
            f"--workers {config.workers} needs a shared session store: set --store "
            "(GATEWAY_STORE or REDIS_URL) to a Redis URL (with the in-process store each worker would hold its own sessions)"
        )
    if config.port == 0:
        raise ConfigError(
            f"--workers {config.workers} needs a fixed --port for the workers to share"
        )


def supervise(config: Config, argv: Sequence[str]) -> int:
    """Run ``config.workers`` worker processes until a signal; returns the exit code."""
    metrics_dir = tempfile.mkdtemp(prefix="rtgw-metrics-")
    try:
        return _supervise(config, argv, metrics_dir)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _supervise(config: Config, argv: Sequence[str], metrics_dir: str) -> int:
    stopping = False
    procs: dict[int, subprocess.Popen[bytes]] = {}
    env = {**os.environ, MULTIPROC_ENV: metrics_dir}

    def command(index: int) -> list[str]:
        # The same flags; later ones win: one worker, this id, a shared port.
        return [
            sys.executable,
            "-m",
            "gateway.cli",
            *argv,
            "--workers",
            "1",
            "--reuse-port",
            "--node-id",
            f"{config.node_id}-w{index}",
        ]

    def start(index: int) -> None:
        procs[index] = subprocess.Popen(command(index), env=env)

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for index in range(config.workers):
        start(index)
    log.info("supervising %d workers on port %d", config.workers, config.port)
    restarts: dict[int, float] = {}
    while any(proc.returncode is None for proc in procs.values()):
        try:
            pid, status = os.waitpid(-1, 0)  # sleep until a worker exits
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries this
            continue
        for index, proc in list(procs.items()):
            if proc.pid != pid:
                continue
            proc.returncode = code = os.waitstatus_to_exitcode(status)
            # Its live gauges (connections, sessions) stop counting; its counters stay.
            multiprocess.mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]
            recent = time.monotonic() - restarts.get(index, -10.0) < 5.0
            if not stopping and code != 0 and not recent:
                # A crash: start it again (at most once every 5 s per worker).
                log.warning("worker %d exited with %d; restarting it", index, code)
                restarts[index] = time.monotonic()
                start(index)
    codes = [proc.returncode or 0 for proc in procs.values()]
    return max(codes, default=0)
