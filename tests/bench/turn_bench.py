"""Benchmark of the turn loop's per-delta cost: the state machine against the old inline loop.

Run: ``PYTHONPATH=. python tests/bench/turn_bench.py [--quick]``

Per model token the session does one msgspec decode of the provider's frame,
then routes the delta through the turn logic to ``emit``. Before issue 12 the
routing was inline in ``SessionRuntime._stream_step`` (parser, a per-event
``_route`` call, the recorder); now it is ``TurnMachine.text`` plus the
runtime's loop over the returned events. Both are measured here on the same
machine, in the same run, with the same no-op ``emit``, for a ~4-character
response delta with no marker (the hot path), and for a whole tool turn's
text. ``OLD`` below is the replaced code, kept only as the baseline.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from protocol.calls import ToolCall, decode_call
from protocol.events import Call, End, Error, Event, Execute, Respond, Think
from protocol.parser import Parser
from protocol.steps import StepRecorder
from protocol.turn import (
    TurnMachine,
)
from protocol.turn_events import (
    StopResponse,
    UserMessage,
)

REPEATS = 7


class _OldOutcome:
    __slots__ = ("calls", "ended", "malformed")

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.malformed: str | None = None
        self.ended = False


def _old_route(
    out: Event, outcome: _OldOutcome, emit: Callable[[Event], None], add: Callable[[Event], None]
) -> None:
    """``SessionRuntime._route`` before the state machine (the baseline)."""
    kind = type(out)
    if kind is Think or kind is Respond:
        add(out)
        emit(out)
    elif kind is Call:
        add(out)
        outcome.calls.append(decode_call(out.content))  # type: ignore[union-attr]
        emit(out)
    elif kind is Execute:
        emit(out)
    elif kind is End:
        outcome.ended = True
        emit(out)
    elif kind is Error:
        if out.code == "malformed_execute":  # type: ignore[union-attr]
            outcome.malformed = out.content  # type: ignore[union-attr]
        emit(out)
    else:
        emit(out)


def old_loop(deltas: list[str]) -> float:
    """The old ``_stream_step`` body per delta (the awaits aside)."""
    sink: list[Event] = []
    emit = sink.append
    outcome = _OldOutcome()
    parser = Parser()
    feed = parser.feed
    recorder = StepRecorder()
    add = recorder.add
    route = _old_route
    start = time.perf_counter()
    for text in deltas:
        if parser.stopped:
            continue
        for out in feed(text):
            route(out, outcome, emit, add)
        if parser.stopped:
            pass
    return (time.perf_counter() - start) / len(deltas)


def new_loop(deltas: list[str]) -> float:
    """The runtime's ``_pump_upstream`` body per delta with ``TurnMachine.text``."""
    sink: list[Event] = []
    emit = sink.append
    todo: list[object] = []
    machine = TurnMachine()
    machine.feed(UserMessage(content="hi"))
    text = machine.text
    start = time.perf_counter()
    for delta in deltas:
        for action in text(delta):
            if type(action) is StopResponse:
                todo.append(action)
            else:
                emit(action)  # type: ignore[arg-type]
        if todo:
            pass
    return (time.perf_counter() - start) / len(deltas)


def best_ns(run: Callable[[list[str]], float], deltas: list[str]) -> float:
    """The fastest of ``REPEATS`` runs: on a shared machine, the least disturbed one."""
    return min(run(deltas) for _ in range(REPEATS)) * 1e9


def chunks(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def main() -> None:
    quick = "--quick" in sys.argv
    n = 20_000 if quick else 200_000
    prose = ["abcd"] * n  # the hot path: respond text, no marker
    # Open with a marker so the parser is in respond text with its fast path on.
    prose[0] = "Hi, "
    tool = chunks(
        "<think>" + "reasoning " * 200 + '</think><execute>[{"name": "list", "args": '
        '{"path": "."}}]</execute>'
    )
    answer = chunks("<think>" + "more " * 100 + "</think>" + "The answer is here. " * 100)
    print(f"turn loop, per delta (best of {REPEATS} runs, {n} deltas):")
    for label, deltas in (("respond delta, no marker", prose), ("answer step", answer)):
        old = best_ns(old_loop, deltas)
        new = best_ns(new_loop, deltas)
        print(f"  {label:28s} old {old:7.0f} ns   machine {new:7.0f} ns   ratio {new / old:.2f}")
    old = best_ns(old_loop, tool)
    new = best_ns(new_loop, tool)
    print(
        f"  {'tool step (to </execute>)':28s} old {old:7.0f} ns   machine {new:7.0f} ns   "
        f"ratio {new / old:.2f}"
    )


if __name__ == "__main__":
    main()
