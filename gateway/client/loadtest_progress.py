"""What a running load test shows as it goes: its live totals, and the progress line.

``LoadTestCounters`` are read from other tasks while the test runs
(benchmarks, the progress writer); ``show_progress`` writes an updating bar or
periodic lines to stderr. Apart from the engine (``gateway.client.loadtest``),
which only counts: how a run is shown changes for its readers, not its sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TextIO

from gateway.client.loadtest_config import LoadTestConfig

__all__ = ["LoadTestCounters", "progress_line", "show_progress"]


class LoadTestCounters:
    """Live totals of a running test (read them from another task: benches, progress)."""

    __slots__ = (
        "bytes",
        "coalesced_chunks",
        "coalesced_frames",
        "errors",
        "events",
        "peak_open",
        "sessions_connected",
        "sessions_failed",
        "sessions_open",
        "turns_aborted",
        "turns_failed",
        "turns_ok",
        "turns_skipped",
    )

    def __init__(self) -> None:
        self.events = 0
        self.coalesced_frames = 0
        self.coalesced_chunks = 0
        self.bytes = 0
        self.errors = 0
        self.sessions_open = 0
        self.peak_open = 0
        self.sessions_connected = 0
        self.sessions_failed = 0
        self.turns_ok = 0
        self.turns_failed = 0
        self.turns_aborted = 0
        self.turns_skipped = 0


async def show_progress(
    config: LoadTestConfig,
    counters: LoadTestCounters,
    out: TextIO,
    done: asyncio.Event,
    t0: float,
) -> None:
    """Write progress to ``out`` every interval, and once more when ``done`` is set."""
    bar = config.progress == "bar"
    interval = config.progress_interval or (0.5 if bar else 5.0)
    last_events, last_t = 0, t0
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), interval)
        t = time.perf_counter()
        events = counters.events
        rate = (events - last_events) / (t - last_t) if t > last_t else 0.0
        last_events, last_t = events, t
        line = progress_line(config, counters, t - t0, rate, bar=bar)
        if bar:
            out.write("\r" + line + "\x1b[K")
            if done.is_set():
                out.write("\n")
        else:  # periodic lines, and a last one when the run ends
            out.write(line + "\n")
        out.flush()


def progress_line(
    cfg: LoadTestConfig, c: LoadTestCounters, elapsed: float, rate: float, *, bar: bool
) -> str:
    """One line of progress: elapsed, sessions open, turns done, events/s, errors."""
    planned = cfg.sessions * cfg.turns
    done = c.turns_ok + c.turns_failed + c.turns_aborted + c.turns_skipped
    text = (
        f"{elapsed:7.1f}s  open {c.sessions_open:>5}/{cfg.sessions}"
        f"  turns {c.turns_ok + c.turns_failed:>7,}/{planned:,}"
        f"  {rate:>9,.0f} ev/s  errors {c.errors:,}"
    )
    if not bar:
        return "loadtest " + text
    frac = done / planned if planned else 0.0
    filled = min(20, int(frac * 20))
    return f"[{'#' * filled}{'.' * (20 - filled)}] {text}"
