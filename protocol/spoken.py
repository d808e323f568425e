"""A spoken turn's own state, for the turn machine (``protocol.turn``).

A turn the provider starts by itself (its VAD heard the user stop) brings
its answer before the transcript of what the user said: the answer's
events are held until the ``user`` event can go first. A spoken answer's
transcript is its text (no protocol to parse), and the client says how much
of its audio it actually played (``played``), so a barge-in tells the
provider — and the log — what the user heard.

Barge-in is decided by what the listener still hears, not by whether the
model's turn runs: a model writes speech several times faster than it plays,
so an answer is often complete (the turn over) while the listener has heard
only its start. The shell counts the answer's audio sent to clients
(``audio_sent``); while the newest ``played`` report is behind it, speech
cuts the answer there (``cut``), as it does a running turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from protocol.events import User
from protocol.turn_events import Action, Persist

__all__ = ["UNHEARD", "SpokenAnswer"]

UNHEARD: Final = "(speech without a transcript)"  # a spoken turn whose transcript never came
PLAYED_SLACK_MS: Final = 100
"""An answer played to within this many ms of its end counts as heard in full (a phone
call's resampler keeps a few ms back; a client reports at intervals)."""


class SpokenAnswer:
    """What the machine keeps of the current spoken turn (see the module docstring)."""

    __slots__ = (
        "_held",
        "_transcript",
        "answer_here",
        "audio_base_ms",
        "heard_ms",
        "queued",
        "sent_ms",
        "speech_open",
    )

    def __init__(self) -> None:
        self._held: list[Action] | None = None  # the turn's events waiting for its transcript
        self._transcript: list[str] = []  # the spoken answer's transcript so far
        self.heard_ms: int | None = None  # how much of its audio the client played
        self.queued = False  # the user spoke while the turn was closing
        self.sent_ms = 0.0  # ms of the answer's audio sent to clients
        # The open connection heard the user start speaking and not stop yet.
        self.speech_open = False
        # The open connection wrote the answer: a cut truncates its copy there (one
        # opened between turns was given the answer whole, from history).
        self.answer_here = False
        # The session's audio the connections before the open one were sent: its
        # speech offsets count from there (they are the session's, not the connection's).
        self.audio_base_ms = 0

    @property
    def holding(self) -> bool:
        return self._held is not None

    def new_attempt(self) -> None:
        self.answer_here = True
        self._transcript = []
        self.heard_ms = None
        self.sent_ms = 0.0

    def audio_sent(self, ms: float) -> None:
        """``ms`` more of the answer's audio went to the clients."""
        self.sent_ms += ms

    @property
    def playing(self) -> bool:
        """The answer's audio is still playing: the newest ``played`` report is behind
        what was sent."""
        heard = self.heard_ms
        return heard is not None and heard + PLAYED_SLACK_MS < self.sent_ms

    @property
    def reopen_loses(self) -> bool:
        """A new upstream connection now would lose what the open one holds: the user's
        speech under way (the provider commits it when it ends), or an answer still
        playing (a barge-in cuts the provider's copy of it there)."""
        return self.speech_open or self.playing

    def cut(self) -> int | None:
        """The user spoke over a finished answer: how much of it the listener had heard,
        if its audio is still ``playing``, else None. Taking it spends it: the answer is
        cut once."""
        heard = self.heard_ms
        if heard is None or not self.playing:
            return None
        self.sent_ms = 0.0
        return heard

    def begin(self) -> None:
        """A spoken turn begins: its events wait for the transcript of the user's speech."""
        self._held = []

    def hold(self, actions: Sequence[Action]) -> bool:
        """Keep ``actions`` for after the ``user`` event; False: nothing is held now."""
        if self._held is None:
            return False
        self._held += actions
        return True

    def release(self, text: str) -> list[Action]:
        """The spoken turn's ``user`` event (persisted), then what waited for it."""
        held, self._held = self._held, None
        if held is None:
            return []
        return [
            User(content=text, source="audio"),
            Persist((User(content=text, source="audio"),)),
            *held,
        ]

    def said(self, text: str) -> None:
        self._transcript.append(text)

    @property
    def text(self) -> str:
        return "".join(self._transcript)

    @property
    def chars(self) -> int:
        return sum(map(len, self._transcript))

    def played(self, ms: int) -> Sequence[Action]:
        """The client played ``ms`` of the answer's audio (its newest report wins)."""
        self.heard_ms = ms
        return ()

    def forget(self) -> None:
        """The session stops on this node: nothing is held or queued any more."""
        self._held = None
        self.queued = False
        self.speech_open = False
