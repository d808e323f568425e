"""Gateway and simulator nodes as real subprocesses (multi-node, crash, drain tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["NodeProcess"]

_LISTENING = re.compile(r"(?:gateway|simulator) listening on (\S+)")


class NodeProcess:
    """``gateway serve …`` or ``gateway sim …`` in a subprocess.

    ``start()`` returns once the process prints its listening line (the URL is
    parsed from it), so tests wait for an event, not a sleep. Output is kept
    in ``self.output`` for assertions and failure messages.
    """

    def __init__(
        self, args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.args = [sys.executable, "-m", "gateway.cli", *args]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.output: list[str] = []
        self._ready = threading.Event()
        self._lines = threading.Condition()
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> NodeProcess:
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout):
            self.kill()
            raise RuntimeError(f"{self.args} did not start in {timeout}s:\n{self.log}")
        if not self.url:
            raise RuntimeError(f"{self.args} exited before listening:\n{self.log}")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lines:
                self.output.append(line)
                self._lines.notify_all()
            m = _LISTENING.search(line)
            if m and not self.url:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def wait_for_lines(self, pattern: str, count: int = 1, timeout: float = 30.0) -> None:
        """Block until ``count`` output lines matched ``pattern`` (woken per line)."""
        regex = re.compile(pattern)

        def enough() -> bool:
            return sum(1 for line in self.output if regex.search(line)) >= count

        with self._lines:
            if not self._lines.wait_for(enough, timeout):
                raise TimeoutError(f"{count} lines matching {pattern!r} not seen:\n{self.log}")

    @property
    def log(self) -> str:
        return "".join(self.output)

    @property
    def base(self) -> str:
        """``ws://host:port`` of the node."""
        m = re.match(r"(wss?://[^/]+)", self.url)
        assert m, self.url
        return m.group(1)

    @property
    def http(self) -> str:
        return self.base.replace("ws://", "http://", 1)

    def terminate(self) -> None:
        """SIGTERM: a graceful drain."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.wait(10)

    def wait(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def stop(self) -> None:
        self.terminate()
        self.wait(30)

    def __enter__(self) -> NodeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
