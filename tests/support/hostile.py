"""What an attacker sends from outside, and what it costs the node: gzip bombs and RSS.

``gzip_bomb(n)`` is a gzip body that inflates to ``n`` zero bytes (about ``n / 1000``
bytes as sent); ``PeakRss`` samples a process's resident memory while a block runs.
"""

from __future__ import annotations

import functools
import os
import threading
import zlib

__all__ = ["PeakRss", "cpu_seconds", "gzip_bomb", "rss"]

_CHUNK = bytes(1 << 20)


@functools.cache
def gzip_bomb(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` zero bytes (cached: building 1 GB takes ~1 s)."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    parts = []
    left = inflated
    while left > 0:
        piece = _CHUNK if left >= len(_CHUNK) else _CHUNK[:left]
        parts.append(deflater.compress(piece))
        left -= len(piece)
    parts.append(deflater.flush())
    return b"".join(parts)


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used: what a probe cost the node,
    whatever else the machine runs meanwhile."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class PeakRss:
    """The highest RSS of a process while the block runs (sampled every 5 ms), and the
    CPU seconds it used (``cpu``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = rss(pid)
        self.cpu_before = cpu_seconds(pid)
        self.cpu = 0.0
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def grew(self) -> int:
        return self.peak - self.before

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss(self.pid))
        self.cpu = cpu_seconds(self.pid) - self.cpu_before

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss(self.pid))
        self.cpu = cpu_seconds(self.pid) - self.cpu_before
