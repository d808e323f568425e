"""What the caller has heard: the model's audio in the carrier's queue, by its marks.

A carrier plays what the app sends at the caller's pace and buffers the
rest, so the app knows what was heard only from the marks it put after each
chunk: the carrier echoes a mark once the audio before it has played. A
``clear`` drops the buffered audio, and the carrier then echoes every
pending mark at once (Twilio's documented behaviour): those echoes are not
playback and are ignored here, since their marks were forgotten at the clear.

``Playback`` turns echoes into the session's playback reports
(``protocol.events.Played``: how many ms of the current answer, up to the
audio frame tagged ``seq``) and counts what the caller heard in all (the
call's talk time). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from protocol.events import Played

__all__ = ["MARK_PREFIX", "Playback"]

MARK_PREFIX: Final = "rtgw-"


class Playback:
    """The marks in flight on one call and what their echoes say."""

    __slots__ = ("_answer", "_answer_ms", "_heard_ms", "_marks", "_next")

    def __init__(self) -> None:
        # (name, the answer's number, seq of the chunk's audio frame, ms of the answer
        # through it, the chunk's ms)
        self._marks: deque[tuple[str, int, int, float, float]] = deque()
        self._next = 0
        self._answer = 0  # the current answer's number
        self._answer_ms = 0.0  # ms of the current answer sent so far (unrounded: chunks add up)
        self._heard_ms = 0.0

    @property
    def heard_ms(self) -> int:
        """ms of all answers the caller heard (the talk time)."""
        return int(self._heard_ms)

    @property
    def playing(self) -> bool:
        """Audio was sent whose mark has not come back: the caller hears (or will) it."""
        return bool(self._marks)

    def new_answer(self) -> None:
        """The audio sent next belongs to a new answer (its ms count from 0). The echoes
        of an earlier answer's marks still count as heard, but report nothing: the
        session's playback reports are of its current answer."""
        self._answer += 1
        self._answer_ms = 0.0

    def sent(self, seq: int, ms: float) -> str:
        """A chunk of ``ms`` ms tagged ``seq`` went to the carrier: the mark to send after it."""
        self._next += 1
        name = f"{MARK_PREFIX}{self._next}"
        self._answer_ms += ms
        self._marks.append((name, self._answer, seq, self._answer_ms, ms))
        return name

    def echoed(self, name: str) -> Played | None:
        """The carrier echoed ``name``: the playback report it makes, or None (a mark
        dropped by a clear, one of another app, or one echoed already)."""
        marks = self._marks
        if not any(mark[0] == name for mark in marks):
            return None
        while marks:
            mark, answer, seq, answer_ms, chunk_ms = marks.popleft()
            self._heard_ms += chunk_ms  # marks come back in order: the ones before played too
            if mark == name:
                return Played(seq=seq, ms=int(answer_ms)) if answer == self._answer else None
        return None  # pragma: no cover - the look above found it

    def clear(self) -> bool:
        """The carrier is told to drop what it holds: forget the marks in flight.
        True when there was audio to drop (the caller was hearing an answer)."""
        playing = bool(self._marks)
        self._marks.clear()
        return playing
