"""Hot spots of a ``py-spy record --format raw`` profile (collapsed stacks).

Run: ``.venv/bin/python tests/bench/profile_summary.py PROFILE.raw [--top 25]``

Prints, as shares of all samples (py-spy samples only threads that are not
idle, so a share is a share of the CPU time the process used):

- *self*: the function on top of the stack (where the CPU actually was);
- *inclusive*: stacks containing the function anywhere (it or what it called).

Functions are keyed by name and file (line numbers dropped), so one function
sampled at many lines counts as one.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")


def _key(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    parts = path.replace("\\", "/").split("/")
    for anchor in ("site-packages", "python3.11", "python3.12", "python3.13", "main", "perf"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + 1 :]
            break
    short = "/".join(parts[-3:])
    return f"{m.group('func')} ({short})"


def load(path: Path) -> tuple[Counter[str], Counter[str], int]:
    """Self and inclusive sample counts per function, and the total."""
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_key(f) for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        self_counts[frames[-1]] += count
        for f in set(frames):
            inclusive[f] += count
    return self_counts, inclusive, total


# Where a gateway sample belongs: the first rule, in this order, that any frame
# of its stack matches (so a socket write made by the Redis store counts as the
# store's, and the adapter's recv inside the session loop as the adapter's).
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Redis store (group commit, leases)", ("gateway/store/", "redis/")),
    ("upstream: adapter recv + wire decode", ("OpenAIRealtime.recv", "openai_wire.py")),
    ("parser + session loop", ("protocol/", "gateway/sessions/", "protocol/steps.py")),
    ("client writer: websockets send + socket write", ("gateway/connection.py",)),
    ("socket reads + websockets frame parsing", ("_read_ready", "websockets/")),
    ("event loop: select, scheduling, timers", ("asyncio/", "selectors.py")),
)


def categorize(path: Path) -> list[tuple[str, float]]:
    """Share of samples per ``CATEGORIES`` entry (plus "other"), largest first."""
    counts: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_key(f) for f in stack.split(";")]
        total += count
        for name, patterns in CATEGORIES:
            if any(p in f for f in frames for p in patterns):
                counts[name] += count
                break
        else:
            counts["other"] += count
    return [(name, 100 * n / total) for name, n in counts.most_common()] if total else []


def summarize(path: Path, top: int = 25) -> str:
    self_counts, inclusive, total = load(path)
    if not total:
        return f"{path}: no samples"
    lines = [
        f"{path.name}: {total:,} samples",
        "",
        "  share %  category (first match, see CATEGORIES)",
    ]
    for name, share in categorize(path):
        lines.append(f"  {share:7.1f}  {name}")
    lines += ["", "  self %  function (where the CPU was)"]
    for func, n in self_counts.most_common(top):
        lines.append(f"  {100 * n / total:6.1f}  {func}")
    lines += ["", "  incl %  function (with what it called)"]
    for func, n in inclusive.most_common(top):
        lines.append(f"  {100 * n / total:6.1f}  {func}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summarize(args.profile, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
