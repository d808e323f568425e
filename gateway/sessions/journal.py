"""What a node taking a session over reads of the batch its last driver left in flight.

History ends with the batch's calls (with their ids) when its driver died
while they ran; each outcome that driver logged is a ``result`` event with
the call's ``id``, after the calls in the log, as is each approval asked
(``approval_required``) and given (``approval``). This reads the log backwards
from its end, a page at a time, until it has passed every call of the batch
(so every result after them was seen), and hands the turn machine the batch
as ``JournalCall``s (``protocol.journal``): the outcomes are reused, the
other calls run again under their own ids and keys.

A step's items (its think blocks and calls) go into history with the step's
usage (``metric``), a moment after its ``execute``: a driver that died in
between sent the calls to clients (which may already act on them) but left
history without them. ``unpersisted_step`` rebuilds that step from the log,
so the takeover finishes the same calls instead of asking the model again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Final, Literal

import msgspec

from gateway.store.base import EventLog, LogEntry
from protocol.assembly import HistoryItem
from protocol.calls import ToolResult, decode_call
from protocol.events import (
    Approval,
    ApprovalRequired,
    Call,
    Cancelled,
    End,
    Event,
    Execute,
    Interrupt,
    Metric,
    Result,
    User,
    decode_event,
)
from protocol.journal import JournalCall
from protocol.steps import StepRecorder

__all__ = ["read_journal", "read_journal_calls", "since_last_metric", "unpersisted_step"]

# Where a step's logged events begin (after the last of these): history holds
# everything before, or the step was ended another way.
_STEP_BOUNDARIES: Final = (User, Metric, Interrupt, Result, Cancelled, End)
_STEP_READ_MOST: Final = 1024
"""Events read back at most to find a cut step (one step's deltas: far fewer)."""

_PAGE: Final = 256
_PAGE_BYTES: Final = 1 << 20
"""Bytes of log read at a time: a window of large events is read in pages of this."""
_KINDS: Final = (b'"type":"result"', b'"type":"call"', b'"type":"approval')
_METRIC: Final = b'"type":"metric"'
_TAIL_KINDS: Final = (
    b'"type":"end"',
    b'"type":"cancelled"',
    b'"type":"respond"',
    b'"type":"think"',
)
_TAIL_READS: Final = (32, _STEP_READ_MOST)
"""How far back ``since_last_metric`` reads, first and at most: a turn ends with a metric."""
_results_decoder: Final = msgspec.json.Decoder(list[ToolResult])


async def read_journal(
    store: EventLog, sid: str, calls: Sequence[Call], last_seq: int
) -> tuple[JournalCall, ...]:
    """The batch of ``calls`` (history's trailing calls) with the outcomes the log holds."""
    wanted = {call.id for call in calls}
    unseen = set(wanted)  # calls whose own event is not passed yet
    outcomes: dict[str, ToolResult] = {}
    approvals: dict[str, Literal["pending", "allowed"]] = {}
    first = await store.first_seq(sid)
    end = last_seq
    while unseen and end >= max(first, 1):
        start = max(first - 1, end - _PAGE, 0)
        async for entry in _entries(store, sid, start, end):
            data = entry.data
            start_of = data[:24]
            if not any(kind in start_of for kind in _KINDS):
                continue  # a delta, a metric…: decoded only when it may be ours
            event = decode_event(data)
            if type(event) is Call and event.id in unseen:
                unseen.discard(event.id)
            elif type(event) is ApprovalRequired and event.id in wanted:
                approvals.setdefault(event.id, "pending")
            elif type(event) is Approval and event.id in wanted and event.decision == "allow":
                approvals[event.id] = "allowed"
            elif type(event) is Result and event.id in wanted and event.id not in outcomes:
                results = _results_decoder.decode(event.content)
                if results:
                    outcomes[event.id] = results[0]
        end = start
    return read_journal_calls(calls, outcomes, approvals)


def read_journal_calls(
    calls: Sequence[Call],
    outcomes: dict[str, ToolResult] | None = None,
    approvals: dict[str, Literal["pending", "allowed"]] | None = None,
) -> tuple[JournalCall, ...]:
    """``calls`` as journal entries, with the ``outcomes`` known (none: all run again)
    and the state of their approvals (a call whose approval the log does not show
    waits for one again if its tool needs it)."""
    known = outcomes or {}
    decided = approvals or {}
    out: list[JournalCall] = []
    for call in calls:
        request = decode_call(call.content)
        out.append(
            JournalCall(
                id=call.id,
                name=request.name,
                args=request.args,
                runs_on=call.runs_on,
                outcome=known.get(call.id),
                approval=decided.get(call.id, ""),
                background=call.background is True,
            )
        )
    return tuple(out)


async def unpersisted_step(store: EventLog, sid: str, last_seq: int) -> list[HistoryItem]:
    """The history items of the last step, if the log shows its calls complete
    (``execute``) but not the usage that writes them to history; else [].

    Reads the log's last ``_STEP_READ_MOST`` events at most (a longer tail is
    not one cut step: [] and the step is rerun), a page of bytes at a time,
    keeping only the events after the last step boundary.
    """
    first = max(await store.first_seq(sid), 1)
    start = max(first - 1, last_seq - _STEP_READ_MOST, 0)
    step: list[Event] = []  # the events after the last boundary read so far
    bounded = False
    async for entry in _entries(store, sid, start, last_seq):
        event = decode_event(entry.data)
        if isinstance(event, _STEP_BOUNDARIES):
            step, bounded = [], True
        else:
            step.append(event)
    if not bounded and start > first - 1:
        return []  # the step's start is further back than we read
    if not any(type(event) is Execute for event in step):
        return []
    recorder = StepRecorder()
    for event in step:
        recorder.add(event)
    items = recorder.finish()
    return items if any(type(item) is Call for item in items) else []


async def _entries(store: EventLog, sid: str, start: int, end: int) -> AsyncIterator[LogEntry]:
    """The log's entries ``start < seq <= end``, read ``_PAGE_BYTES`` at a time: a
    window of large events is never held whole."""
    after = start
    while after < end:
        page = await store.read_log(sid, after, limit=end - after, max_bytes=_PAGE_BYTES)
        if not page:
            return
        for entry in page:
            if entry.seq > end:
                return
            yield entry
        after = page[-1].seq


async def since_last_metric(
    store: EventLog, sid: str, last_seq: int
) -> tuple[Metric | None, list[Event]]:
    """The log's last ``metric`` (None: none in its last ``_STEP_READ_MOST`` events) and
    the closing (``end``, ``cancelled``) and text events logged after it.

    What a node that loads the session needs: the totals its clients were last shown
    (the meta has them only from a clean release), and whether the last turn closed
    without its metric (its node died waiting for the provider's usage).
    """
    end = last_seq
    after: list[Event] = []
    for most in _TAIL_READS:
        start = max(last_seq - most, 0)  # a trimmed log's read just starts later
        if start >= end:
            break
        shown: Metric | None = None
        page: list[Event] = []
        async for entry in _entries(store, sid, start, end):
            kind = entry.data[:24]
            if _METRIC in kind:
                shown, page = msgspec.json.decode(entry.data, type=Metric), []
            elif any(tail in kind for tail in _TAIL_KINDS):
                page.append(decode_event(entry.data))
        if shown is not None:
            return shown, page + after
        after, end = page + after, start
    return None, after
