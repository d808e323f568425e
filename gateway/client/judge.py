"""Judging a load test: thresholds (``--fail-if``) and a diff with an earlier run (``--compare``).

A threshold is ``NAME OP NUMBER`` with OP one of ``> >= < <= ==``, e.g.
``p99_ttft_ms>200`` or ``errors>0``. NAME is a latency figure
``{p50,p95,p99,max,mean}_{connect,ttfe,ttft,gap,turn}_ms``, ``errors`` (all
error kinds together), or any numeric field of the report (``turns_failed``,
``events_per_s``…). A threshold that holds fails the run: CI can gate on the
figures the report prints, and the message names which one and its value.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from gateway.client.report import LatencySummary, LoadTestReport

__all__ = ["Threshold", "compare_reports", "parse_threshold"]

_STATS: Final = ("p50", "p95", "p99", "max", "mean")
_METRICS: Final = ("connect", "ttfe", "ttft", "gap", "turn")
_PATTERN: Final = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|==|>|<)\s*(-?[0-9.]+)\s*$")
_NUMERIC: Final = frozenset(
    f.name
    for f in msgspec.structs.fields(LoadTestReport)
    if f.type in (int, float) and f.name != "sample_cap"
)


class Threshold(msgspec.Struct, frozen=True):
    """``name op limit``: the run fails when it holds."""

    name: str
    op: str
    limit: float

    def value(self, report: LoadTestReport) -> float:
        return figure(report, self.name)

    def broken(self, report: LoadTestReport) -> bool:
        value = self.value(report)
        return {
            ">": value > self.limit,
            ">=": value >= self.limit,
            "<": value < self.limit,
            "<=": value <= self.limit,
            "==": value == self.limit,
        }[self.op]

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.limit:g}"


def parse_threshold(text: str) -> Threshold:
    """``"p99_ttft_ms>200"`` → ``Threshold``; ``ValueError`` says what a valid one looks like."""
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(
            f"--fail-if {text!r}: write NAME OP NUMBER, e.g. p99_ttft_ms>200 or errors>0"
        )
    name, op, number = match.groups()
    try:
        limit = float(number)
    except ValueError:
        raise ValueError(f"--fail-if {text!r}: {number!r} is not a number") from None
    if not _known(name):
        names = ", ".join(sorted(_NUMERIC))
        raise ValueError(
            f"--fail-if {text!r}: unknown figure {name!r}; use "
            f"{{{','.join(_STATS)}}}_{{{','.join(_METRICS)}}}_ms, errors, or one of: {names}"
        )
    return Threshold(name, op, limit)


def _known(name: str) -> bool:
    if name == "errors" or name in _NUMERIC:
        return True
    parts = name.split("_")
    return len(parts) == 3 and parts[0] in _STATS and parts[1] in _METRICS and parts[2] == "ms"


def figure(report: LoadTestReport, name: str) -> float:
    """One named figure of a report (see the module docstring)."""
    if name == "errors":
        return float(sum(report.errors.values()))
    if name in _NUMERIC:
        return float(getattr(report, name))
    stat, metric, _ = name.split("_")
    summary: LatencySummary = getattr(report, metric)
    return float(getattr(summary, f"{stat}_ms"))


_COMPARED: Final = (
    "events_per_s",
    "turns_ok",
    "turns_failed",
    "errors",
    *(f"{s}_{m}_ms" for m in ("connect", "ttft", "turn", "gap") for s in ("p50", "p99")),
)


def compare_reports(old: LoadTestReport, new: LoadTestReport) -> str:
    """A table of the main figures of an earlier run, this run, and the change."""
    lines = [f"  {'compared with':<16}{'before':>12}{'now':>12}{'change':>10}"]
    for name in _COMPARED:
        a, b = figure(old, name), figure(new, name)
        change = "" if a == b else ("new" if a == 0 else f"{(b - a) / a * 100:+.1f}%")
        lines.append(f"  {name:<16}{a:>12,.2f}{b:>12,.2f}{change:>10}")
    return "\n".join(lines)
