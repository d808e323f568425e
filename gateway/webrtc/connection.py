"""A WebRTC call served as the door serves a WebSocket client: ``CallConnection``.

The call is a ``DoorConnection`` whose socket is the call's ``CallSocket``:
admitted by the door (``OpenAIDoor.enter``: every check of the gateway's door,
the key's aliases and policy), attached to its session as any client is,
with ``rate_limits.updated`` after each turn, and no second socket. What
differs is the audio, in ``CallConversation``: the model's speech is played
on the track instead of sent as ``response.output_audio.delta``; speech over
the answer (``input_audio_buffer.speech_started``), or the client's
``output_audio_buffer.clear``, cuts the track at once, and the session is
told how much of the answer went out on it (``Played``: what was sent, never
a client's report), also every 100 ms as it plays. The microphone goes in at
48 kHz, once the session's log has been read (on a resumed call it says how
the session hears).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final, cast

import msgspec

from gateway.edge.audio_in import AUDIO_RETRY_EVERY
from gateway.edge.openai_door import DoorConnection
from gateway.sessions.port import NodePort
from gateway.store.base import StoreError
from gateway.webrtc.channel import CallSocket
from gateway.webrtc.media import RATE, Speaker
from protocol.events import Played
from protocol.openai_conversation import Conversation, Emit, ServerEvent
from protocol.openai_events import BadEvent, ClientEvent, OutputAudioBufferClear

__all__ = ["CallConnection", "CallConversation"]

_encoder: Final = msgspec.json.Encoder()
_AUDIO_DELTA: Final = "response.output_audio.delta"
_SPEECH_STARTED: Final = "input_audio_buffer.speech_started"


class CallConversation(Conversation):
    """The door's conversation, with the model's speech on the call's track."""

    def __init__(self, sid: str, model: str, speaker: Speaker, connection_id: str) -> None:
        super().__init__(sid, model, input_rate=RATE, connection_id=connection_id)
        self.speaker = speaker
        self.cut_at: Played | None = None  # a cut's position, not yet told to the session
        # The track plays an answer whose response.created has not come out yet (its
        # speech waits for its event): the answer's played position counts from then.
        self._playing_early = False

    def client(self, event: ClientEvent | BadEvent, *, model_route: tuple[str, str]) -> Emit:
        emit = super().client(event, model_route=model_route)
        if isinstance(event, OutputAudioBufferClear):  # on WebRTC the playback buffer is ours
            heard = self.speaker.cut()
            if heard is not None:
                return Emit([heard, *emit.commands], emit.events)
        return emit

    def gateway(self, event: Any) -> list[ServerEvent]:
        events = super().gateway(event)
        for shown in events:
            if shown["type"] == _SPEECH_STARTED:
                heard = self.speaker.cut()
                if heard is not None:
                    self.cut_at = heard
        return events

    def audio(self, tag: int, pcm16: bytes) -> list[ServerEvent]:
        if not self.answering and not self._playing_early:
            # An answer's first speech: it plays now, though its response.created may
            # wait for the user's turn to be logged (``protocol.openai_speech``).
            self.speaker.answer_started()
            self._playing_early = True
        out = super().audio(tag, pcm16)
        self.speaker.play(tag, pcm16)
        return out

    def _start(self) -> list[ServerEvent]:
        """A response shown (the base's one place): its played position counts from
        here, or from its first speech if that played before it showed."""
        out = super()._start()
        if out:
            if not self._playing_early:
                self.speaker.answer_started()
            self._playing_early = False
        return out

    def _audio(self, tag: int, pcm16: bytes) -> list[ServerEvent]:
        """The base's events of a piece of speech, sent now or after its event: the
        speech itself is on the track, not in a ``response.output_audio.delta``."""
        return [shown for shown in super()._audio(tag, pcm16) if shown["type"] != _AUDIO_DELTA]


class CallConnection(DoorConnection):
    """The door's client connection, its socket a WebRTC call (``CallSocket``)."""

    def __init__(self, node: NodePort, ws: Any, **kwargs: Any) -> None:
        super().__init__(node, ws, **kwargs)
        self.call = cast(CallSocket, ws)
        self.conversation = self.tracked = CallConversation(
            self.sid, self.state.model, self.call.speaker, self.conn_id[:10]
        )
        self._listening: asyncio.Task[None] | None = None
        if not self.call.joined.done():
            self.call.joined.set_result(self.sid)

    # ------------------------------------------------------------- out: the channel

    def _write_now(self, frames: list[bytes], *, binary: bool = False) -> None:
        out = self._speech(frames[0]) if binary else self._translate(frames)
        if out:
            self.call.send_now(out)
        if self.tracked.cut_at is not None:
            self._tell_cut()

    async def _send(self, frames: list[bytes], *, binary: bool = False) -> None:
        out = self._speech(frames[0]) if binary else self._translate(frames)
        if self.tracked.cut_at is not None:
            self._tell_cut()
        if out:
            await self.call.send(out)

    async def _send_events(self, events: list[ServerEvent]) -> None:
        out: list[bytes] = []
        self._emit(events, out)
        if out:
            await self.call.send(out)

    def _tell_cut(self) -> None:
        """The answer's position at a barge-in's cut, for the session's truncation."""
        heard, self.tracked.cut_at = self.tracked.cut_at, None
        frame = _encoder.encode(heard).decode()
        self.node.spawn(self._handle(frame), f"played:{self.sid}")

    # ------------------------------------------------------------- in: the microphone

    async def _open(self) -> None:
        await super()._open()
        # The log up to here is read before the microphone is heard (a resumed call's
        # replay says how the session hears; a new one was configured just now).
        head = self.out.newest
        self._listening = asyncio.create_task(self._microphone(head), name=f"mic:{self.sid}")

    async def _reader(self, writer: asyncio.Task[None]) -> None:
        try:
            await super()._reader(writer)
        finally:
            if self._listening is not None:
                self._listening.cancel()
                with contextlib.suppress(BaseException):
                    await self._listening

    async def _microphone(self, head: int) -> None:
        speaker = self.call.speaker
        conversation = self.tracked
        async for pcm in self.call.microphone():
            if self.last_sent < head or self._close is not None:
                continue
            played = speaker.progress()
            if played is not None:  # kept by the session for a barge-in's cut
                await self._handle(_encoder.encode(played).decode())
            if conversation.hearing and self.mic.now(pcm):
                conversation.requests.heard(len(pcm))  # what a commit will take
                continue  # the common frame: driven here, heard, taken by the upstream now
            if not await self._driven_here():
                continue
            for command in conversation.speech_in(pcm).commands:
                if isinstance(command, bytes):
                    if not self.mic.now(command):
                        await self.mic.send(command)
                else:
                    await self._handle(_encoder.encode(command).decode())

    async def _driven_here(self) -> bool:
        """Whether this node drives the session, so it may hear the microphone.

        A call offered again to this node while the old one still holds the session
        (its lease running out after a crash) asks for it every ``AUDIO_RETRY_EVERY``
        seconds and drops the frames meanwhile. They are not refused: a microphone
        sends 50 a second, and a refusal is an ``error`` that fails the answer the
        session is about to rerun here.
        """
        runtime = self.driven
        if runtime is not None and not runtime.closed:
            return True
        now = time.monotonic()
        if now < self.mic.retry_at:
            return False
        self.mic.retry_at = now + AUDIO_RETRY_EVERY
        if await self._runtime_for_command() is not None:
            return True
        with contextlib.suppress(StoreError):
            await self.node.ask_to_hand_over(self.sid)  # voice is driven where the call is
        return False
