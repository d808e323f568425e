"""Small assertions shared by the tools tests."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.calls import ToolResult
from tests.support.stall import LoopWatch

SECRET = "the secret outside the workspace"

Call = Callable[..., Awaitable[ToolResult]]


def ok(result: ToolResult) -> Any:
    """The content of a success result (fails the test with the message otherwise)."""
    assert result.status == "success", result.content
    return result.content


def failed(result: ToolResult) -> str:
    """The message of a failure result (fails the test if the call succeeded)."""
    assert result.status == "failure", f"expected a failure, got {result.content!r}"
    assert isinstance(result.content, str)
    return result.content


# ---------------------------------------------------------------------- is the node held?


def _status_kib(field: str, pid: int | str = "self") -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert match, f"no {field} in /proc/{pid}/status"
    return int(match[1])


class PeakRss:
    """How far a process's resident memory rose above where it was, at its peak.

    The kernel's high-water mark (``VmHWM``) is reset first (``clear_refs``
    5), so a transient peak that was freed again still counts.
    """

    def __init__(self, pid: int | str = "self") -> None:
        self.pid = pid
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        self.start_kib = _status_kib("VmRSS", pid)

    @property
    def growth_mb(self) -> float:
        return (_status_kib("VmHWM", self.pid) - self.start_kib) / 1024


@dataclass
class Footprint:
    """What one call cost the process: wall time, the longest loop stall, peak RSS growth."""

    seconds: float = 0.0
    max_gap: float = 0.0
    rss_growth_mb: float = 0.0

    def __str__(self) -> str:
        return (
            f"{self.seconds:.2f} s, loop stall max {self.max_gap * 1000:.0f} ms, "
            f"peak RSS +{self.rss_growth_mb:.1f} MB"
        )


@contextlib.asynccontextmanager
async def footprint() -> AsyncIterator[Footprint]:
    """Measure the block: ``async with footprint() as cost: ...; print(cost)``."""
    cost = Footprint()
    rss = PeakRss()
    started = time.monotonic()
    async with LoopWatch(0.02) as watch:
        yield cost
    cost.seconds = time.monotonic() - started
    cost.max_gap = watch.longest
    cost.rss_growth_mb = rss.growth_mb
