"""The OpenAI simulator's audio input: what the simulated server hears, and when it answers.

With server VAD (``server_vad`` or ``semantic_vad``: the simulator's VAD is
the same for both) speech start and stop are announced
(``input_audio_buffer.speech_started``/``speech_stopped``), the speech is
committed as a user item and answered; speech during an answer cancels it
(``interrupt_response``). Without VAD the client appends and commits (at
least 100 ms). After an answer, ``idle_timeout_ms`` without speech is a
turn of its own (``input_audio_buffer.timeout_triggered``, then the model
speaks again).
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

from gateway.sim.model import SimConfig
from gateway.sim.openai_items import ConversationHost
from gateway.sim.openai_state import DEFAULT_TURN_DETECTION, INPUT_RATE
from gateway.sim.vad import SpeechSpan, Vad, VadStart
from gateway.upstream import openai_wire as wire

__all__ = ["VoiceInput"]

# A commit needs at least this much audio in the buffer.
_MIN_COMMIT_MS: Final = 100


class VoiceHost(ConversationHost, Protocol):
    """The connection the audio comes in on (its events go out as the conversation's do)."""

    @property
    def responding(self) -> bool: ...

    def turn_detection(self) -> wire.TurnDetection | None: ...

    async def cancel_response(self, reason: str) -> None: ...

    async def start_response(self) -> None: ...

    async def commit_speech(self, item_id: str, speech: int) -> None: ...


class VoiceInput:
    """One connection's input audio buffer, VAD and idle timer (see the module docstring)."""

    __slots__ = ("host", "idle", "manual", "silence_ms", "speech_item", "tuned_for", "vad")

    def __init__(self, host: VoiceHost, config: SimConfig) -> None:
        self.host = host
        self.vad = Vad(
            INPUT_RATE,
            threshold=config.vad_threshold,
            min_speech_ms=config.vad_min_speech_ms,
            silence_ms=config.vad_silence_ms,
        )
        self.silence_ms = config.vad_silence_ms
        self.tuned_for: wire.TurnDetection | None = None  # the detection the VAD follows
        # Audio appended since the last commit, measured without server VAD.
        self.manual = SpeechSpan(INPUT_RATE, threshold=config.vad_threshold)
        self.speech_item: str | None = None  # the item id of the speech being heard
        self.idle: asyncio.Task[None] | None = None  # server VAD's idle timeout, running

    def clear(self) -> None:
        self.manual.clear()
        self.vad.reset()
        self.speech_item = None

    async def append(self, event: wire.InputAudioBufferAppend) -> None:
        pcm = event.audio
        detection = self.host.turn_detection()
        if detection is None:
            self.manual.feed(pcm)
            return
        if detection is not self.tuned_for:  # a session.update changed it (not per frame)
            self.tuned_for = detection
            # A silence the session set waits that long; OpenAI's default, the node's.
            silence = detection.silence_duration_ms
            if silence is None or silence == DEFAULT_TURN_DETECTION.silence_duration_ms:
                silence = self.silence_ms
            self.vad.end_after(silence)
        for found in self.vad.feed(pcm):
            if isinstance(found, VadStart):
                await self._speech_started(found.offset_ms, detection)
            else:
                await self._speech_stopped(found.offset_ms, found.speech_ms, detection)

    def stop_idle(self) -> None:
        idle, self.idle = self.idle, None
        if idle is not None and idle is not asyncio.current_task():
            idle.cancel()

    def start_idle(self) -> None:
        """After an answer, server VAD's ``idle_timeout_ms`` without speech speaks again."""
        detection = self.host.turn_detection()
        if detection is None or detection.type != "server_vad" or not detection.idle_timeout_ms:
            return
        self.stop_idle()
        self.idle = asyncio.create_task(self._idle_after(detection.idle_timeout_ms))

    async def _idle_after(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)
        if self.host.responding or self.vad.speaking:
            return
        self.idle = None
        end = self.vad.frames * 20
        item_id = self.host._new_id("item")
        await self.host._send(
            wire.InputAudioBufferTimeoutTriggered(
                event_id=self.host._eid(),
                item_id=item_id,
                audio_start_ms=max(0, end - ms),
                audio_end_ms=end,
            )
        )
        await self.host.commit_speech(item_id, 0)
        await self.host.start_response()

    async def _speech_started(self, offset_ms: int, detection: wire.TurnDetection) -> None:
        self.stop_idle()
        item_id = self.speech_item = self.host._new_id("item")
        await self.host._send(
            wire.InputAudioBufferSpeechStarted(
                event_id=self.host._eid(), audio_start_ms=offset_ms, item_id=item_id
            )
        )
        if self.host.responding and detection.interrupt_response is not False:
            await self.host.cancel_response("turn_detected")

    async def _speech_stopped(
        self, offset_ms: int, speech: int, detection: wire.TurnDetection
    ) -> None:
        item_id = self.speech_item or self.host._new_id("item")
        self.speech_item = None
        await self.host._send(
            wire.InputAudioBufferSpeechStopped(
                event_id=self.host._eid(), audio_end_ms=offset_ms, item_id=item_id
            )
        )
        await self.host.commit_speech(item_id, speech)
        if detection.create_response is not False and not self.host.responding:
            await self.host.start_response()

    async def commit(self, event: wire.InputAudioBufferCommit) -> None:
        if self.host.turn_detection() is None:
            buffered_ms = self.manual.heard_ms
            speech = self.manual.speech_ms
        else:
            vad = self.vad
            buffered_ms = (vad.frames - vad.start_frame) * 20 if vad.speaking else 0
            speech = (vad.last_loud_end - vad.start_frame) * 20 if vad.speaking else 0
        if buffered_ms < _MIN_COMMIT_MS:
            await self.host._error(
                "Error committing input audio buffer: buffer too small. Expected at least "
                f"{_MIN_COMMIT_MS}ms of audio, but buffer only has {buffered_ms:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
                event_id=event.event_id,
            )
            return
        self.manual.clear()
        self.vad.reset()
        item_id = self.speech_item or self.host._new_id("item")
        self.speech_item = None
        await self.host.commit_speech(item_id, speech)
