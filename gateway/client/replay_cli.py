"""``gateway replay FILE --url ws://…``: the command line of a replay, and its report.

The recording is untrusted input: it is read within ``MAX_RECORDING_BYTES``
(``gateway.client.files``) and planned strictly (``replay_plan``), so a file
that is not one to replay is one line on stderr, before any connection. The
API key is ``--token`` or, better (a command line is visible to every
process), the ``GATEWAY_TOKEN`` environment variable.

Exit status: 0 the replay changed nothing beyond the thresholds (or a fork
was left open); 1 something changed; 2 a flag out of range, the file is not
a recording to replay, the gateway cannot be reached or refused, or the
report cannot be written.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path
from typing import Final, TextIO

import msgspec

from gateway.client.dial import TOKEN_ENV, ClientError, normalize_url, token_from_env
from gateway.client.files import FileRefused, read_bounded
from gateway.client.replay import ReplayOptions, ReplayRefused, ReplayResult, replay
from gateway.client.replay_plan import MAX_RECORDING_BYTES, Plan, PlanError, plan_replay
from gateway.client.transcript import Thresholds, Turn, TurnDiff, first_difference, shown

__all__ = ["add_replay_arguments", "format_result", "run_replay_cli"]

DEFAULT_URL: Final = "ws://127.0.0.1:8765/v1/realtime"
MAX_TEXT_BYTES: Final = 1 << 20


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "recording", metavar="FILE.jsonl", help="a recording (gateway recording get)"
    )
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"the gateway to replay on ({DEFAULT_URL})"
    )
    parser.add_argument(
        "--token",
        help=f"an API key of that gateway (Bearer): replay configures (default: ${TOKEN_ENV}, "
        "which other processes cannot read as they can a command line)",
    )
    what = parser.add_argument_group("what the replay changes")
    what.add_argument("--provider", help="replay on this provider instead of the recorded one")
    what.add_argument("--model", help="replay with this model instead of the recorded one")
    what.add_argument(
        "--instructions-file",
        type=Path,
        metavar="FILE",
        help="replay with these instructions instead of the recorded ones",
    )
    fork = parser.add_argument_group("forking")
    fork.add_argument(
        "--fork-at",
        type=int,
        metavar="SEQ",
        help="replay what the user did before the recorded event SEQ, then leave the session "
        "open (its id is printed) for the app, or go on in a chat (--chat)",
    )
    fork.add_argument("--chat", action="store_true", help="with --fork-at: go on in gateway chat")
    judge = parser.add_argument_group("what counts as a change (exit status 1)")
    judge.add_argument(
        "--min-similarity",
        type=float,
        default=Thresholds().min_similarity,
        metavar="R",
        help="an answer less alike than R (0..1, word by word) is a change (default %(default)s: "
        "the same words; against a real model, 0.8 say)",
    )
    judge.add_argument(
        "--latency-factor",
        type=float,
        default=0.0,
        metavar="F",
        help="a turn that takes more than F times as long to end (+100 ms) is a change (0: off)",
    )
    judge.add_argument(
        "--tokens-factor",
        type=float,
        default=0.0,
        metavar="F",
        help="a turn with more than F times the tokens is a change (0: off)",
    )
    judge.add_argument(
        "--cost-factor",
        type=float,
        default=0.0,
        metavar="F",
        help="a turn costing more than F times as much is a change (0: off)",
    )
    out = parser.add_argument_group("the run")
    out.add_argument("--report", type=Path, metavar="FILE.json", help="write the report as JSON")
    out.add_argument(
        "--idle-max",
        type=float,
        default=1.0,
        metavar="S",
        help="the longest wait between turns, whatever the recorded user took (default 1 s)",
    )
    out.add_argument(
        "--turn-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="how long the replayed session may take to catch up with the recorded one",
    )


class _Report(msgspec.Struct):
    recording: str
    url: str
    session_id: str
    changed: bool
    thresholds: Thresholds
    turns: list[TurnDiff]
    notes: list[str]


def flag_problem(ns: argparse.Namespace) -> str | None:
    """What is wrong with the flags' values, in one line (None: nothing)."""
    if ns.fork_at is not None and ns.fork_at < 1:
        return f"--fork-at {ns.fork_at}: give the seq of a recorded event (1 or more)"
    if ns.chat and ns.fork_at is None:
        return "--chat goes on in a forked session: give --fork-at SEQ too"
    if not (math.isfinite(ns.min_similarity) and 0 <= ns.min_similarity <= 1):
        return (
            f"--min-similarity {ns.min_similarity:g}: give a ratio from 0 to 1 (1: the same words)"
        )
    for flag, value in (
        ("--latency-factor", ns.latency_factor),
        ("--tokens-factor", ns.tokens_factor),
        ("--cost-factor", ns.cost_factor),
    ):
        if not (math.isfinite(value) and value >= 0):
            return f"{flag} {value:g}: give a factor >= 0 (0: off)"
    if not (math.isfinite(ns.idle_max) and 0 <= ns.idle_max <= 3600):
        return f"--idle-max {ns.idle_max:g}: give seconds from 0 to 3600"
    if not (math.isfinite(ns.turn_timeout) and 0 < ns.turn_timeout <= 86400):
        return f"--turn-timeout {ns.turn_timeout:g}: give seconds above 0 (at most 86400)"
    return None


def read_plan(path: Path, fork_at: int | None) -> Plan:
    """A recording file, read within bounds and planned (``FileRefused``, ``PlanError``,
    ``OSError``)."""
    return plan_replay(read_bounded(path, MAX_RECORDING_BYTES, "a recording"), fork_at=fork_at)


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file of at most ``MAX_TEXT_BYTES`` (``FileRefused``, ``OSError``)."""
    data = read_bounded(path, MAX_TEXT_BYTES, what)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise FileRefused(f"{path} is not UTF-8 text (byte {exc.start}): give {what}") from None


async def run_replay_cli(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    """``gateway replay``: plan, replay, print the report; the exit status."""
    out = out or sys.stdout
    err = sys.stderr
    problem = flag_problem(ns)
    if problem is not None:
        print(f"gateway replay: {problem}", file=err)
        return 2
    token = ns.token or token_from_env()
    try:
        plan = await asyncio.to_thread(read_plan, Path(ns.recording), ns.fork_at)
        instructions = (
            await asyncio.to_thread(read_text, ns.instructions_file, "an instructions file")
            if ns.instructions_file is not None
            else None
        )
        url, note = normalize_url(ns.url)
    except OSError as exc:
        print(f"gateway replay: cannot read {exc.filename}: {exc.strerror or exc}", file=err)
        return 2
    except FileRefused as exc:
        print(f"gateway replay: {exc}", file=err)
        return 2
    except (PlanError, ClientError) as exc:
        print(f"gateway replay: {ns.recording}: {exc}", file=err)
        return 2
    if note:
        print(f"gateway replay: {note}", file=err)
    options = ReplayOptions(
        url=url,
        token=token,
        provider=ns.provider,
        model=ns.model,
        instructions=instructions,
        fork_at=ns.fork_at,
        idle_max=ns.idle_max,
        turn_timeout=ns.turn_timeout,
        thresholds=Thresholds(
            min_similarity=ns.min_similarity,
            latency_factor=ns.latency_factor,
            tokens_factor=ns.tokens_factor,
            cost_factor=ns.cost_factor,
        ),
    )
    try:
        result = await replay(plan, options)
    except (ClientError, ReplayRefused) as exc:
        print(f"gateway replay: {exc}", file=err)
        return 2
    out.write(format_result(plan, result, options))
    out.flush()
    if ns.report is not None:
        report = _Report(
            recording=str(ns.recording),
            url=url,
            session_id=result.session_id,
            changed=result.changed,
            thresholds=options.thresholds,
            turns=result.turns,
            notes=result.notes,
        )
        try:
            await asyncio.to_thread(
                ns.report.write_bytes, msgspec.json.format(msgspec.json.encode(report))
            )
        except OSError as exc:
            print(f"gateway replay: cannot write {ns.report}: {exc.strerror or exc}", file=err)
            return 2
    if ns.fork_at is not None:
        if ns.chat:
            from gateway.client.chat import run_chat

            return await run_chat(
                url, token=token, color=sys.stdout.isatty(), session_id=result.session_id
            )
        return 0
    return 1 if result.changed else 0


def format_result(plan: Plan, result: ReplayResult, options: ReplayOptions) -> str:
    """The report for a terminal: a row per turn (recorded → replayed), then what changed."""
    lines = [
        f"replayed {len(plan.actions)} user actions of session {plan.header.session_id} "
        f"on {options.url}: new session {result.session_id}",
        "",
    ]
    header = (
        "turn",
        "user",
        "ended",
        "tools",
        "alike",
        "first token ms",
        "end ms",
        "tokens",
        "cost $",
    )
    rows = [header]
    for diff in result.turns:
        rec, rep = diff.recorded, diff.replayed
        rows.append(
            (
                f"{diff.index}{' *' if diff.changed else ''}",
                _clip((rec or rep).user if (rec or rep) else "", 28),  # type: ignore[union-attr]
                _pair(rec, rep, lambda t: t.outcome),
                _pair(rec, rep, lambda t: ",".join(u.name for u in t.tools) or "-"),
                shown(diff.similarity),
                _pair(rec, rep, lambda t: _ms(t.first_token_ms)),
                _pair(rec, rep, lambda t: _ms(t.end_ms)),
                _pair(rec, rep, lambda t: str(t.input_tokens + t.output_tokens)),
                _pair(rec, rep, lambda t: f"{t.cost:.4f}"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    lines.append("")
    changed = [d for d in result.turns if d.changed]
    th = options.thresholds
    if options.fork_at is not None:
        lines.append(
            f"forked at seq {options.fork_at}: session {result.session_id} is open; resume it with "
            f"session_id={result.session_id} (gateway chat {options.url} --session={result.session_id})"
        )
    elif not changed:
        lines.append(
            f"no change beyond thresholds (answers at least {th.min_similarity:g} alike; tool "
            "calls, their arguments and how each turn ended the same)"
        )
    for diff in changed:
        lines.append(f"turn {diff.index} changed: " + "; ".join(diff.changes))
        rec, rep = diff.recorded, diff.replayed
        if rec is not None and rep is not None and rec.answer != rep.answer:
            then, now = first_difference(rec.answer, rep.answer)
            lines.append(f"  recorded: {_clip(then, 200)}")
            lines.append(f"  replayed: {_clip(now, 200)}")
    for note in result.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def _pair(rec: Turn | None, rep: Turn | None, show: object) -> str:
    assert callable(show)
    then = show(rec) if rec is not None else "-"
    now = show(rep) if rep is not None else "-"
    return then if then == now else f"{then} → {now}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
