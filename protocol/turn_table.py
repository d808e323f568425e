"""The turn machine's transitions, declared: every (state, input) pair, in one table.

As h11's ``_state.py`` keeps ``EVENT_TRIGGERED_TRANSITIONS``: each row names an
input of ``protocol.turn_events``, the machine's step that handles it, and for
**every** state either the states it may lead to (``stays``: none but its own)
or ``IGNORE`` (the input means nothing there: ``feed`` returns no actions and
the step is not called). ``TurnMachine.feed`` dispatches through this table;
a test checks that every pair is declared and that the machine only moves
along declared arrows; ``diagram()`` draws it for ``docs/architecture.md``.

A handled pair may still answer with a ``Refuse`` (a command that makes no
sense there) or with events only: the table says where the turn can go, the
step what it says on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

from protocol.events import Respond, Think
from protocol.turn_events import (
    GUARDRAIL_CANCEL,
    Action,
    ApprovalTimeout,
    Approve,
    BackgroundDone,
    CallDone,
    Cancel,
    ClientTimeout,
    Commit,
    ContextMessage,
    GuardrailCut,
    NativeCall,
    Opened,
    Played,
    Reconfigured,
    ReplyNow,
    Rerun,
    ResponseBegan,
    ResponseDone,
    Resume,
    ResumeBackground,
    RetryNow,
    ShellFailed,
    Shutdown,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    TextDelta,
    Thought,
    Tick,
    ToolResultMessage,
    ToolsDone,
    Transcript,
    UpstreamFailed,
    UpstreamLost,
    UpstreamStalled,
    UserMessage,
)
from protocol.turn_state import (
    BACKOFF,
    CANCELLING,
    ENDING,
    IDLE,
    STOPPING,
    STREAMING,
    TOOLS,
    TurnState,
)

__all__ = ["IGNORE", "ROWS", "STATES", "TRANSITIONS", "Row", "diagram"]

STATES: Final = tuple(TurnState)

IGNORE: Final = None
"""The input means nothing in this state: no actions, the state stays."""
stays: Final[tuple[TurnState, ...]] = ()
"""Handled; the state stays what it was."""
# The turn closes: idle, or the next turn starts at once (a message queued while it
# closed, speech that ended meanwhile, background results due).
CLOSES: Final = (IDLE, STREAMING)

Step = Callable[[Any, Any], Sequence[Action]]
Goes = tuple[TurnState, ...] | None


class Row(NamedTuple):
    """One input: the machine's step for it, and what it does in each state."""

    input: type
    step: Step
    states: dict[TurnState, Goes]


def _row(given: type, step: Step, **states: Goes) -> Row:
    return Row(given, step, {TurnState(name): goes for name, goes in states.items()})


# fmt: off
ROWS: Final = (
    # --- the client's commands ---------------------------------------------------------
    _row(UserMessage, lambda m, i: m._user(i),
         idle=(STREAMING,), streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),  # queued or refused
    _row(ReplyNow, lambda m, i: m._user(i),
         idle=(STREAMING,), streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),  # as a user message, with none
    _row(ContextMessage, lambda m, i: m._context(i),
         idle=stays, streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),  # logged once the answer is, else waits
    _row(Cancel, lambda m, i: m._cancel(guardrail=i.id == GUARDRAIL_CANCEL),
         idle=stays, streaming=(CANCELLING,), stopping=(CANCELLING,), ending=stays,
         tools=CLOSES, backoff=CLOSES, cancelling=stays),
    _row(ToolResultMessage, lambda m, i: m._client_result(i),
         idle=(STREAMING,), streaming=stays, stopping=stays, ending=stays,
         tools=CLOSES, backoff=stays, cancelling=stays),
    _row(Approve, lambda m, i: m._approve(i),
         idle=stays, streaming=stays, stopping=stays, ending=stays,
         tools=CLOSES, backoff=stays, cancelling=stays),
    _row(Commit, lambda m, i: m._commit(),
         idle=(STREAMING,), streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),
    _row(Played, lambda m, i: m.spoken.played(i.ms),
         idle=stays, streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),
    # --- the upstream's events ---------------------------------------------------------
    _row(TextDelta, lambda m, i: m.text(i.text),
         idle=IGNORE, streaming=(STOPPING, ENDING), stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=IGNORE, cancelling=IGNORE),
    _row(Spoken, lambda m, i: m._said(Respond(content=i.text)),
         idle=IGNORE, streaming=stays, stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=IGNORE, cancelling=IGNORE),
    _row(Thought, lambda m, i: m._said(Think(content=i.text)),
         idle=IGNORE, streaming=stays, stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=IGNORE, cancelling=IGNORE),
    _row(NativeCall, lambda m, i: m._native_call(i),
         idle=IGNORE, streaming=stays, stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=IGNORE, cancelling=IGNORE),
    _row(ResponseDone, lambda m, i: m._response_done(i),
         idle=IGNORE, streaming=(IDLE, TOOLS), stopping=(IDLE, STREAMING, TOOLS),
         ending=CLOSES, tools=IGNORE, backoff=IGNORE, cancelling=CLOSES),
    _row(ResponseBegan, lambda m, i: m._begin_spoken([]),
         idle=(STREAMING,), streaming=IGNORE, stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=IGNORE, cancelling=IGNORE),
    _row(SpeechBegan, lambda m, i: m._speech_began(i.offset_ms),
         idle=stays, streaming=(CANCELLING,), stopping=(CANCELLING,), ending=stays,
         tools=CLOSES, backoff=CLOSES, cancelling=stays),
    _row(SpeechEnded, lambda m, i: m._speech_ended(i.offset_ms),
         idle=(STREAMING,), streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),
    _row(GuardrailCut, lambda m, i: m._guardrail_cut(i),  # only a spoken answer streams
         idle=IGNORE, streaming=(CANCELLING,), stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=IGNORE, cancelling=IGNORE),
    _row(Transcript, lambda m, i: m.spoken.release(i.text) if m.spoken.holding else (),
         idle=stays, streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),  # a late one is not ours any more
    # --- what the shell's I/O and timers report ----------------------------------------
    _row(UpstreamLost, lambda m, i: m._upstream_lost(i.reason, fatal=i.fatal, fallback=i.fallback),
         idle=IGNORE, streaming=(IDLE, BACKOFF), stopping=(IDLE, STREAMING, TOOLS),
         ending=CLOSES, tools=IGNORE, backoff=IGNORE, cancelling=CLOSES),
    _row(UpstreamFailed, lambda m, i: m._upstream_failed(i),
         idle=IGNORE, streaming=(IDLE, BACKOFF), stopping=(IDLE, STREAMING, TOOLS),
         ending=CLOSES, tools=IGNORE, backoff=IGNORE, cancelling=CLOSES),
    _row(UpstreamStalled, lambda m, i: m._upstream_stalled(i.seconds),
         idle=IGNORE, streaming=(IDLE, BACKOFF), stopping=(IDLE, STREAMING, TOOLS),
         ending=CLOSES, tools=IGNORE, backoff=IGNORE, cancelling=CLOSES),
    _row(RetryNow, lambda m, i: m._retry_now(),
         idle=IGNORE, streaming=IGNORE, stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=(STREAMING,), cancelling=IGNORE),
    _row(ToolsDone, lambda m, i: m._tools_done(i.results),
         idle=IGNORE, streaming=IGNORE, stopping=IGNORE, ending=IGNORE,
         tools=CLOSES, backoff=IGNORE, cancelling=IGNORE),
    _row(CallDone, lambda m, i: m._call_done(i),
         idle=IGNORE, streaming=IGNORE, stopping=IGNORE, ending=IGNORE,
         tools=stays, backoff=IGNORE, cancelling=IGNORE),
    _row(ClientTimeout, lambda m, i: m._client_timeout(i.seconds),
         idle=IGNORE, streaming=IGNORE, stopping=IGNORE, ending=IGNORE,
         tools=CLOSES, backoff=IGNORE, cancelling=IGNORE),
    _row(ApprovalTimeout, lambda m, i: m._approval_timeout(i.seconds),
         idle=IGNORE, streaming=IGNORE, stopping=IGNORE, ending=IGNORE,
         tools=CLOSES, backoff=IGNORE, cancelling=IGNORE),
    _row(Tick, lambda m, i: m._tick(i.now),  # timers start in any state, fire in tools
         idle=stays, streaming=stays, stopping=stays, ending=stays,
         tools=CLOSES, backoff=stays, cancelling=stays),
    _row(Reconfigured, lambda m, i: m._reconfigured(),
         idle=stays, streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),
    _row(Opened, lambda m, i: m._opened(i.setup, i.kept, i.audio_ms),
         idle=stays, streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),
    _row(BackgroundDone, lambda m, i: m._background_done(i.id, i.result),
         idle=(STREAMING,), streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),  # logged; delivered when idle
    _row(ResumeBackground, lambda m, i: m._resume_background(i),
         idle=(STREAMING,), streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),
    _row(Rerun, lambda m, i: m._rerun(i.reason),
         idle=(STREAMING,), streaming=IGNORE, stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=IGNORE, cancelling=IGNORE),
    _row(Resume, lambda m, i: m._resume(i),
         idle=(STREAMING, TOOLS), streaming=IGNORE, stopping=IGNORE, ending=IGNORE,
         tools=IGNORE, backoff=IGNORE, cancelling=IGNORE),
    _row(ShellFailed, lambda m, i: m._shell_failed(i.what),
         idle=IGNORE, streaming=CLOSES, stopping=CLOSES, ending=CLOSES,
         tools=CLOSES, backoff=CLOSES, cancelling=CLOSES),
    _row(Shutdown, lambda m, i: m._shutdown(),  # forgets the background calls even when idle
         idle=stays, streaming=(IDLE,), stopping=(IDLE,), ending=(IDLE,),
         tools=(IDLE,), backoff=(IDLE,), cancelling=(IDLE,)),
)
# fmt: on


def _transitions() -> dict[tuple[TurnState, type], tuple[Step, tuple[TurnState, ...]] | None]:
    table: dict[tuple[TurnState, type], tuple[Step, tuple[TurnState, ...]] | None] = {}
    for row in ROWS:
        for state, goes in row.states.items():
            table[state, row.input] = None if goes is None else (row.step, goes)
    return table


TRANSITIONS: Final = _transitions()
"""``(state, input type)`` → ``(step, the other states it may lead to)``, or ``IGNORE``."""


def diagram() -> str:
    """The table as a mermaid state diagram (arrows between states; inputs that keep
    the state, refusals and ignores are in the table, not drawn)."""
    arrows: dict[tuple[TurnState, TurnState], list[str]] = {}
    for row in ROWS:
        for state, goes in row.states.items():
            for target in goes or ():
                if target is not state:
                    arrows.setdefault((state, target), []).append(row.input.__name__)
    lines = ["```mermaid", "stateDiagram-v2", "    [*] --> idle"]
    for (source, target), inputs in sorted(
        arrows.items(), key=lambda a: (STATES.index(a[0][0]), STATES.index(a[0][1]))
    ):
        lines.append(f"    {source.value} --> {target.value}: {', '.join(inputs)}")
    lines.append("```")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(diagram(), end="")
