"""The client's pure core: which frames are new, and when a turn is over.

Sans-I/O, like ``protocol/``: nothing here opens a socket, awaits or reads a
clock, so the rules every client needs — the Python ``Client``, ``gateway
loadtest`` and the JavaScript client (``clients/js``, the same rules) — are
tested without a server.

Two rules:

- **Seq.** Every logged event carries ``seq`` (+1 per event, per session). A
  frame with ``seq_from`` merges the chunks ``seq_from..seq`` and counts as
  contiguous. An ``error`` with a seq not above the last one is a reply to the
  client's own frame (unlogged: it repeats the last seq) and is passed on
  without moving the cursor. Anything else at or below the last seq is a
  duplicate (a replay overlapping what the client holds): dropped. A frame that
  starts past ``last + 1`` is a gap; a reconnecting client refills it by
  resuming with ``after=last`` (the log has every event, and a replay is never
  merged).
- **The end of a turn.** A turn ends with one closing event — ``end``,
  ``cancelled``, or an ``error`` that stops the turn — and the ``metric`` that
  follows it. Older servers send ``end`` then ``metric``, ``metric``
  then ``end`` when the model stopped without ``<end>``, ``error`` then
  ``end`` (maybe a metric) when the turn failed, and ``cancelled`` with no
  metric. ``TurnTracker`` accepts all of these: after a closing event the turn
  is over at the next ``metric``; at once if the closing event came right
  after a metric, or is an ``end`` right after a turn-stopping ``error``; or, if something other than a metric comes next (another
  closing event aside), before that event. A client that must not wait for a
  metric that may never come (today's ``cancelled``) also stops after a short
  grace (``Client(metric_grace=…)``).
"""

from __future__ import annotations

from enum import Enum
from typing import Final

__all__ = [
    "METRIC_GRACE",
    "REFUSAL_CODES",
    "TURN_ENDING_ERROR_CODES",
    "SeqVerdict",
    "TurnTracker",
    "check_seq",
    "classify_seq",
]

METRIC_GRACE: Final = 0.5
"""Seconds a client waits for the metric after a closing event before calling the turn over."""

TURN_ENDING_ERROR_CODES: Final = frozenset({"upstream", "upstream_timeout", "internal"})
"""Logged ``error`` codes that stop the running turn (``store``/``log_trimmed`` do not).

``malformed_execute`` is not one: the gateway hands the broken block back to
the model and the turn goes on (a ``metric``, a ``result``, the model's next
step); the third in a row comes just before the turn's ``end``, which closes it."""

REFUSAL_CODES: Final = frozenset(
    {"turn_active", "rate_limited", "quota_exceeded", "draining", "bad_frame", "internal"}
)
"""Unlogged ``error`` replies to a ``user`` frame: that turn never started."""


class SeqVerdict(Enum):
    """What a frame's seq means for a client that holds everything up to ``last``."""

    NEW = "new"
    """The next event(s): deliver and move the cursor to ``seq``."""
    REPLY = "reply"
    """An unlogged reply to this client's own frame: deliver, cursor unchanged."""
    DUPLICATE = "duplicate"
    """Already held: drop."""
    GAP = "gap"
    """Events between ``last`` and this frame are missing (or a merged frame overlaps)."""


def classify_seq(kind: str, seq: int, last: int, seq_from: int = -1) -> SeqVerdict:
    """The verdict on one frame (``seq_from < 0``: a single event)."""
    first = seq if seq_from < 0 else seq_from
    if seq_from > seq:
        return SeqVerdict.DUPLICATE  # malformed: never deliver it
    if first == last + 1:
        return SeqVerdict.NEW
    if seq <= last:
        if kind == "error" and seq_from < 0:
            return SeqVerdict.REPLY
        return SeqVerdict.DUPLICATE
    return SeqVerdict.GAP  # starts past last + 1, or a merged frame straddling last


def check_seq(kind: str, seq: int, last: int, seq_from: int = -1) -> tuple[int, str | None]:
    """``classify_seq`` for a checker that reports rather than repairs (``gateway loadtest``).

    Returns the new last seq and the problem, if any: ``seq_gap`` (the check
    resumes after ``seq``) or ``seq_duplicate``. An ``error`` reply just past
    ``last`` is also fine (its seq may have moved on by the time it is sent).
    """
    if seq_from > seq:
        return max(last, seq), "seq_duplicate"
    verdict = classify_seq(kind, seq, last, seq_from)
    if verdict is SeqVerdict.NEW:
        return seq, None
    if verdict is SeqVerdict.REPLY:
        return last, None
    if verdict is SeqVerdict.DUPLICATE:
        return max(last, seq), "seq_duplicate"
    first = seq if seq_from < 0 else seq_from
    if first <= last:  # a merged frame overlapping what was held
        return seq, "seq_duplicate"
    return seq, "seq_gap"


class TurnTracker:
    """Decides, event by event, when one turn is over (see the module docstring).

    Feed it the event kinds of one turn in order (``error`` with its code).
    ``feed`` returns True when the turn is over *with* this event; ``ends_before``
    says whether a coming event belongs to the next turn instead (the turn ended
    with the event before it). ``closing`` is True between the closing event and
    the metric that should follow it: the moment to start a grace timer.
    """

    __slots__ = ("closing", "done", "failed", "prev")

    def __init__(self) -> None:
        self.closing = False
        self.done = False
        self.failed = False
        """An error stopped the turn (or ``cancelled``): it did not complete."""
        self.prev = ""

    def ends_before(self, kind: str) -> bool:
        """True if the turn is already over and ``kind`` is not part of it."""
        if self.done:
            return True
        if self.closing and kind not in ("metric", "end", "error"):
            self.done = True
        return self.done

    def feed(self, kind: str, code: str = "") -> bool:
        """Account one event of the turn; True when the turn is over with it."""
        if self.done:
            return True
        prev, self.prev = self.prev, kind
        if kind == "metric":
            if self.closing:
                self.done = True
        elif kind in ("end", "cancelled"):
            if kind == "cancelled":
                self.failed = True
            if self.closing or prev == "metric":
                # error then end (the turn failed), or metric then end (the
                # model stopped without <end>): no metric follows.
                self.done = True
            self.closing = True
        elif kind == "error" and code in TURN_ENDING_ERROR_CODES:
            self.failed = True
            self.closing = True
        return self.done

    def expire(self) -> None:
        """No metric came within the grace after the closing event: the turn is over."""
        if self.closing:
            self.done = True
