"""A tool call's identity across failover: its idempotency key and its journal entry.

A call the model asked for may run on a node that dies. What makes it run
*once* is that the node taking over knows the call — the same call, not a new
one the model asks for again — and hands the tool the same key:

- the step's calls are in history (with their ids) before any of them runs,
  so a takeover never asks the model for a call that may already have run;
- each call's outcome is logged as its own ``result`` event (with the call's
  ``id``) as soon as it finishes: a takeover reuses the logged outcomes and
  runs only the calls without one;
- every call's key is ``idempotency_key(session, call id)``: the same on every
  node, for every run of that call, so a tool that dedupes on it (or answers a
  repeated key with its stored result) does the work once.

Pure: the key is a hash, nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from protocol.assembly import HistoryItem
from protocol.calls import ToolCall, ToolResult
from protocol.events import Call, Context, Result, User

__all__ = [
    "JournalCall",
    "approval_digest",
    "background_in_flight",
    "batch_in_flight",
    "idempotency_key",
    "turn_in_flight",
]


def idempotency_key(session_id: str, call_id: str) -> str:
    """The key of call ``call_id`` of session ``session_id``: 32 hex digits.

    A hash rather than the ids themselves: a tool's service sees a stable,
    unique key, not the session id (which opens the session to whoever has
    the session's credentials).
    """
    digest = hashlib.sha256(f"rtgw-call\n{session_id}\n{call_id}".encode()).hexdigest()
    return digest[:32]


def approval_digest(call_id: str, name: str, args: dict[str, Any]) -> str:
    """The digest an ``approve`` must carry for call ``call_id``: SHA-256 (hex) of the
    call's id, name and args as sorted, compact JSON. An approval is bound to exactly
    the call the user saw: other args, another call, another id give another digest."""
    canonical = msgspec.json.encode({"id": call_id, "name": name, "args": args}, order="sorted")
    return hashlib.sha256(canonical).hexdigest()


class JournalCall(msgspec.Struct, frozen=True):
    """One call of the batch a takeover finds in flight, as the log and history show it.

    ``outcome``: its logged result (None: it has none, so it is run again, or
    asked of the client again, under the same id and key). ``approval``: the
    call waits for a user's decision (``"pending"``: none logged yet) or was
    allowed (``"allowed"``); a denied call has its outcome. ``background``:
    it does not block the turn (``protocol.background``).
    """

    id: str
    name: str
    args: dict[str, Any]
    runs_on: Literal["gateway", "client"] = "gateway"
    outcome: ToolResult | None = None
    approval: Literal["", "pending", "allowed"] = ""
    background: bool = False

    @property
    def call(self) -> ToolCall:
        return ToolCall(name=self.name, args=self.args)


def _settled(history: Sequence[HistoryItem]) -> Sequence[HistoryItem]:
    """History without its trailing ``context`` messages: added while a turn waited for
    its calls, they do not change where the turn stands."""
    end = len(history)
    while end and type(history[end - 1]) is Context:
        end -= 1
    return history if end == len(history) else history[:end]


def turn_in_flight(history: Sequence[HistoryItem]) -> bool:
    """Whether history shows a turn that did not finish (it ends with the prompt or results)."""
    history = _settled(history)
    return bool(history) and isinstance(history[-1], User | Result)


def batch_in_flight(history: Sequence[HistoryItem]) -> list[Call]:
    """The calls of a batch history shows in flight (it ends with them, without results).

    A step's calls go into history before they run; their results follow
    when the batch is done. Calls without ids predate the journal: [].
    """
    calls: list[Call] = []
    for item in reversed(_settled(history)):
        if type(item) is not Call:
            break
        calls.append(item)
    calls.reverse()
    return calls if all(call.id for call in calls) else []


def background_in_flight(history: Sequence[HistoryItem]) -> list[Call]:
    """Background calls whose result history does not hold yet (running, or due).

    A background call's result goes into history (a ``Result`` with its
    ``id``) when the model is given it; until then the call may still run.
    """
    delivered = {item.id for item in history if type(item) is Result and isinstance(item.id, str)}
    return [
        item
        for item in history
        if type(item) is Call and item.background is True and item.id not in delivered
    ]
