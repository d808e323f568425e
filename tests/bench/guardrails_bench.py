"""What output guardrails add per event: a gateway with rules against one without.

Run: ``PYTHONPATH=. python tests/bench/guardrails_bench.py [--sessions 50,200]``

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
from pathlib import Path

from gateway.client import Client
from protocol.events import Respond, User
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
TOKENS_PER_SECOND = 25.0


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sessions", default="50,200")
    args = p.parse_args()
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        sim_proc(tokens_per_second=TOKENS_PER_SECOND, chunk_size=4) as sim,
    ):
        rules = Path(tmp) / "rules.toml"
        rules.write_text(RULES)
        for n in (int(s) for s in args.sessions.split(",")):
            base, base_cpu = measure(sim.url, n, None)
            guarded, guarded_cpu = measure(sim.url, n, rules)
            rows.append(
                [
                    n,
                    f"{base * 1000:.1f}",
                    f"{guarded * 1000:.1f}",
                    f"{(guarded - base) * 1000:+.1f}",
                    f"{base_cpu:.0f}",
                    f"{guarded_cpu:.0f}",
                ]
            )
    print(
        f"answer of {len(ANSWER)} characters in 4-character chunks at "
        f"{TOKENS_PER_SECOND:g} chunks/s; 4 output rules (card, phone, email, a 12-char pattern)"
    )
    print(
        table(
            [
                "sessions",
                "prose char arrives, no rules (ms)",
                "with rules (ms)",
                "added per event (ms)",
                "gateway CPU/event, no rules (µs)",
                "with rules (µs)",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
