"""What output guardrails add per event: a gateway with rules against one without.

Run: ``PYTHONPATH=. python tests/bench/guardrails_bench.py [--sessions 50,200] [--rounds 3]
[--parts written,spoken]``

Two gateway processes in turn (memory store), each on the same paced
simulator (4-character chunks): one with no rules, one with the output rules
of ``RULES`` (card, phone, email detectors and a 12-character pattern). N
sessions run one turn each at once; the answer is prose with a card number in
it. Per event the client notes when it arrived after the turn's ``user``
echo; per character of prose (the card aside: the rule is meant to hold it)
the mean arrival time is compared between the two gateways. Printed: that
difference per event (the hold-back plus the CPU), and the gateway's CPU
microseconds per event.

Then the same for a spoken answer (``output = "audio"``, the simulator's 60 ms
of audio a character, each chunk's audio before its transcript): per
millisecond of the audio before the card, when it arrived after the message
was sent, with no rules and with the ``card`` rule (whose audio waits for the
transcript after it to be judged).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Final

import msgspec
from websockets.asyncio.client import connect

from gateway.client import Client
from gateway.metrics import Metrics
from gateway.sessions.guard import EventGuard
from gateway.sessions.guardrail_rules import guardrails_of, parse_rules
from protocol.audio import AUDIO_HEADER_BYTES
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
SPOKEN_MS_PER_CHAR = 60  # the simulator's default


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


async def one_spoken_turn(url: str) -> float:
    """Mean arrival (after the message was sent) of the audio before the card."""
    frames: list[tuple[float, int]] = []
    async with connect(url, max_size=None) as ws:
        await ws.recv()  # session
        await ws.send(msgspec.json.encode({"type": "configure", "output": "audio"}).decode())
        while msgspec.json.decode(await ws.recv()).get("type") != "configured":
            pass
        await ws.send(msgspec.json.encode({"type": "user", "content": f"/raw {ANSWER}"}).decode())
        sent, closing = time.perf_counter(), False
        while True:
            frame = await ws.recv()
            if isinstance(frame, bytes):
                frames.append((time.perf_counter() - sent, len(frame) - AUDIO_HEADER_BYTES))
                continue
            kind = msgspec.json.decode(frame).get("type")
            if kind in ("end", "cancelled"):
                closing = True
            elif kind == "metric" and closing:
                break
    # The audio of the prose before the card's chunk (4-character chunks, 48 bytes a ms).
    wanted = (ANSWER.index("4111") - 4) * SPOKEN_MS_PER_CHAR * 48
    total = weighted = 0.0
    for t, size in frames:
        take = min(size, wanted - total)
        if take <= 0:
            break
        total += take
        weighted += t * take
    assert total == wanted, f"{total} of {wanted} bytes of audio came"
    return weighted / total


def measure_spoken(sim_url: str, sessions: int, rules: Path | None) -> float:
    """Mean arrival of a ms of the spoken answer's audio before its card, in s."""
    if rules is not None:
        os.environ["BENCH_GATEWAY_ENV"] = f"GATEWAY_GUARDRAILS={rules}"
    else:
        os.environ.pop("BENCH_GATEWAY_ENV", None)

    async def run_all(n: int) -> float:
        return statistics.fmean(await asyncio.gather(*(one_spoken_turn(gw.url) for _ in range(n))))

    with gateway_proc(sim_url, None) as gw:
        asyncio.run(run_all(4))  # warm up
        return asyncio.run(run_all(sessions))


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


CARD_ONLY: Final = "[[rule]]" + RULES.split("[[rule]]")[1]


def written(sessions: list[int], rounds: int) -> None:
    """The table of a written answer: no rules, the card rule, all four."""
    sets = {"card": CARD_ONLY, "all": RULES}
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        sim_proc(tokens_per_second=TOKENS_PER_SECOND, chunk_size=4) as sim,
    ):
        files: dict[str, Path | None] = {"none": None}
        for name, text in sets.items():
            path = Path(tmp) / f"{name}.toml"
            path.write_text(text)
            files[name] = path
        for n in sessions:
            # Interleaved rounds, medians: the machine is shared, and its load drifts.
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in files}
            for _ in range(rounds):
                for name, rules in files.items():
                    runs[name].append(measure(sim.url, n, rules))
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
        f"12-character pattern; medians of {rounds} interleaved rounds"
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
        f"in process, the guard alone: card {in_process(CARD_ONLY):.1f} µs/event, "
        f"all {in_process(RULES):.1f} µs/event"
    )


def spoken(sessions: list[int], rounds: int) -> None:
    """The table of a spoken answer: no rules against the card rule."""
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        sim_proc(tokens_per_second=TOKENS_PER_SECOND, chunk_size=4) as sim,
    ):
        card = Path(tmp) / "card.toml"
        card.write_text(CARD_ONLY)
        for n in sessions:
            runs: dict[str, list[float]] = {"none": [], "card": []}
            for _ in range(rounds):
                runs["none"].append(measure_spoken(sim.url, n, None))
                runs["card"].append(measure_spoken(sim.url, n, card))
            base = statistics.median(runs["none"])
            added = statistics.median(runs["card"]) - base
            rows.append([n, f"{base * 1000:.0f}", f"{added * 1000:+.1f}"])
    print(
        "spoken answer, the audio before the card (the card rule cuts the answer there); "
        f"medians of {rounds} interleaved rounds"
    )
    print(table(["sessions", "audio ms arrives, no rules (ms)", "card: added/audio (ms)"], rows))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sessions", default="50,200")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parts", default="written,spoken", help="written, spoken or both")
    args = p.parse_args()
    sessions = [int(s) for s in args.sessions.split(",")]
    parts = args.parts.split(",")
    if "written" in parts:
        written(sessions, args.rounds)
    if "spoken" in parts:
        spoken(sessions, args.rounds)


if __name__ == "__main__":
    main()
