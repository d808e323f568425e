"""The Gemini simulator's ``setup``: what a session asks for, accepted or refused the API's way.

Apart from the connection (``gateway.sim.gemini``) because it is a decision
on one message, made once, with no socket: the key, the model (known, not
shut down), the response modalities the model can answer in, thinking, a
resumption handle (valid, unexpired, for this model) and the context window's
compression are checked in the service's order, and the answer is either a
``Refusal`` (the close code and reason the service sends) or a ``SetUp``, the
settings the connection then reads.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gateway.upstream import gemini_wire as wire
from gateway.upstream.providers import facts

__all__ = ["HANDLE_LIFETIME", "NOT_SET_UP", "Refusal", "Resumable", "SetUp", "accept_setup"]

# How long a resumption handle stays valid after the session it names ends (the API's 2 h).
HANDLE_LIFETIME: Final = 2 * 3600.0


@dataclass(frozen=True, slots=True)
class Resumable:
    """What a resumption handle continues: the model, the instructions and the turns."""

    model: str
    instructions: str
    turns: tuple[tuple[str, str], ...]
    at: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """The close a refused setup gets: its code and the service's reason."""

    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class SetUp:
    """What an accepted setup asked for (``model`` is ``models/NAME``; "" before setup)."""

    model: str = ""
    instructions: str = ""
    resumed: tuple[tuple[str, str], ...] | None = None  # the turns of a session resumed
    audio_out: bool = False
    auto_vad: bool = True
    silence_ms: int | None = None  # automaticActivityDetection.silenceDurationMs
    explicit_vad: bool = False
    input_transcription: bool = False
    output_transcription: bool = False
    functions: frozenset[str] = frozenset()
    non_blocking: frozenset[str] = frozenset()  # functions declared NON_BLOCKING
    resumption: bool = False  # the setup asked for resumption handles
    thoughts: bool = False  # the setup asked for thoughts, and the model has them


NOT_SET_UP: Final = SetUp()


def accept_setup(
    setup: wire.Setup,
    *,
    api_key: str | None,
    key: str | None,
    handles: Mapping[str, Resumable],
) -> SetUp | Refusal:
    """``setup`` accepted, or the refusal the service answers it with."""
    if api_key is not None and key != api_key:
        if not key:
            return Refusal(
                1008,
                "Method doesn't allow unregistered callers: pass an API key "
                "(?key=KEY or the x-goog-api-key header).",
            )
        return Refusal(1007, "API key not valid. Please pass a valid API key.")
    name = setup.model.removeprefix("models/")
    model = facts("gemini", name)
    if (
        not setup.model.startswith("models/")
        or not name
        or "/" in name
        or model.shut_down_by(datetime.date.today())
    ):
        return Refusal(
            1008,
            f"{setup.model} is not found for API version v1beta, or is not supported "
            "for bidiGenerateContent",
        )
    config = setup.generation_config
    modalities = config.response_modalities if config is not None else None
    if modalities not in (["TEXT"], ["AUDIO"], None):
        return Refusal(
            1007,
            f"The requested combination of response modalities ({', '.join(modalities)}) "
            'is not supported: set responseModalities ["TEXT"] or ["AUDIO"].',
        )
    if modalities == ["TEXT"] and model.answers == "audio":
        # Audio-native models answer in speech only (its transcript is the text).
        return Refusal(*model.text_refusal)
    thinking = config.thinking_config if config is not None else None
    if thinking is not None and model.thinking == "none":
        return Refusal(1007, f"Thinking is not supported by {name}: remove thinkingConfig.")
    resumed = _resume(setup, name, handles)
    if isinstance(resumed, Refusal):
        return resumed
    window = setup.context_window_compression
    if window is not None:
        target = window.sliding_window.target_tokens if window.sliding_window else None
        trigger = window.trigger_tokens
        if (trigger is not None and trigger < 0) or (
            target is not None and trigger is not None and target >= trigger
        ):
            return Refusal(
                1007,
                "contextWindowCompression.slidingWindow.targetTokens must be below triggerTokens.",
            )
    detection = (
        setup.realtime_input_config.automatic_activity_detection
        if setup.realtime_input_config is not None
        else None
    )
    if detection is not None and (problem := _detection_refusal(detection)) is not None:
        return Refusal(1007, problem)
    declarations = [
        declaration
        for tool in setup.tools or ()
        for declaration in tool.function_declarations or ()
        if declaration.name
    ]
    instructions = resumed.instructions if resumed is not None else ""
    instruction = setup.system_instruction
    if instruction is not None:
        instructions = "".join(part.text or "" for part in instruction.parts)
    return SetUp(
        model=setup.model,
        instructions=instructions,
        resumed=resumed.turns if resumed is not None else None,
        audio_out=modalities != ["TEXT"],
        auto_vad=not (detection is not None and detection.disabled),
        silence_ms=detection.silence_duration_ms if detection is not None else None,
        explicit_vad=bool(setup.explicit_vad_signal),
        input_transcription=setup.input_audio_transcription is not None,
        output_transcription=setup.output_audio_transcription is not None,
        functions=frozenset(d.name for d in declarations if d.name),
        non_blocking=frozenset(
            d.name for d in declarations if d.name and d.behavior == "NON_BLOCKING"
        ),
        resumption=setup.session_resumption is not None,
        thoughts=bool(thinking is not None and thinking.include_thoughts),
    )


_SENSITIVITIES: Final = {
    "start_of_speech_sensitivity": frozenset(
        ("START_SENSITIVITY_UNSPECIFIED", "START_SENSITIVITY_HIGH", "START_SENSITIVITY_LOW")
    ),
    "end_of_speech_sensitivity": frozenset(
        ("END_SENSITIVITY_UNSPECIFIED", "END_SENSITIVITY_HIGH", "END_SENSITIVITY_LOW")
    ),
}


def _detection_refusal(detection: wire.AutomaticActivityDetection) -> str | None:
    """What the service refuses of ``automaticActivityDetection``: a sensitivity not of
    its enum (in Google's words for a JSON value no proto enum has), a negative
    duration (the API's ``AutomaticActivityDetection``: docs/providers.md)."""
    where = "setup.realtime_input_config.automatic_activity_detection"
    for name, allowed in _SENSITIVITIES.items():
        value = getattr(detection, name)
        if value is not None and value not in allowed:
            return f"Invalid value at '{where}.{name}', {str(value)[:40]!r}"
    for name in ("prefix_padding_ms", "silence_duration_ms"):
        value = getattr(detection, name)
        if value is not None and value < 0:
            return f"Invalid value at '{where}.{name}': a duration of 0 ms or more"
    return None


def _resume(
    setup: wire.Setup, name: str, handles: Mapping[str, Resumable]
) -> Resumable | Refusal | None:
    """``setup.sessionResumption``: the session its handle continues (None: a new one)."""
    resumption = setup.session_resumption
    if resumption is None:
        return None
    if resumption.transparent is not None:
        # The Developer API has no transparent mode (Vertex AI's only; the SDK refuses it).
        return Refusal(
            1007,
            'Invalid JSON payload received. Unknown name "transparent" at '
            "'setup.session_resumption': Cannot find field.",
        )
    if not resumption.handle:
        return None
    saved = handles.get(resumption.handle)
    if saved is None or time.time() - saved.at > HANDLE_LIFETIME or saved.model != name:
        return Refusal(1008, "The session resumption handle is not valid or has expired.")
    return saved
