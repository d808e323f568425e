"""What a Gemini Live session's every connection says in its ``setup``, and the message itself.

The conversation (``gateway.upstream.gemini_conversation``) keeps what changes
as the session goes (the transcript, the server's copy, the turn); these are
the settings that do not: the voice (modalities, the speaker, transcription,
the tools and which of them run in the background), the model's facts (how
it thinks), the context's compression and the reasoning effort. ``setup``
writes them, with the instructions and a resumption handle, as the ``setup``
message a new connection opens with. Pure, like the conversation: no socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import msgspec

from gateway.upstream import gemini_wire as wire
from gateway.upstream.base import AudioIn, VoiceConfig
from gateway.upstream.models import ModelFacts

DEFAULT_THRESHOLD: Final = 0.5  # OpenAI's server VAD default, the door's clients' unit

__all__ = ["Compression", "LiveSettings"]


class Compression(msgspec.Struct, frozen=True):
    """Context window compression: past ``trigger_tokens`` (0: the server's default) the
    context is cut to the newest ``target_tokens`` (0: half the trigger), so a session
    is not ended by the context's size (without it, 15 minutes of audio)."""

    trigger_tokens: int = 0
    target_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LiveSettings:
    """A session's settings for every connection's ``setup`` (see the module docstring).

    ``manual_activity``: the client ends its turns itself (turn detection
    ``none``), so the audio is bracketed with ``activityStart``/``activityEnd``;
    ``background``: the functions declared ``NON_BLOCKING``.
    """

    voice: VoiceConfig | None = None
    model: ModelFacts | None = None
    compression: Compression | None = None
    effort: str | None = None
    manual_activity: bool = field(init=False)
    background: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        voice = self.voice
        audio_in = voice.audio_in if voice is not None else None
        manual = audio_in is not None and audio_in.turn_detection == "none"
        background = (
            frozenset(t.name for t in voice.tools if t.background) if voice else frozenset()
        )
        object.__setattr__(self, "manual_activity", manual)
        object.__setattr__(self, "background", background)

    def setup(self, model_name: str, instructions: str, handle: str) -> wire.Setup:
        """The ``setup`` message: these settings, ``instructions``, and ``handle`` (if any)
        to continue the server's copy of the conversation."""
        instruction = wire.text_content(None, instructions) if instructions else None
        voice = self.voice
        resumption = wire.SessionResumptionConfig(handle=handle or None)
        compression = self.compression
        window = (
            None
            if compression is None
            else wire.ContextWindowCompression(
                trigger_tokens=compression.trigger_tokens or None,
                sliding_window=wire.SlidingWindow(target_tokens=compression.target_tokens or None),
            )
        )
        model = self.model
        thinking = None
        if model is not None and model.thinking != "none":
            # A session's reasoning effort is the model's thinking level where it has levels.
            level = self.effort.upper() if self.effort and model.thinking == "level" else None
            thinking = wire.ThinkingConfig(include_thoughts=True, thinking_level=level)
        if voice is None:
            return wire.Setup(
                model=model_name,
                generation_config=wire.GenerationConfig(
                    response_modalities=["TEXT"], thinking_config=thinking
                ),
                system_instruction=instruction,
                session_resumption=resumption,
                context_window_compression=window,
            )
        audio_in, audio_out = voice.audio_in, voice.audio_out
        speech = None
        if audio_out is not None and audio_out.voice:
            speech = wire.SpeechConfig(
                voice_config=wire.VoiceConfig(
                    prebuilt_voice_config=wire.PrebuiltVoiceConfig(voice_name=audio_out.voice)
                )
            )
        declarations = [
            wire.FunctionDeclaration(
                name=tool.name,
                description=tool.description or None,
                parameters_json_schema=tool.parameters or {"type": "object"},
                # The model goes on while it runs; its response comes WHEN_IDLE.
                behavior="NON_BLOCKING" if tool.background else None,
            )
            for tool in voice.tools
        ]
        return wire.Setup(
            model=model_name,
            generation_config=wire.GenerationConfig(
                response_modalities=["AUDIO" if audio_out is not None else "TEXT"],
                speech_config=speech,
                thinking_config=thinking,
            ),
            system_instruction=instruction,
            session_resumption=resumption,
            context_window_compression=window,
            tools=[wire.Tool(function_declarations=declarations)] if declarations else None,
            realtime_input_config=_activity_detection(audio_in, manual=self.manual_activity),
            input_audio_transcription=(
                {} if audio_in is not None and audio_in.transcription else None
            ),
            output_audio_transcription={} if audio_out is not None else None,
            explicit_vad_signal=True if audio_in is not None and not self.manual_activity else None,
        )


def _activity_detection(
    audio_in: AudioIn | None, *, manual: bool
) -> wire.RealtimeInputConfig | None:
    """``realtimeInputConfig``: activity detection off (the client's turns), or tuned as
    the session asked (docs/providers.md, "Session controls"). Gemini has no loudness
    threshold: a ``threshold`` above OpenAI's default 0.5 asks for louder speech (start
    sensitivity LOW), one below it for softer (HIGH); 0.5 keeps Gemini's default."""
    if manual:
        return wire.RealtimeInputConfig(
            automatic_activity_detection=wire.AutomaticActivityDetection(disabled=True)
        )
    if audio_in is None:
        return None
    threshold = audio_in.threshold
    sensitivity = None
    if threshold is not None and threshold != DEFAULT_THRESHOLD:
        sensitivity = (
            "START_SENSITIVITY_LOW" if threshold > DEFAULT_THRESHOLD else "START_SENSITIVITY_HIGH"
        )
    tuned = wire.AutomaticActivityDetection(
        start_of_speech_sensitivity=sensitivity,
        prefix_padding_ms=audio_in.prefix_padding_ms,
        silence_duration_ms=audio_in.silence_duration_ms,
    )
    if tuned == wire.AutomaticActivityDetection():
        return None
    return wire.RealtimeInputConfig(automatic_activity_detection=tuned)
