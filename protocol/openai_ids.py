"""The ids of the events the OpenAI door sends: made from the log alone. Pure.

The events one logged event becomes are ``evt_SEQ_1``, ``evt_SEQ_2``…: a client
that reconnects replays the log through a fresh conversation and is sent only
what follows the last ``event_id`` it saw (``position``). An event of no logged
event (a reply, an ``error``, the model's speech, a message shown when created) is
``evt_SEQ_NxK``: the K-th of the connection, sent after ``evt_SEQ_N``, so it names
that place too (a client that resumes after it is sent what followed ``evt_SEQ_N``).
What a connection shows of the log replayed to it: ``Replay``.
"""

from __future__ import annotations

import re
from typing import Any, Final

from protocol.openai_events import ServerEvent

__all__ = ["EventIds", "Replay", "position"]

_SERVER_ERRORS: Final = frozenset(
    ("upstream", "upstream_timeout", "store", "log_trimmed", "draining", "internal")
)
"""The gateway's codes of a failure on its side or the provider's, not the request's: an
OpenAI ``error`` of type ``server_error`` (as OpenAI's service marks its own failures),
so a client that retries those does."""


_EVERY: Final = 1 << 62  # past any event a logged one becomes (``Replay``: the whole head)

_EVENT_ID: Final = re.compile(r"evt_([0-9]{1,18})_([0-9]{1,18})(?:x[0-9]{1,18})?")
"""``evt_SEQ_N`` or ``evt_SEQ_NxK``, in ASCII digits (a client's ``after_event``)."""


def position(event_id: str) -> tuple[int, int] | None:
    """``(seq, n)``: the logged event an ``event_id`` is, or was sent after (an unlogged
    one's); None for any other id."""
    matched = _EVENT_ID.fullmatch(event_id)
    return None if matched is None else (int(matched[1]), int(matched[2]))


class Replay:
    """What a connection's client is shown of the log replayed to it.

    The log is replayed from its start through a fresh conversation (which so holds the
    session's state), and the client is shown what follows ``after``, its
    ``after_event``. A client that names none, in a session with a history (a token's
    after a page reload, a ``session_id`` alone, a sideband joining a call), joins at
    the head: it is not sent the past as live events, on which an SDK acts again (the
    Agents SDK ran a client tool call a second time). ``skip`` ends once the replay
    passed the head (``head``, the connection's first frame's seq), so nothing sent
    after that, a reply to the client's first event included, is ever held back."""

    __slots__ = ("after", "caught_up", "head", "skip")

    def __init__(self, after: tuple[int, int] | None) -> None:
        self.after = after
        self.skip = after  # events at or before this position are not sent
        self.head = -1
        self.caught_up = False

    def start(self, head: int) -> bool:
        """The log's head as the connection starts; True if there is nothing to replay."""
        self.head = head
        if self.after is None and head > 0:
            self.skip = (head, _EVERY)
        self.caught_up = head == 0
        return self.caught_up

    def shows(self, event_id: str) -> bool:
        """Whether the client is sent the event of ``event_id`` (ask only while ``skip``)."""
        at = position(event_id)
        return at is not None and self.skip is not None and at > self.skip

    def replayed(self, seq: int) -> bool:
        """Logged event ``seq`` was translated; True once, as the replay reaches the head."""
        if self.skip is not None and (seq > self.skip[0] or seq >= self.head >= 0):
            self.skip = None  # everything from here is new
        if self.caught_up or not seq >= self.head >= 0:
            return False
        self.caught_up = True
        return True


class EventIds:
    """One connection's event ids. ``seq``: the logged event being translated (0: none,
    the events made are unlogged); ``n``: how many it has become so far."""

    __slots__ = ("last_n", "last_seq", "n", "seq", "unlogged")

    def __init__(self) -> None:
        self.seq = 0
        self.n = 0
        self.unlogged = 0
        # The logged event made last (``evt_SEQ_N``; the conversation's fast path for an
        # answer's chunks sets it too): an unlogged event's id names it.
        self.last_seq = 0
        self.last_n = 0

    def event(self, kind: str, **fields: Any) -> ServerEvent:
        """A server event of ``kind``, with the next id."""
        if self.seq == 0:
            self.unlogged += 1
            eid = f"evt_{self.last_seq}_{self.last_n}x{self.unlogged}"
            return {"type": kind, "event_id": eid, **fields}
        self.n += 1
        self.last_seq, self.last_n = self.seq, self.n
        return {"type": kind, "event_id": f"evt_{self.seq}_{self.n}", **fields}

    def unlogged_event(self, kind: str, **fields: Any) -> ServerEvent:
        """An event of no logged event (a reply), also while one is translated."""
        seq, self.seq = self.seq, 0
        try:
            return self.event(kind, **fields)
        finally:
            self.seq = seq

    def error(self, message: str, *, code: str = "invalid_request_error", **kw: Any) -> ServerEvent:
        """An ``error`` event (unlogged): OpenAI's shape."""
        error = {
            "type": "server_error" if code in _SERVER_ERRORS else "invalid_request_error",
            "code": code,
            "message": message,
            "event_id": kw.get("event_id"),
            "param": kw.get("param"),
        }
        return self.unlogged_event("error", error=error)

    def rate_limits(self, limits: list[tuple[str, int, int, float]]) -> ServerEvent:
        """``rate_limits.updated`` (unlogged): ``(name, limit, remaining, reset_seconds)``."""
        return self.unlogged_event(
            "rate_limits.updated",
            rate_limits=[
                {"name": n, "limit": lim, "remaining": left, "reset_seconds": round(reset, 3)}
                for n, lim, left, reset in limits
            ],
        )
