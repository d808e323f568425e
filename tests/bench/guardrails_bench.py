"""What output guardrails add per event: a gateway with rules against one without.

Run: ``PYTHONPATH=. python tests/bench/guardrails_bench.py [--sessions 50,200] [--rounds 3]``

Two gateway processes in turn (memory store), each on the same paced
simulator (4-character chunks): one with no rules, one with the output rules
of ``RULES`` (card, phone, email detectors and a 12-character pattern). N
sessions run one turn each at once; the answer is prose with a card number in
it. Per event the client notes when it arrived after the turn's ``user``
echo; per character of prose (the card aside: the rule is meant to hold it)
the mean arrival time is compared between the two gateways. Printed: that
difference per event (the hold-back plus the CPU), and the gateway's CPU
microseconds per event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from gateway.client import Client
from gateway.metrics import Metrics
from gateway.sessions.guard import EventGuard, guardrails_of, parse_rules
from protocol.events import End, Respond, User
from tests.bench.benchlib import gateway_proc, sim_proc, table

RULES = """
[[rule]]
name = "cards"
on = "output"
action = "redact"
detect = "card"

[[rule]]
name = "phones"
on = "output"
action = "redact"
detect = "phone"

[[rule]]
name = "emails"
on = "output"
action = "redact"
detect = "email"

[[rule]]
name = "codes"
on = "output"
action = "redact"
pattern = "(?i)launch codes"
"""

PROSE = (
    "Thanks for waiting. I looked at your account and everything is in order; "
    "the payment went through on the card ending as shown. "
)
ANSWER = (
    PROSE * 2 + "Your card 4111 1111 1111 1111 is on file. " + PROSE * 2 + "Anything else today?"
)
TOKENS_PER_SECOND = 10.0


async def one_turn(url: str) -> tuple[list[tuple[float, str]], int]:
    """(arrival after the echo, text) of each respond event of one turn; events seen."""
    arrivals: list[tuple[float, str]] = []
    events = 0
    async with Client(url) as c:
        start = 0.0
        async for event in c.send(f"/raw {ANSWER}<end>"):
            events += 1
            now = time.perf_counter()
            if isinstance(event, User):
                start = now
            elif isinstance(event, Respond):
                arrivals.append((now - start, event.content))
    return arrivals, events


def per_char(arrivals: list[tuple[float, str]]) -> list[float]:
    """Arrival time of each character of the prose before the card (equal in both runs)."""
    times: list[float] = []
    for t, text in arrivals:
        times += [t] * len(text)
    return times[: ANSWER.index("4111")]


async def run(url: str, sessions: int) -> tuple[float, int]:
    turns = await asyncio.gather(*(one_turn(url) for _ in range(sessions)))
    means = [statistics.fmean(per_char(a)) for a, _ in turns]
    return statistics.fmean(means), sum(n for _, n in turns)


def measure(sim_url: str, sessions: int, rules: Path | None) -> tuple[float, float]:
    """(mean arrival of a prose character in s, gateway CPU µs per event)."""
    if rules is not None:
        os.environ["BENCH_GATEWAY_ENV"] = f"GATEWAY_GUARDRAILS={rules}"
    else:
        os.environ.pop("BENCH_GATEWAY_ENV", None)
    with gateway_proc(sim_url, None) as gw:
        asyncio.run(run(gw.url, 4))  # warm up
        cpu = gw.cpu()
        mean, events = asyncio.run(run(gw.url, sessions))
        used = gw.cpu() - cpu
    return mean, used / max(events, 1) * 1e6


def in_process(rules_text: str) -> float:
    """µs per event the session's guard takes, in this process (no I/O, no load)."""
    specs = parse_rules(tomllib.loads(rules_text)["rule"], "bench")
    compiled = guardrails_of(specs)
    assert not isinstance(compiled, str)
    chunks = [ANSWER[i : i + 4] for i in range(0, len(ANSWER), 4)]
    best = float("inf")
    for _ in range(5):
        guard = EventGuard(compiled, Metrics(), lambda: None)
        started = time.perf_counter()
        for _ in range(20):
            for chunk in chunks:
                guard.filter(Respond(content=chunk))
            guard.filter(End())
        best = min(best, (time.perf_counter() - started) / (20 * (len(chunks) + 1)))
    return best * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sessions", default="50,200")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    card_only = RULES.split("[[rule]]")[1]
    sets = {"card": "[[rule]]" + card_only, "all": RULES}
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        sim_proc(tokens_per_second=TOKENS_PER_SECOND, chunk_size=4) as sim,
    ):
        files: dict[str, Path | None] = {"none": None}
        for name, text in sets.items():
            path = files[name] = Path(tmp) / f"{name}.toml"
            path.write_text(text)
        for n in (int(s) for s in args.sessions.split(",")):
            # Interleaved rounds, medians: the machine is shared, and its load drifts.
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in files}
            for _ in range(args.rounds):
                for name, path in files.items():
                    runs[name].append(measure(sim.url, n, path))
            base = statistics.median(m for m, _ in runs["none"])
            base_cpu = statistics.median(c for _, c in runs["none"])
            row: list[object] = [n, f"{base * 1000:.0f}", f"{base_cpu:.0f}"]
            for name in sets:
                mean = statistics.median(m for m, _ in runs[name])
                cpu = statistics.median(c for _, c in runs[name])
                row += [f"{(mean - base) * 1000:+.1f}", f"{cpu - base_cpu:+.0f}"]
            rows.append(row)
    print(
        f"answer of {len(ANSWER)} characters in 4-character chunks at {TOKENS_PER_SECOND:g} "
        f"chunks/s; card: one output rule (detect = card); all: card, phone, email and a "
        f"12-character pattern; medians of {args.rounds} interleaved rounds"
    )
    print(
        table(
            [
                "sessions",
                "prose char arrives, no rules (ms)",
                "gateway CPU/event (µs)",
                "card: added/event (ms)",
                "CPU (µs)",
                "all: added/event (ms)",
                "CPU (µs)",
            ],
            rows,
        )
    )
    print(
        f"in process, the guard alone: card {in_process(sets['card']):.1f} µs/event, "
        f"all {in_process(RULES):.1f} µs/event"
    )


if __name__ == "__main__":
    sys.exit(main())
