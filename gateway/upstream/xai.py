"""xAI's Grok Voice API: OpenAI Realtime's events with xAI's own session shape.

The wire is OpenAI's (the same client and server events), the endpoint
``wss://api.x.ai/v1/realtime`` with ``Authorization: Bearer``; the session
is flat: no ``session.type``, ``voice`` and ``turn_detection`` at the top of
``session`` instead of under ``audio`` (docs/providers.md, "xAI Grok
Voice"). So an adapter is OpenAI's with its own ``session.update``.
"""

from __future__ import annotations

from typing import Final

import msgspec

from gateway.upstream import openai_wire as wire
from gateway.upstream.base import ModelOptions, VoiceConfig
from gateway.upstream.models import ModelFacts
from gateway.upstream.openai import OpenAIRealtime
from gateway.upstream.openai_conversation import session_update
from gateway.upstream.provider import Provider, SimFlavour, connect_with

__all__ = ["PROVIDER", "XaiRealtime"]

DEFAULT_MODEL: Final = "grok-voice-latest"


class XaiRealtime(OpenAIRealtime):
    """A Grok Voice session (OpenAI's events, xAI's flat session)."""

    provider = "xai"

    def session_update(
        self, instructions: str, voice: VoiceConfig | None, options: ModelOptions | None
    ) -> wire.Session:
        ga = session_update(instructions, voice, self.transcription_model, options)
        audio = ga.audio
        given_in = audio.input if audio is not None else None
        given_out = audio.output if audio is not None else None
        detection = given_in.turn_detection if given_in is not None else msgspec.UNSET
        return msgspec.structs.replace(
            ga,
            type=None,
            voice=given_out.voice if given_out is not None else None,
            turn_detection=detection,
            audio=wire.AudioConfig(
                input=msgspec.structs.replace(given_in, turn_detection=msgspec.UNSET)
                if given_in is not None
                else None,
                output=msgspec.structs.replace(given_out, voice=None)
                if given_out is not None
                else None,
            )
            if audio is not None
            else None,
        )


MODELS: Final = (
    # Grok Voice: OpenAI's event names, its own session shape. Priced by the minute,
    # so unpriced here (a prices file gives its rate).
    ModelFacts("grok-voice-think-fast-2.0", "text", thinking="level"),
    ModelFacts("grok-voice-think-fast-1.0", "text", thinking="level"),
    ModelFacts("grok-voice-latest", "text", thinking="level"),
)

PROVIDER: Final = Provider(
    name="xai",
    label="xAI Grok Voice",
    wire="openai",
    connect=connect_with(XaiRealtime),
    default_model=DEFAULT_MODEL,
    base_url="wss://api.x.ai/v1",
    key_variable="XAI_API_KEY",
    sim=SimFlavour(base="/v1", auth="bearer", flat=True),
    models=MODELS,
    # xAI documents server VAD (or none: the client commits) and reasoning effort;
    # nothing of the rest.
    controls=frozenset({"reasoning_effort", "manual_turns"}),
)
