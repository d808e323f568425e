"""What a session's configuration asks of the upstream connection for voice.

Pure: a ``SessionConfig`` (``input_audio``, ``output``, ``voice``) and the
session's tools become the adapters' ``VoiceConfig``, or ``None`` for a text
session (whose upstream connection is opened per turn, as ever).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.upstream.base import AudioIn, AudioOut, FunctionTool, VoiceConfig
from protocol.configuration import SessionConfig
from protocol.prompt import ToolSpec

__all__ = ["voice_config"]


def voice_config(config: SessionConfig, tools: Sequence[ToolSpec]) -> VoiceConfig | None:
    """The upstream's voice configuration for ``config``; ``None``: no audio either way.

    In audio output the text protocol's markers would be spoken, so the
    session's tools are declared natively (``FunctionTool``) and the model's
    calls come back as function calls.
    """
    audio = config.input_audio
    speaks = config.output == "audio"
    if audio is None and not speaks:
        return None
    return VoiceConfig(
        audio_in=None
        if audio is None
        else AudioIn(rate=audio.rate, turn_detection=audio.turn_detection),
        audio_out=AudioOut(voice=config.voice) if speaks else None,
        tools=tuple(
            FunctionTool(name=t.name, description=t.description, parameters=t.parameters)
            for t in tools
        )
        if speaks
        else (),
    )
