"""The voice steps of the turn machine: speech heard, speech committed, speech said.

``TurnMachine`` (``protocol.turn``) inherits these transitions, as it does
``protocol.turn_tools``'s: they are the machine's own (same state, same rules —
see that module), kept apart because they are one job, a spoken turn. The
user's speech starts a turn when it ends (or when the client commits it) and
cuts the running answer when it begins (barge-in, keeping what the listener
heard); the provider's spoken answer (``Spoken``, ``Thought``) is taken as is,
with no text protocol to parse, and held until its transcript (``user``) is out.
``protocol.spoken`` keeps the held events and the playback; this decides what
each voice input means for the turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from protocol.assembly import BARGED_IN_NOTE, Message
from protocol.events import Cancelled, Error, Respond, SpeechStarted, SpeechStopped, Think
from protocol.parser import Parser
from protocol.spoken import SpokenAnswer
from protocol.turn_events import (
    Action,
    AddNote,
    CommitAudio,
    GuardrailCut,
    Persist,
    Refuse,
    ReplaceResponse,
)
from protocol.turn_state import (
    BACKOFF,
    CANCELLING,
    ENDING,
    IDLE,
    NOTHING,
    STOPPING,
    STREAMING,
    TOOLS,
    TurnState,
)

__all__ = ["BARGED_IN", "GUARDRAIL_CUT", "VoiceSteps"]

_COMMIT: Final = CommitAudio()

BARGED_IN: Final = "interrupted by the user's speech"
GUARDRAIL_CUT: Final = "stopped by a guardrail"


class VoiceSteps:
    """The voice transitions of ``TurnMachine`` (which holds the state named here)."""

    # The machine's state these transitions read and write: its slots are declared
    # by ``TurnMachine`` and ``ToolSteps`` (one class in a layout may declare them).
    __slots__ = ()

    state: TurnState
    spoken: SpokenAnswer
    voice: bool
    _parser: Parser
    _chunk: Callable[[Respond | Think], None]

    # The machine's own steps these transitions lead to (``protocol.turn``).
    def _begin(self, first: list[Action], message: Message | None) -> list[Action]:
        raise NotImplementedError

    def _cancel(
        self, *, barge_in: bool = False, guardrail: bool = False, stop: bool = True
    ) -> list[Action]:
        raise NotImplementedError

    def _guardrail_cut(self, cut: GuardrailCut) -> Sequence[Action]:
        """A guardrail stopped the spoken answer where its audio stopped: cancelled as by
        the user, and the provider keeps the audio heard (``heard_ms``), as after a
        barge-in. Background calls go on (they were not what tripped)."""
        self.spoken.heard_ms = cut.heard_ms
        return self._cancel(guardrail=True, stop=not cut.done)

    def _speech_began(self, offset_ms: int) -> Sequence[Action]:
        self.spoken.speech_open = True
        offset_ms += self.spoken.audio_base_ms  # into the session's audio
        out: list[Action] = [SpeechStarted(offset_ms=offset_ms)]
        state = self.state
        if state is STREAMING or state is STOPPING or state is TOOLS or state is BACKOFF:
            out += self._cancel(barge_in=True)
        elif state is IDLE:
            heard = self.spoken.cut()
            if heard is not None:
                # The answer is complete but still playing: history and the provider
                # keep what the listener heard of it, as after a running turn's barge-in.
                out[0] = SpeechStarted(offset_ms=offset_ms, heard_ms=heard)
                note = Cancelled(content=BARGED_IN, reason="barge_in", heard_ms=heard)
                out.append(Persist((note,)))
                # The provider's copy is cut on the connection that wrote it; one opened
                # since (a configure between turns) was given it whole from history, and
                # a replacement there would add the answer a second time: it is told
                # what was heard, as history tells the next connection.
                if self.voice and self.spoken.answer_here:
                    spoken = self.spoken
                    text = spoken.text if spoken.chars else self._parser.accepted_text
                    out.append(ReplaceResponse(text, heard_ms=heard))
                elif self.voice:
                    out.append(AddNote(BARGED_IN_NOTE.format(seconds=heard / 1000)))
        return out

    def audio_sent(self, ms: float) -> bool:
        """The answer's next ``ms`` of audio (the hot path: no actions). True: the shell
        sends it to the clients (what the listener has not heard yet can still be cut);
        False: it is the rest of a cancelled answer."""
        if self.state is not STREAMING:
            return False
        self.spoken.audio_sent(ms)
        return True

    def _speech_ended(self, offset_ms: int) -> Sequence[Action]:
        self.spoken.speech_open = False
        offset_ms += self.spoken.audio_base_ms
        out: list[Action] = [SpeechStopped(offset_ms=offset_ms)]
        state = self.state
        if state is IDLE:
            out += self._begin_spoken([])
        elif state is ENDING or state is CANCELLING:
            self.spoken.queued = True  # answered once the closing turn is over
        return out

    def _commit(self) -> Sequence[Action]:
        if self.state is not IDLE:
            return [
                Refuse(
                    Error(
                        code="turn_active",
                        content="a turn is already running; wait for its end event "
                        "(or send cancel) before committing speech",
                    )
                )
            ]
        out = self._begin_spoken([])
        out.append(_COMMIT)
        return out

    def _begin_spoken(self, first: list[Action]) -> list[Action]:
        """A spoken turn: the provider has the speech and answers it; its transcript
        (the ``user`` event) comes first, so what the answer brings is held till then."""
        out = self._begin(first, None)
        out.pop()  # no request: the provider answers by itself (or on CommitAudio)
        self.spoken.begin()
        return out

    def _said(self, event: Respond | Think) -> Sequence[Action]:
        """A chunk the provider gave as answer (``Spoken``) or thinking (``Thought``) as is:
        no text protocol to parse (audio output, or a model that only speaks)."""
        if self.state is not STREAMING:
            return NOTHING  # leftovers of a cancelled answer
        self._chunk(event)
        if type(event) is Respond:
            self.spoken.said(event.content)
        if self.spoken.hold((event,)):
            return NOTHING
        return [event]
