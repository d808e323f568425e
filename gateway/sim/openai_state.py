"""The OpenAI simulator's conversation state: items, responses, the session's audio.

Pure data and pure functions for ``gateway.sim.openai``: a conversation item
and a running response as the simulated server keeps them, how an item is
shown on the wire, how a ``session.update`` merges into the session, and the
``error`` a frame that is not a client event gets.
"""

from __future__ import annotations

import asyncio
import typing
from typing import Final

import msgspec

from gateway.upstream import openai_wire as wire

__all__ = [
    "CONTENT_TYPES",
    "DEFAULT_TURN_DETECTION",
    "INPUT_RATE",
    "Item",
    "RealtimeResponse",
    "bad_frame",
    "from_flat",
    "merge_audio",
    "session_refusal",
    "shape_refusal",
    "wire_item",
]

# The input audio rate of the API (PCM16 mono).
INPUT_RATE: Final = 24000
SPEED_MIN, SPEED_MAX = 0.25, 1.5  # audio.output.speed (the SDK's RealtimeAudioConfigOutput)
DEFAULT_TURN_DETECTION: Final = wire.TurnDetection(
    type="server_vad",
    threshold=0.5,
    prefix_padding_ms=300,
    silence_duration_ms=500,
    create_response=True,
    interrupt_response=True,
    idle_timeout_ms=None,
)
CONTENT_TYPES: Final[dict[str, frozenset[str]]] = {
    "user": frozenset({"input_text"}),
    "system": frozenset({"input_text"}),
    "assistant": frozenset({"output_text"}),
}


class Item:
    """A conversation item. ``kind`` is the item type; ``text`` a message's text,
    a call's arguments or a call output's output; ``part`` a message's content type."""

    __slots__ = ("call_id", "id", "kind", "name", "part", "role", "status", "text")

    def __init__(
        self,
        item_id: str,
        role: str,
        text: str,
        status: str,
        *,
        kind: str = "message",
        part: str = "",
        call_id: str = "",
        name: str = "",
    ) -> None:
        self.id = item_id
        self.role = role
        self.text = text
        self.status = status
        self.kind = kind
        self.part = part or ("output_text" if role == "assistant" else "input_text")
        self.call_id = call_id
        self.name = name


class RealtimeResponse:
    """A running response: a text or spoken message, or (``call``) a function call."""

    __slots__ = (
        "audio",
        "call",
        "deltas",
        "finishing",
        "id",
        "input_tokens",
        "item",
        "sent",
        "task",
        "text",
    )

    def __init__(
        self,
        response_id: str,
        item: Item,
        text: str,
        input_tokens: int,
        *,
        audio: bool = False,
        call: bool = False,
    ) -> None:
        self.id = response_id
        self.item = item
        self.text = text
        self.input_tokens = input_tokens
        self.audio = audio
        self.call = call
        self.sent = 0  # characters of ``text`` sent as deltas
        self.deltas = 0
        self.finishing = False
        self.task: asyncio.Task[None] | None = None


def wire_item(item: Item) -> wire.Item:
    if item.kind == "function_call":
        return wire.Item(
            type="function_call",
            id=item.id,
            object="realtime.item",
            status=item.status,
            call_id=item.call_id,
            name=item.name,
            arguments=item.text,
        )
    if item.kind == "function_call_output":
        return wire.Item(
            type="function_call_output",
            id=item.id,
            object="realtime.item",
            status=item.status,
            call_id=item.call_id,
            output=item.text,
        )
    if item.part in ("input_audio", "output_audio"):
        part = wire.ContentPart(type=item.part, transcript=item.text)
    else:
        part = wire.ContentPart(type=item.part, text=item.text)
    return wire.Item(
        type="message",
        id=item.id,
        object="realtime.item",
        status=item.status,
        role=item.role,
        content=[part],
    )


def merge_audio(current: wire.AudioConfig | None, update: wire.AudioConfig) -> wire.AudioConfig:
    """``session.audio`` after an update: fields the update sets replace the current ones."""
    current = current or wire.AudioConfig()
    inp, out = current.input or wire.AudioInput(), current.output or wire.AudioOutput()
    if update.input is not None:
        changes: dict[str, object] = {
            name: getattr(update.input, name)
            for name in ("format", "transcription")
            if getattr(update.input, name) is not None
        }
        if not isinstance(update.input.noise_reduction, msgspec.UnsetType):
            changes["noise_reduction"] = update.input.noise_reduction  # None: off
        if not isinstance(update.input.turn_detection, msgspec.UnsetType):
            detection = update.input.turn_detection
            if detection is not None:
                # Unset knobs take the API's defaults.
                detection = wire.TurnDetection(
                    **{
                        name: getattr(detection, name)
                        if getattr(detection, name) is not None
                        else getattr(DEFAULT_TURN_DETECTION, name)
                        for name in detection.__struct_fields__
                    }
                )
            changes["turn_detection"] = detection
        inp = msgspec.structs.replace(inp, **changes)
    if update.output is not None:
        out = msgspec.structs.replace(
            out,
            **{
                name: getattr(update.output, name)
                for name in ("format", "voice", "speed")
                if getattr(update.output, name) is not None
            },
        )
    return wire.AudioConfig(input=inp, output=out)


_EAGERNESS: Final = frozenset({"low", "medium", "high", "auto"})
_NOISE_REDUCTION: Final = frozenset({"near_field", "far_field"})
_TRUNCATION: Final = frozenset({"auto", "disabled"})
_EFFORTS: Final = frozenset({"minimal", "low", "medium", "high", "xhigh"})


def session_refusal(update: wire.Session) -> tuple[str, str] | None:
    """Why the API refuses this ``session.update`` (its message, the param), or None.

    The rules of the GA session (``openai`` SDK 3.60 types; docs/providers.md):
    text or audio output, not both; ``server_vad`` or ``semantic_vad``;
    ``eagerness`` for semantic VAD only and ``idle_timeout_ms`` for server VAD
    only; near- or far-field noise reduction; ``audio/pcm`` at 24 kHz only;
    truncation ``auto``/``disabled`` or a retention ratio in 0..1; a known
    reasoning effort. The error texts are ours: the API's exact words for
    these are not published.
    """
    modalities = update.output_modalities
    if modalities is not None and sorted(modalities) not in (["text"], ["audio"]):
        return (
            f"Invalid modalities: {modalities}. Supported combinations are: ['text'] and ['audio'].",
            "session.output_modalities",
        )
    audio_input = update.audio.input if update.audio is not None else None
    if audio_input is not None:
        fmt = audio_input.format
        if fmt is not None and fmt.type == "audio/pcm" and fmt.rate not in (None, INPUT_RATE):
            return (
                f"Invalid rate: {fmt.rate}. audio/pcm is 24000 Hz only.",
                "session.audio.input.format.rate",
            )
        detection = audio_input.turn_detection
        if isinstance(detection, wire.TurnDetection):
            where = "session.audio.input.turn_detection"
            if detection.type not in ("server_vad", "semantic_vad"):
                return (
                    f"Invalid value: {detection.type!r}. Supported values are: "
                    "'server_vad' and 'semantic_vad'.",
                    f"{where}.type",
                )
            if detection.type == "semantic_vad" and detection.idle_timeout_ms is not None:
                return (
                    "idle_timeout_ms is only supported for server_vad turn detection.",
                    f"{where}.idle_timeout_ms",
                )
            if detection.type == "server_vad" and detection.eagerness is not None:
                return (
                    "Unknown parameter: 'eagerness' (semantic_vad only).",
                    f"{where}.eagerness",
                )
            if detection.eagerness is not None and detection.eagerness not in _EAGERNESS:
                return (
                    f"Invalid value: {detection.eagerness!r}. Supported values are: "
                    "'low', 'medium', 'high' and 'auto'.",
                    f"{where}.eagerness",
                )
        reduction = audio_input.noise_reduction
        if isinstance(reduction, wire.NoiseReduction) and reduction.type not in _NOISE_REDUCTION:
            return (
                f"Invalid value: {reduction.type!r}. Supported values are: 'near_field' and "
                "'far_field'.",
                "session.audio.input.noise_reduction.type",
            )
    output = update.audio.output if update.audio is not None else None
    speed = output.speed if output is not None else None
    if speed is not None and not SPEED_MIN <= speed <= SPEED_MAX:
        bound, kind = (
            (SPEED_MAX, "above maximum") if speed > SPEED_MAX else (SPEED_MIN, "below minimum")
        )
        relation = "<=" if speed > SPEED_MAX else ">="
        return (
            f"Invalid 'session.audio.output.speed': decimal {kind} value. Expected a value "
            f"{relation} {bound}, but got {speed} instead.",
            "session.audio.output.speed",
        )
    truncation = update.truncation
    if isinstance(truncation, str) and truncation not in _TRUNCATION:
        return (
            f"Invalid value: {truncation!r}. Supported values are: 'auto' and 'disabled'.",
            "session.truncation",
        )
    if isinstance(truncation, wire.RetentionRatio) and not 0 <= truncation.retention_ratio <= 1:
        return (
            f"Invalid retention_ratio: {truncation.retention_ratio}. Use a number from 0 to 1.",
            "session.truncation.retention_ratio",
        )
    reasoning = update.reasoning
    if reasoning is not None and reasoning.effort is not None and reasoning.effort not in _EFFORTS:
        return (
            f"Invalid value: {reasoning.effort!r}. Supported values are: 'minimal', 'low', "
            "'medium', 'high' and 'xhigh'.",
            "session.reasoning.effort",
        )
    return None


def shape_refusal(update: wire.Session, flat: bool) -> tuple[str, str] | None:
    """A session in the other provider's shape: the message and the param, or None.

    ``flat``: the flavour takes xAI's flat session (whether xAI refuses GA fields
    is not published, so nothing is refused there).
    """
    if flat:
        return None
    if update.type != "realtime":
        return (
            f"Invalid value: {update.type!r}. The simulator supports 'realtime' sessions "
            "(session.type is required).",
            "session.type",
        )
    for name in ("voice", "turn_detection"):
        if getattr(update, name) not in (None, msgspec.UNSET):
            return (f"Unknown parameter: 'session.{name}'.", f"session.{name}")
    return None


def from_flat(update: wire.Session) -> wire.Session:
    """xAI's flat session as the GA shape the simulator keeps (voice and turn
    detection under ``audio``)."""
    audio = update.audio or wire.AudioConfig()
    if update.voice is not None:
        output = audio.output or wire.AudioOutput()
        audio = msgspec.structs.replace(
            audio, output=msgspec.structs.replace(output, voice=update.voice)
        )
    if not isinstance(update.turn_detection, msgspec.UnsetType):
        given = audio.input or wire.AudioInput()
        audio = msgspec.structs.replace(
            audio, input=msgspec.structs.replace(given, turn_detection=update.turn_detection)
        )
    return msgspec.structs.replace(
        update, type="realtime", voice=None, turn_detection=msgspec.UNSET, audio=audio
    )


class _Probe(msgspec.Struct):
    type: object = None
    event_id: object = None


_probe_decoder: Final = msgspec.json.Decoder(_Probe)
_CLIENT_TYPES: Final = frozenset(
    str(kind.__struct_config__.tag) for kind in typing.get_args(wire.ClientEvent)
)


def bad_frame(data: bytes, exc: Exception) -> wire.ErrorDetail:
    """The API's error for a frame that is not a client event (``exc``: the decoder's)."""
    try:
        probe = _probe_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return wire.ErrorDetail(
            type="invalid_request_error",
            message=f"The server could not parse the frame as a JSON object: {exc}",
            code="invalid_json",
        )
    event_id = probe.event_id if isinstance(probe.event_id, str) else None
    if probe.type not in _CLIENT_TYPES:
        return wire.ErrorDetail(
            type="invalid_request_error",
            message=f"Invalid value: {probe.type!r}. Supported values are: "
            + ", ".join(sorted(_CLIENT_TYPES))
            + ".",
            code="invalid_value",
            param="type",
            event_id=event_id,
        )
    return wire.ErrorDetail(
        type="invalid_request_error",
        message=f"Invalid {probe.type} event: {exc}",
        code="invalid_value",
        event_id=event_id,
    )
