"""A session's turns as a user judges them, and how two runs of the same turns differ.

Pure (no socket, no clock): ``turns_of`` folds a stream of events, each with
the time a client got it, into ``Turn``s — what the user said, the tools the
model called and with what arguments, the answer's text, how the turn ended,
the time to its first token and to its end, its tokens and cost. ``compare``
lines up a recorded run's turns with a replayed run's and says what changed
beyond ``Thresholds``; ``similarity`` is the answer-text figure. Replay
(``gateway.client.replay``) and evals (``gateway.client.evals``) both judge
turns this way.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec

from protocol.events import (
    Call,
    Cancelled,
    End,
    Error,
    Event,
    Guardrail,
    Metric,
    Replying,
    Respond,
    Result,
    Think,
    User,
)

__all__ = [
    "Thresholds",
    "ToolUse",
    "Turn",
    "TurnDiff",
    "compare",
    "first_difference",
    "shown",
    "similarity",
    "turns_of",
]

_WORDS: Final = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_CONTENT: Final = (Think, Respond, Call)
# Logged error codes that stop a turn (``gateway.client.stream.TURN_ENDING_ERROR_CODES``).
_STOPS: Final = frozenset({"upstream", "upstream_timeout", "internal"})


class ToolUse(msgspec.Struct, frozen=True):
    """A tool the model called: its name, its arguments, and who ran it."""

    name: str
    args: Any = None
    runs_on: str = "gateway"
    id: str = ""


class Turn(msgspec.Struct, kw_only=True):
    """One turn: from the ``user`` event to its closing event and metric.

    ``outcome``: ``end``, ``cancelled``, ``error`` (an error stopped it),
    ``blocked`` (an input guardrail kept the message from the model: no turn
    ran) or ``open`` (the events stopped before it closed). ``guardrails``: the
    rules that tripped on it (its message, its answer). Times are milliseconds
    from the ``user`` event (``None``: never came).
    """

    user: str
    spoken: bool = False
    tools: list[ToolUse] = msgspec.field(default_factory=list)
    answer: str = ""
    outcome: str = "open"
    guardrails: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)
    first_token_ms: float | None = None
    end_ms: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    first_seq: int = 0
    last_seq: int = 0
    events: int = 0


def turns_of(stream: Iterable[tuple[float, Event]]) -> list[Turn]:
    """The turns of ``(seconds, event)`` pairs in seq order (events outside turns, like
    ``configured``, are skipped)."""
    turns: list[Turn] = []
    turn: Turn | None = None
    started = 0.0
    judged: list[str] = []  # input guardrails on the next message (logged before it)
    for t, event in stream:
        if isinstance(event, User | Replying):  # a turn starts (a reply's has no message)
            said = event.content if isinstance(event, User) else ""
            spoken = isinstance(event, User) and event.source == "audio"
            turn = Turn(user=said, spoken=spoken, first_seq=event.seq)
            turn.guardrails, judged = judged, []
            turns.append(turn)
            started = t
            turn.events = 1
            turn.last_seq = event.seq
            continue
        if isinstance(event, Guardrail) and (turn is None or turn.outcome != "open"):
            judged.append(event.rule)
            if event.on == "input" and event.action != "redact":
                blocked = Turn(user="", outcome="blocked", guardrails=judged)
                blocked.first_seq = blocked.last_seq = event.seq
                turns.append(blocked)
                judged, turn = [], None
            continue
        if turn is None:
            continue
        turn.events += 1
        turn.last_seq = max(turn.last_seq, event.seq)
        ms = round((t - started) * 1000, 1)
        if isinstance(event, _CONTENT) and turn.first_token_ms is None:
            turn.first_token_ms = ms
        if isinstance(event, Respond):
            turn.answer += event.content
        elif isinstance(event, Call):
            turn.tools.append(_tool_use(event))
        elif isinstance(event, Metric):
            turn.input_tokens += event.step.input
            turn.output_tokens += event.step.output
            turn.cost += event.cost.step
            if turn.outcome != "open":
                turn = None  # its closing metric
        elif isinstance(event, End | Cancelled):
            if turn.outcome == "open":
                turn.outcome = "end" if isinstance(event, End) else "cancelled"
            turn.end_ms = ms
        elif isinstance(event, Error):
            turn.errors.append(event.code)
            if event.code in _STOPS:
                turn.outcome = "error"
                turn.end_ms = ms
        elif isinstance(event, Guardrail):
            turn.guardrails.append(event.rule)
        elif isinstance(event, Result):
            continue
    return turns


def _tool_use(call: Call) -> ToolUse:
    try:
        spec = msgspec.json.decode(call.content)
    except msgspec.DecodeError:
        return ToolUse(name="(unreadable call)", args=call.content, runs_on=call.runs_on)
    if not isinstance(spec, dict):
        return ToolUse(name="(unreadable call)", args=spec, runs_on=call.runs_on)
    return ToolUse(
        name=str(spec.get("name", "")), args=spec.get("args"), runs_on=call.runs_on, id=call.id
    )


def words(text: str) -> list[str]:
    return _WORDS.findall(text)


def similarity(recorded: str, replayed: str, *, prefix: bool = False) -> float:
    """How alike two answers are, 0..1, word by word (``difflib``'s ratio).

    ``prefix``: compare only as many characters as the shorter has (a cancelled
    turn is cut wherever the cancel landed, even inside a word; what came
    before the cut must agree).
    """
    if prefix:
        n = min(len(recorded), len(replayed))
        recorded, replayed = recorded[:n], replayed[:n]
    a, b = words(recorded), words(replayed)
    if not a and not b:
        return 1.0
    return round(difflib.SequenceMatcher(None, a, b, autojunk=False).ratio(), 4)


class Thresholds(msgspec.Struct, frozen=True, kw_only=True):
    """What counts as a change between a recorded turn and its replay.

    Tool calls (names and arguments) and how a turn ended must be the same;
    the answer must be at least ``min_similarity`` alike (1.0 by default: the
    same words, as a deterministic model gives; a real model's answers vary,
    so a replay on one asks for less, 0.8 say); the factors, when
    set (> 0), bound the replayed figure against the recorded one (latency to
    the end with ``latency_slack_ms`` of slack, tokens, cost).
    """

    min_similarity: float = 1.0
    latency_factor: float = 0.0
    latency_slack_ms: float = 100.0
    tokens_factor: float = 0.0
    cost_factor: float = 0.0


class TurnDiff(msgspec.Struct, kw_only=True):
    """One turn, recorded and replayed, side by side, and what changed beyond thresholds."""

    index: int
    recorded: Turn | None
    replayed: Turn | None
    similarity: float
    changes: list[str]

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def compare(
    recorded: Sequence[Turn], replayed: Sequence[Turn], thresholds: Thresholds
) -> list[TurnDiff]:
    """Turn by turn (by position), what changed; a turn on one side only is a change."""
    diffs: list[TurnDiff] = []
    for i in range(max(len(recorded), len(replayed))):
        rec = recorded[i] if i < len(recorded) else None
        rep = replayed[i] if i < len(replayed) else None
        if rec is None or rep is None:
            missing = "the replay" if rep is None else "the recording"
            diffs.append(
                TurnDiff(
                    index=i + 1,
                    recorded=rec,
                    replayed=rep,
                    similarity=0.0,
                    changes=[f"turn missing from {missing}"],
                )
            )
            continue
        cut = "cancelled" in (rec.outcome, rep.outcome)
        figure = similarity(rec.answer, rep.answer, prefix=cut)
        diffs.append(
            TurnDiff(
                index=i + 1,
                recorded=rec,
                replayed=rep,
                similarity=figure,
                changes=_changes(rec, rep, figure, thresholds),
            )
        )
    return diffs


def _changes(rec: Turn, rep: Turn, figure: float, th: Thresholds) -> list[str]:
    changes: list[str] = []
    if rec.user != rep.user and not (rec.spoken and rep.spoken):
        changes.append(f"the user said {_short(rep.user)} instead of {_short(rec.user)}")
    if rec.outcome != rep.outcome:
        changes.append(f"ended {rep.outcome} instead of {rec.outcome}")
    calls_then = [(t.name, t.args) for t in rec.tools]
    calls_now = [(t.name, t.args) for t in rep.tools]
    if calls_then != calls_now:
        changes.append(f"tool calls {_calls(rep.tools)} instead of {_calls(rec.tools)}")
    if figure < th.min_similarity:
        changes.append(f"answer {shown(figure)} alike (below {th.min_similarity:g})")
    if th.latency_factor > 0 and rec.end_ms is not None and rep.end_ms is not None:
        bound = rec.end_ms * th.latency_factor + th.latency_slack_ms
        if rep.end_ms > bound:
            changes.append(f"took {rep.end_ms:.0f} ms to end (recorded {rec.end_ms:.0f} ms)")
    if th.tokens_factor > 0:
        then, now = rec.input_tokens + rec.output_tokens, rep.input_tokens + rep.output_tokens
        if now > then * th.tokens_factor:
            changes.append(f"{now} tokens (recorded {then})")
    if th.cost_factor > 0 and rep.cost > rec.cost * th.cost_factor:
        changes.append(f"cost ${rep.cost:.6f} (recorded ${rec.cost:.6f})")
    return changes


def shown(figure: float) -> str:
    """A similarity for people: rounded down, so an answer that changed never shows 1.00."""
    return f"{math.floor(figure * 100) / 100:.2f}"


def first_difference(a: str, b: str, context: int = 40) -> tuple[str, str]:
    """Where two answers part: each from a little before the first character that differs."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    start = max(0, n - context)
    lead = "…" if start else ""
    return lead + a[start:], lead + b[start:]


def _calls(tools: Sequence[ToolUse]) -> str:
    if not tools:
        return "none"
    return ", ".join(f"{t.name}({msgspec.json.encode(t.args).decode()})" for t in tools)


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= width else text[: width - 1] + "…")
