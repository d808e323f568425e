"""What ``gateway loadtest`` measures and how it is reported.

Latency figures are percentiles of raw samples, not of histograms: each metric
keeps every sample up to ``cap`` and, past that, a uniform random sample of
them (a reservoir, Li's "Algorithm L", so a long run costs bounded memory and
one random draw per replaced sample, not per sample). ``count``, ``mean`` and
``max`` are exact over all samples; percentiles are exact while ``count <=
cap`` and estimates beyond. Percentiles use the nearest-rank rule, so every
reported percentile is a value that was measured, and ``p50 <= p95 <= p99 <=
max`` always holds.

The report is a ``msgspec.Struct`` (``--json FILE`` writes it as is) and
renders as a compact text table for the terminal.
"""

from __future__ import annotations

import bisect
import math
import random
from array import array
from typing import Final

import msgspec

__all__ = [
    "DEFAULT_SAMPLE_CAP",
    "HISTOGRAM_EDGES_MS",
    "Histogram",
    "LatencySummary",
    "LoadTestReport",
    "Reservoir",
    "decode_report",
    "encode_report",
    "format_report",
    "percentile",
]

DEFAULT_SAMPLE_CAP: Final = 1_000_000
"""Samples kept per metric (8 bytes each): exact percentiles up to this many."""


def percentile(ordered: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of an ascending list."""
    if not ordered:
        return 0.0
    rank = math.ceil(p / 100.0 * len(ordered))
    return ordered[min(max(rank, 1), len(ordered)) - 1]


class Reservoir:
    """Raw samples of one metric (seconds), bounded by a uniform reservoir."""

    __slots__ = ("_next", "_rng", "_w", "cap", "count", "max", "samples", "total")

    def __init__(self, cap: int = DEFAULT_SAMPLE_CAP, *, seed: int | None = None) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self.samples = array("d")
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self._rng = random.Random(seed)
        self._w = 1.0
        self._next = 0  # the sample count at which the next replacement happens

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        if value > self.max:
            self.max = value
        samples = self.samples
        if len(samples) < self.cap:
            samples.append(value)
            if len(samples) == self.cap:
                self._w = math.exp(math.log(self._random()) / self.cap)
                self._skip()
            return
        if self.count == self._next:
            samples[self._rng.randrange(self.cap)] = value
            self._w *= math.exp(math.log(self._random()) / self.cap)
            self._skip()

    def _random(self) -> float:
        # (0, 1]: log() needs a positive argument.
        return 1.0 - self._rng.random()

    def _skip(self) -> None:
        w = self._w
        if w >= 1.0:  # only when cap is huge relative to the draw; replace the next one
            self._next = self.count + 1
            return
        gap = math.floor(math.log(self._random()) / math.log1p(-w))
        self._next = self.count + gap + 1

    def summary(self) -> LatencySummary:
        """Count, mean, p50/p95/p99 and max, in milliseconds."""
        if self.count == 0:
            return LatencySummary()
        ordered = sorted(self.samples)
        ms = 1000.0
        return LatencySummary(
            count=self.count,
            mean_ms=self.total / self.count * ms,
            p50_ms=percentile(ordered, 50) * ms,
            p95_ms=percentile(ordered, 95) * ms,
            p99_ms=percentile(ordered, 99) * ms,
            max_ms=self.max * ms,
            sampled=len(ordered) < self.count,
        )


HISTOGRAM_EDGES_MS: Final = (
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    50.0,
    100.0,
    200.0,
    500.0,
    1000.0,
    2000.0,
    5000.0,
)
"""Upper bounds of the histogram buckets (ms); a last bucket holds everything above."""


class Histogram(msgspec.Struct, kw_only=True):
    """Counts of samples per latency bucket: ``counts[i]`` is ``<= edges_ms[i]``, the last ``>``.

    Built from the kept samples (all of them up to the reservoir's cap), so the
    shape is exact below the cap and a uniform sample's shape above it.
    """

    edges_ms: list[float] = msgspec.field(default_factory=lambda: list(HISTOGRAM_EDGES_MS))
    counts: list[int] = msgspec.field(default_factory=list)


def histogram(reservoir: Reservoir) -> Histogram:
    """The bucket counts of a reservoir's samples."""
    counts = [0] * (len(HISTOGRAM_EDGES_MS) + 1)
    for value in reservoir.samples:
        counts[bisect.bisect_left(HISTOGRAM_EDGES_MS, value * 1000.0)] += 1
    return Histogram(counts=counts)


class LatencySummary(msgspec.Struct, kw_only=True):
    """One latency metric over a run, in milliseconds (all zero when ``count`` is 0)."""

    count: int = 0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    sampled: bool = False
    """True when percentiles come from a reservoir sample (more samples than the cap)."""


class LoadTestReport(msgspec.Struct, kw_only=True):
    """The outcome of one load test (``--json FILE`` writes exactly this).

    Latencies: ``connect`` is TCP + WebSocket handshake + the ``session``
    frame; ``ttfe`` the time from sending a user message to the first event
    of the turn (the gateway's echo of the message); ``ttft`` to the first
    model output (``think``/``respond``/``call``); ``gap`` the time between
    consecutive events of a turn; ``turn`` from sending the message to the
    event that ends the turn (``metric`` after ``end``).
    """

    url: str
    sessions: int
    turns_per_session: int
    ramp_s: float
    think_time_s: float
    hold_s: float
    message_chars: int
    duration_cap_s: float
    turn_timeout_s: float
    started_at: str
    """UTC, ISO 8601."""
    elapsed_s: float
    stopped_by_duration: bool
    stopped_by_request: bool = False
    """``LoadTest.stop()`` ended the run before every session had finished."""
    sessions_connected: int
    sessions_failed: int
    """Sessions that never got their ``session`` frame (not counting those the
    ``duration`` cap stopped before they connected)."""
    sessions_peak_open: int
    turns_planned: int
    turns_ok: int
    turns_failed: int
    turns_aborted: int
    """Turns in flight when the ``--duration`` cap stopped the run."""
    turns_skipped: int
    """Turns never sent (their session failed or the run was stopped)."""
    events: int
    events_per_s: float
    events_by_type: dict[str, int]
    coalesced_frames: int = 0
    """Frames that carried several chunks (``seq_from..seq``): the gateway merges
    consecutive chunks for a client that falls behind. ``events`` counts frames."""
    coalesced_chunks: int = 0
    """Chunks carried by those frames."""
    bytes_received: int
    connect: LatencySummary
    ttfe: LatencySummary
    ttft: LatencySummary
    gap: LatencySummary
    turn: LatencySummary
    errors: dict[str, int]
    """Count of each kind: ``http_404``, ``connect_refused``, ``connect_timeout``,
    ``close_1012``, ``error_upstream`` (an error event's code), ``turn_timeout``,
    ``seq_gap``, ``seq_duplicate``, ``bad_frame``, ``interrupt`` …"""
    error_examples: dict[str, str]
    """The first message seen of each error kind."""
    sample_cap: int
    ttft_histogram: Histogram = msgspec.field(default_factory=Histogram)
    speech_to_respond: LatencySummary = msgspec.field(default_factory=LatencySummary)
    """``--audio`` runs: from the last frame of the spoken file sent to the first
    ``respond`` (includes the VAD's silence wait, the simulator's 500 ms by default)."""
    """Time to first token per bucket (empty in reports of older versions)."""
    turn_histogram: Histogram = msgspec.field(default_factory=Histogram)

    @property
    def ok(self) -> bool:
        """Every planned turn succeeded and nothing went wrong."""
        return (
            not self.errors
            and self.turns_ok == self.turns_planned
            and self.sessions_connected == self.sessions
        )


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(LoadTestReport)


def encode_report(report: LoadTestReport) -> bytes:
    """The report as indented JSON (what ``--json FILE`` writes)."""
    return msgspec.json.format(_encoder.encode(report), indent=2) + b"\n"


def decode_report(data: bytes | str) -> LoadTestReport:
    return _decoder.decode(data)


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _ms(value: float) -> str:
    if value < 10:
        return f"{value:.3f}"
    return f"{value:,.2f}" if value < 100 else f"{value:,.1f}"


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def format_report(r: LoadTestReport) -> str:
    """A compact text table of ``r`` for the terminal."""
    lines = [
        f"load test {r.url}",
        f"  {r.sessions} sessions x {r.turns_per_session} turns, ramp {r.ramp_s:g}s, "
        f"think {r.think_time_s:g}s, message {r.message_chars} chars"
        + (f", hold {r.hold_s:g}s" if r.hold_s else ""),
        f"  elapsed {r.elapsed_s:.2f}s"
        + ("  (stopped by the --duration cap)" if r.stopped_by_duration else "")
        + ("  (stopped)" if r.stopped_by_request else "")
        + f"   events {_n(r.events)} ({_n(r.events_per_s)}/s)   received {_size(r.bytes_received)}",
        f"  sessions  connected {r.sessions_connected}/{r.sessions}  failed {r.sessions_failed}"
        f"  peak open {r.sessions_peak_open}",
        f"  turns     ok {r.turns_ok}/{r.turns_planned}  failed {r.turns_failed}"
        f"  aborted {r.turns_aborted}  skipped {r.turns_skipped}",
        "",
        f"  {'latency (ms)':<14}{'count':>9}{'p50':>10}{'p95':>10}{'p99':>10}{'max':>10}{'mean':>10}",
    ]
    rows: tuple[tuple[str, LatencySummary], ...] = (
        ("connect", r.connect),
        ("first event", r.ttfe),
        ("first token", r.ttft),
        ("event gap", r.gap),
        ("turn", r.turn),
    )
    if r.speech_to_respond.count:
        rows = (*rows, ("speech→respond", r.speech_to_respond))
    for name, s in rows:
        mark = "~" if s.sampled else " "
        lines.append(
            f"  {name:<14}{s.count:>9,}{_ms(s.p50_ms):>10}{_ms(s.p95_ms):>10}"
            f"{_ms(s.p99_ms):>10}{_ms(s.max_ms):>10}{_ms(s.mean_ms):>10}{mark}"
        )
    if any(s.sampled for _, s in rows):
        lines.append(f"  ~ percentiles from a uniform sample of {r.sample_cap:,} per metric")
    lines.append("")
    for title, hist in (("first token", r.ttft_histogram), ("turn", r.turn_histogram)):
        if sum(hist.counts):
            lines.extend(format_histogram(title, hist))
            lines.append("")
    if r.coalesced_frames:
        lines.append(
            f"  coalesced: {r.coalesced_frames:,} frames carried {r.coalesced_chunks:,} chunks "
            "(the client fell behind)"
        )
    if r.events_by_type:
        by_type = ", ".join(f"{k} {v:,}" for k, v in sorted(r.events_by_type.items()))
        lines.append(f"  events by type: {by_type}")
    if r.errors:
        lines.append("  errors:")
        for kind, count in sorted(r.errors.items(), key=lambda kv: (-kv[1], kv[0])):
            example = r.error_examples.get(kind, "")
            lines.append(f"    {kind:<24}{count:>8,}  {example[:100]}")
    else:
        lines.append("  errors: none")
    return "\n".join(lines)


def format_histogram(title: str, hist: Histogram, width: int = 40) -> list[str]:
    """Text bars of the non-empty span of buckets."""
    counts = hist.counts
    used = [i for i, n in enumerate(counts) if n]
    if not used:
        return []
    top = max(counts)
    lines = [f"  {title} (ms)"]
    for i in range(used[0], used[-1] + 1):
        label = f"<= {hist.edges_ms[i]:g}" if i < len(hist.edges_ms) else f"> {hist.edges_ms[-1]:g}"
        bar = "#" * max(1 if counts[i] else 0, round(counts[i] / top * width))
        lines.append(f"    {label:>9} {counts[i]:>9,} {bar}")
    return lines
