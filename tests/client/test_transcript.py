"""Turns as a user judges them, and what changed between two runs (no sockets)."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.client.transcript import (
    Thresholds,
    compare,
    first_difference,
    shown,
    similarity,
    turns_of,
)
from protocol.events import Event, decode_event


def events(*items: tuple[float, dict[str, Any]]) -> list[tuple[float, Event]]:
    found = []
    for seq, (t, fields) in enumerate(items, start=1):
        found.append((t, decode_event(msgspec.json.encode({**fields, "seq": seq}))))
    return found


def metric(inp: int, out: int, cost: float) -> dict[str, Any]:
    usage = {"input": inp, "output": out}
    return {"type": "metric", "step": usage, "total": usage, "cost": {"step": cost}}


def a_turn(answer: str, *, tool: dict[str, Any] | None = None, at: float = 0.0) -> list[Any]:
    items: list[Any] = [(at, {"type": "user", "content": "hi"})]
    if tool is not None:
        call = {"type": "call", "content": msgspec.json.encode(tool).decode(), "id": "call_1"}
        items += [(at + 0.1, call), (at + 0.15, metric(10, 2, 0.001))]
    items += [
        (at + 0.2, {"type": "respond", "content": answer}),
        (at + 0.5, {"type": "end"}),
        (at + 0.5, metric(20, 5, 0.002)),
    ]
    return items


def test_a_turn_holds_its_tools_answer_latencies_tokens_and_cost() -> None:
    (turn,) = turns_of(events(*a_turn("Echo: hi", tool={"name": "list", "args": {"path": "."}})))
    assert turn.user == "hi" and turn.outcome == "end" and turn.answer == "Echo: hi"
    assert [(t.name, t.args) for t in turn.tools] == [("list", {"path": "."})]
    assert turn.first_token_ms == 100.0 and turn.end_ms == 500.0
    assert (turn.input_tokens, turn.output_tokens) == (30, 7)
    assert round(turn.cost, 6) == 0.003


def test_the_same_turns_are_no_change_and_another_answer_is_one() -> None:
    recorded = turns_of(events(*a_turn("The answer is 42.")))
    assert not any(d.changed for d in compare(recorded, recorded, Thresholds()))
    replayed = turns_of(events(*a_turn("The answer is 41.")))
    (diff,) = compare(recorded, replayed, Thresholds())
    assert diff.changes == [f"answer {shown(diff.similarity)} alike (below 1)"]
    # A lower bar lets a near answer through: what a replay on a real model asks for.
    assert not compare(recorded, replayed, Thresholds(min_similarity=0.5))[0].changed


def test_tool_calls_and_missing_turns_are_changes() -> None:
    recorded = turns_of(events(*a_turn("ok", tool={"name": "list", "args": {"path": "."}})))
    replayed = turns_of(events(*a_turn("ok", tool={"name": "list", "args": {"path": "/"}})))
    (diff,) = compare(recorded, replayed, Thresholds())
    assert diff.changes == ['tool calls list({"path":"/"}) instead of list({"path":"."})']
    (missing,) = compare(recorded, [], Thresholds())
    assert missing.changes == ["turn missing from the replay"]


def test_a_cancelled_answer_is_compared_up_to_the_shorter_cut() -> None:
    assert similarity("H", "Here is a", prefix=True) == 1.0
    assert similarity("Here is a", "Hello", prefix=True) < 1.0
    assert similarity("a b c", "a b d") < 1.0 and shown(0.999) == "0.99"


def test_the_report_shows_where_two_answers_part() -> None:
    base = "x" * 100
    then, now = first_difference(base + " old", base + " new")
    assert then.startswith("…") and then.endswith(" old") and now.endswith(" new")


def test_a_reply_is_a_turn_of_its_own_with_no_message() -> None:
    """A reply (the model speaking first) is a turn: its answer is not added to the
    turn before it, and it says nobody spoke."""
    greeting = [
        (0.0, {"type": "reply"}),
        (0.1, {"type": "respond", "content": "Hello! How can I help?"}),
        (0.2, {"type": "end"}),
        (0.2, metric(5, 5, 0.001)),
    ]
    first, second = turns_of(events(*greeting, *a_turn("Echo: hi", at=1.0)))
    assert (first.user, first.answer, first.outcome) == ("", "Hello! How can I help?", "end")
    assert (second.user, second.answer) == ("hi", "Echo: hi")
