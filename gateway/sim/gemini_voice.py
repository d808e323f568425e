"""The Gemini simulator's audio input: what the simulated service hears, and when it answers.

``realtimeInput.audio`` is PCM16 at the rate its ``mimeType`` names. With
automatic activity detection the simulated VAD hears speech: its start cuts a
running turn, its end makes the speech a user turn the model answers (both
announced as ``voiceActivity`` with ``explicitVadSignal``, the transcript as
``inputTranscription`` when asked). Without it the client brackets speech with
``activityStart`` and ``activityEnd``. Apart from the connection
(``gateway.sim.gemini``), as ``openai_voice`` is from the OpenAI flavour's,
because hearing speech is its own job; the turns stay the connection's.
"""

from __future__ import annotations

import re
from typing import Final, Protocol

from gateway.sim.gemini_setup import SetUp
from gateway.sim.model import SimConfig, speech_transcript
from gateway.sim.vad import SpeechSpan, Vad, VadStart
from gateway.upstream import gemini_wire as wire

__all__ = ["VoiceHost", "VoiceInput"]

# The input rate when a mimeType names none.
_INPUT_RATE: Final = 16000
_RATE: Final = re.compile(r"rate=(\d+)")


class VoiceHost(Protocol):
    """The connection the audio comes in on."""

    @property
    def setup(self) -> SetUp: ...

    async def _send(self, message: wire.ServerMessage) -> None: ...

    async def _refuse(self, code: int, reason: str) -> None: ...

    async def interrupt(self) -> None: ...

    def user_turn(self, text: str) -> None: ...


class VoiceInput:
    """One connection's VAD and manual activity (see the module docstring)."""

    __slots__ = ("activity", "config", "host", "vad")

    def __init__(self, host: VoiceHost, config: SimConfig) -> None:
        self.host = host
        self.config = config
        self.vad: Vad | None = None  # made for the rate of the first audio chunk
        self.activity: SpeechSpan | None = None  # audio since activityStart (manual)

    async def realtime_input(self, given: wire.RealtimeInput) -> None:
        host = self.host
        marks = given.activity_start is not None or given.activity_end is not None
        if marks and host.setup.auto_vad:
            await host._refuse(
                1007,
                "activityStart/activityEnd need automatic activity detection disabled "
                "(realtimeInputConfig.automaticActivityDetection.disabled).",
            )
            return
        if given.activity_start is not None:
            await host.interrupt()
            self.activity = SpeechSpan(self.rate, threshold=self.config.vad_threshold)
        if given.audio is not None:
            await self._audio(given.audio)
        if given.activity_end is not None and self.activity is not None:
            heard, self.activity = self.activity, None
            await self._heard(heard.speech_ms)
        if given.text:
            await host.interrupt()
            host.user_turn(given.text)

    @property
    def rate(self) -> int:
        return self.vad.rate if self.vad is not None else _INPUT_RATE

    async def _audio(self, blob: wire.Blob) -> None:
        match = _RATE.search(blob.mime_type or "")
        rate = int(match.group(1)) if match else _INPUT_RATE
        pcm = blob.data or b""
        if self.vad is None or self.vad.rate != rate:
            config = self.config
            self.vad = Vad(
                rate,
                threshold=config.vad_threshold,
                min_speech_ms=config.vad_min_speech_ms,
                silence_ms=self.host.setup.silence_ms or config.vad_silence_ms,
            )
        if not self.host.setup.auto_vad:
            if self.activity is not None:
                if self.activity.rate != rate:  # measured at the rate the audio comes at
                    self.activity = SpeechSpan(rate, threshold=self.config.vad_threshold)
                self.activity.feed(pcm)
            return
        for found in self.vad.feed(pcm):
            if isinstance(found, VadStart):
                await self._voice_activity("ACTIVITY_START", found.offset_ms)
                await self.host.interrupt()
            else:
                await self._voice_activity("ACTIVITY_END", found.offset_ms)
                await self._heard(found.speech_ms)

    async def _voice_activity(self, kind: str, offset_ms: int) -> None:
        if self.host.setup.explicit_vad:
            activity = wire.VoiceActivity(
                voice_activity_type=kind, audio_offset=f"{offset_ms / 1000:.3f}s"
            )
            await self.host._send(wire.ServerMessage(voice_activity=activity))

    async def _heard(self, speech: int) -> None:
        """The user's speech ended: it becomes a user turn, and the model answers."""
        transcript = speech_transcript(speech)
        if self.host.setup.input_transcription:
            await self.host._send(
                wire.ServerMessage(
                    server_content=wire.ServerContent(
                        input_transcription=wire.Transcription(text=transcript, finished=True)
                    )
                )
            )
        await self.host.interrupt()
        self.host.user_turn(transcript)
