"""What a ``forget`` takes out of what the model sees: pure, on the session's history.

History items carry the seq of the first logged event they hold
(``SessionLog.persist``), so a client names a user message by its ``user``
event's seq and an answer by its first and last ``respond`` chunks. A
``forgotten`` is appended, never an item removed: the log and the store stay
append-only, resume and takeover read the same history, and ``assemble``
leaves the named items out of every later upstream connection's context.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.assembly import HistoryItem, forgets
from protocol.events import Error, Forget, Forgotten, Respond, User

__all__ = ["forgetting"]


def forgetting(history: Sequence[HistoryItem], message: Forget, *, idle: bool) -> Forgotten | Error:
    """The ``forgotten`` event ``message`` makes, or the refusal saying what to send instead."""
    if not idle:
        return Error(
            code="turn_active",
            content="messages are forgotten between turns: wait for the turn's end (or "
            "cancel it), then send forget again",
        )
    first, last = message.first, message.last
    if first > last:
        return Error(code="bad_frame", content="forget takes first <= last (seqs of the log)")
    done = [item for item in history if isinstance(item, Forgotten)]
    if not any(
        isinstance(item, User | Respond) and first <= item.seq <= last and not forgets(item, done)
        for item in history
    ):
        return Error(
            code="unknown_item",
            content=f"the model holds no user message or answer text logged from seq {first} "
            f"through {last} (forgotten already, or none there): name a user event's seq, or "
            "an answer's first and last respond chunks",
        )
    return Forgotten(first=first, last=last)
