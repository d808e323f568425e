"""What a node taking a session over reads of the batch its last driver left in flight.

History ends with the batch's calls (with their ids) when its driver died
while they ran; each outcome that driver logged is a ``result`` event with
the call's ``id``, after the calls in the log, as is each approval asked
(``approval_required``) and given (``approval``). This reads the log backwards
from its end, a page at a time, until it has passed every call of the batch
(so every result after them was seen), and hands the turn machine the batch
as ``JournalCall``s (``protocol.journal``): the outcomes are reused, the
other calls run again under their own ids and keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from gateway.store.base import EventLog
from protocol.calls import ToolResult, decode_call
from protocol.events import Approval, ApprovalRequired, Call, Result, decode_event
from protocol.journal import JournalCall

__all__ = ["read_journal", "read_journal_calls"]

_PAGE: Final = 256
_KINDS: Final = (b'"type":"result"', b'"type":"call"', b'"type":"approval')
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
        entries = await store.read_log(sid, start, limit=end - start)
        for entry in entries:
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
