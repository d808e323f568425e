"""OpenAI Realtime (GA) events as msgspec Structs: the OpenAI door's vocabulary.

The contract is the ``openai`` SDK's ``openai/types/realtime`` (docs/openai-door.md
lists the facts relied on, with their sources). Client events the door takes
are decoded in one call (``decode_client``) into a tagged union; fields the
door does not support are kept so they can be refused by name, never
silently dropped. Server events are built from plain Structs whose shapes
validate against the SDK's ``RealtimeServerEvent`` union (tests/openai_door).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import msgspec

from protocol.json_outline import too_many_values

__all__ = [
    "ClientEvent",
    "ConversationItemCreate",
    "FunctionTool",
    "Item",
    "ResponseCreate",
    "ServerEvent",
    "SessionBody",
    "SessionUpdate",
    "decode_client",
    "decode_large_append",
    "encode",
    "encode_frame",
    "parameter_refusal",
    "unread",
]

ShortId = Annotated[str, msgspec.Meta(max_length=256)]
_FEW = msgspec.Meta(max_length=256)


# --- client → server -------------------------------------------------------------


class FunctionTool(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    type: Literal["function"] = "function"
    description: str = ""
    parameters: dict[str, Any] | None = None


class TurnDetection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    idle_timeout_ms: int | None = None
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None


class AudioFormat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: int | None = None


class Transcription(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The SDK's ``AudioTranscriptionParam``: checked, not applied (the gateway sends the
    provider's own transcript whatever model it names). Taken as any object, it let a
    field OpenAI does not define, or a 100,000-character ``model``, through silently."""

    model: ShortId | None = None
    language: Annotated[str, msgspec.Meta(max_length=32)] | None = None
    languages: Annotated[list[Annotated[str, msgspec.Meta(max_length=32)]], _FEW] | None = None
    prompt: Annotated[str, msgspec.Meta(max_length=32_768)] | None = None
    keywords: Annotated[list[ShortId], _FEW] | None = None
    delay: Literal["minimal", "low", "medium", "high", "xhigh"] | None = None


class NoiseReduction(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["near_field", "far_field"] | None = None
    strength: float | None = None


class AudioInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: AudioFormat | None = None
    turn_detection: TurnDetection | msgspec.UnsetType | None = msgspec.UNSET
    transcription: Transcription | None = None
    noise_reduction: NoiseReduction | None = None


class AudioOutput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: AudioFormat | None = None
    voice: str | None = None
    speed: float | None = None


class AudioConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class SessionBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``session.update``'s ``session`` (and ``client_secrets``' ``session``)."""

    type: Literal["realtime", "transcription"]  # required, as the SDK's types and OpenAI have it
    model: str | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None  # function tools: ``FunctionTool``
    tool_choice: Any = None
    output_modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioConfig | None = None
    # Accepted at their default only (the door refuses another value by name).
    max_output_tokens: int | Literal["inf"] | None = None
    tracing: Any = None
    truncation: Any = None
    include: list[str] | None = None
    prompt: Any = None
    parallel_tool_calls: bool | None = None
    reasoning: Any = None


class ContentPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: str
    text: str | None = None
    transcript: str | None = None
    audio: str | None = None
    image_url: str | None = None  # input_image's (refused by its type)
    detail: str | None = None


class Item(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A conversation item a client creates: a message or a function call's output."""

    type: Literal["message", "function_call_output", "function_call"]
    id: ShortId | None = None
    role: Literal["user", "system", "assistant"] | None = None
    content: list[ContentPart] | None = None
    call_id: ShortId | None = None
    output: str | None = None
    name: str | None = None
    arguments: str | None = None
    object: str | None = None
    status: str | None = None


class _Client(
    msgspec.Struct, tag_field="type", frozen=True, forbid_unknown_fields=True, kw_only=True
):
    event_id: ShortId | None = None


class SessionUpdate(_Client, frozen=True, tag="session.update"):
    session: SessionBody


class ConversationItemCreate(_Client, frozen=True, tag="conversation.item.create"):
    item: Item
    previous_item_id: ShortId | None = None


class ConversationItemRetrieve(_Client, frozen=True, tag="conversation.item.retrieve"):
    item_id: ShortId


class ConversationItemDelete(_Client, frozen=True, tag="conversation.item.delete"):
    item_id: ShortId


class ConversationItemTruncate(_Client, frozen=True, tag="conversation.item.truncate"):
    item_id: ShortId
    content_index: Annotated[int, msgspec.Meta(ge=0)]
    audio_end_ms: Annotated[int, msgspec.Meta(ge=0)]


class ResponseBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``response.create``'s ``response``: the SDK's ``RealtimeResponseCreateParams``
    (what the door does with each: ``protocol.openai_response``)."""

    audio: Any = None
    conversation: Any = None
    input: Any = None
    instructions: Any = None
    max_output_tokens: Any = None
    metadata: Any = None
    output_modalities: Any = None
    parallel_tool_calls: Any = None
    prompt: Any = None
    reasoning: Any = None
    tool_choice: Any = None
    tools: Any = None

    def given(self) -> dict[str, Any]:
        """The fields set (not null), by name."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


class ResponseCreate(_Client, frozen=True, tag="response.create"):
    response: ResponseBody | None = None


class ResponseCancel(_Client, frozen=True, tag="response.cancel"):
    response_id: ShortId | None = None


class InputAudioBufferAppend(_Client, frozen=True, tag="input_audio_buffer.append"):
    audio: str


class InputAudioBufferCommit(_Client, frozen=True, tag="input_audio_buffer.commit"):
    pass


class InputAudioBufferClear(_Client, frozen=True, tag="input_audio_buffer.clear"):
    pass


class OutputAudioBufferClear(_Client, frozen=True, tag="output_audio_buffer.clear"):
    pass


ClientEvent = (
    SessionUpdate
    | ConversationItemCreate
    | ConversationItemRetrieve
    | ConversationItemDelete
    | ConversationItemTruncate
    | ResponseCreate
    | ResponseCancel
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | OutputAudioBufferClear
)

_decoder: Final = msgspec.json.Decoder(ClientEvent)
_peek: Final = msgspec.json.Decoder(dict[str, Any])


class BadEvent(msgspec.Struct, frozen=True):
    """A client event the door could not read: what to tell the client."""

    message: str
    event_id: str | None = None
    param: str | None = None
    code: str = "invalid_request_error"


_AUDIO_KEY: Final = b'"audio"'
_AFTER_KEY: Final = re.compile(rb'[ \t\r\n]*:[ \t\r\n]*"')


def decode_large_append(frame: bytes) -> tuple[InputAudioBufferAppend, memoryview] | None:
    """A large ``input_audio_buffer.append`` read without decoding its audio as JSON:
    the event (its ``audio`` empty) and its base64, or None (then ``decode_client``).

    The audio string is found with two byte searches (its closing quote; no backslash
    in it), the event around it decoded as any other, and taken only when that is an
    append whose audio is the one found. msgspec scanning 20 MiB of base64 held the
    loop ~11 ms; the searches take ~1. Anything unusual (the key twice, an escape in
    the audio) is left to ``decode_client``."""
    key = frame.find(_AUDIO_KEY)
    if key < 0:
        return None
    colon = _AFTER_KEY.match(frame, key + len(_AUDIO_KEY), key + 40)  # ':"', '": "' …
    if colon is None:
        return None
    start = colon.end()
    end = frame.find(b'"', start)
    if end < 0 or frame.find(b"\\", start, end) >= 0:
        return None
    envelope = frame[:start] + frame[end:]
    if envelope.count(_AUDIO_KEY) != 1:
        return None
    event = decode_client(envelope)
    if type(event) is not InputAudioBufferAppend or event.audio:
        return None
    return event, memoryview(frame)[start:end]


_EVENT_ID: Final = re.compile(rb'"event_id"[ \t\r\n]*:[ \t\r\n]*"([^"\\]{1,256})"')


def unread(frame: bytes, limit: int) -> BadEvent | None:
    """The refusal of a frame over ``limit`` bytes that is no plain large append (those
    ``decode_large_append`` takes), before it is decoded: decoding 20 MiB of any other
    event held the loop ~100 ms, and no other event needs that much (instructions,
    tools and held text are bounded far below). None: ``frame`` is within ``limit``.
    Its ``event_id`` is named when it is among the first KiB."""
    if len(frame) <= limit:
        return None
    found = _EVENT_ID.search(frame, 0, 1024)
    return BadEvent(
        f"this event is {len(frame)} bytes; an event other than input_audio_buffer.append "
        f"is at most {limit} on this gateway, and an append that large must carry its "
        "audio as plain base64 (no escapes): send it smaller, or in several appends",
        found.group(1).decode() if found else None,
    )


def decode_client(data: bytes | str) -> ClientEvent | BadEvent:
    """One client event, or what was wrong with it (never raises)."""
    if (crowded := too_many_values(data, "event_id")) is not None:
        return BadEvent(*crowded)
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        event_id: str | None = None
        kind = ""
        try:
            raw = _peek.decode(data)
            event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
            kind = str(raw.get("type", ""))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return BadEvent(f"the event is not a JSON object: {_why(exc, data)}")
        except RecursionError:  # a wrong field first, then nesting past the limit
            return BadEvent(_TOO_DEEP)
        if "type" not in raw:
            return parameter_refusal("type", event_id, missing=True)
        known = kind in _CLIENT_TYPES
        if not known:
            return BadEvent(
                f"event type {kind[:80]!r} is not supported by this gateway's OpenAI door; it "
                f"takes {', '.join(sorted(_CLIENT_TYPES))}",
                event_id,
                "type",
            )
        field = _FIELD.match(str(exc))
        if field is not None:  # as OpenAI's service answers a field it lacks or needs
            where = field[3].lstrip(".") if field[3] else ""
            param = f"{where}.{field[2]}" if where else field[2]
            return parameter_refusal(param, event_id, missing=field[1] == "missing required")
        at = _AT.search(str(exc))  # a value out of its bounds: named, as OpenAI names it
        return BadEvent(f"invalid {kind} event: {exc}", event_id, at[1] if at else None)
    except RecursionError:
        return BadEvent(_TOO_DEEP)


def _why(exc: Exception, data: bytes | str) -> str:
    """msgspec's reason, said plainly where it misleads: a lone surrogate escape
    (``\\ud800``) in a whole event is reported as "Input data was truncated"."""
    tail = data[-64:].encode() if isinstance(data, str) else bytes(data[-64:])
    whole = tail.rstrip().endswith(b"}")
    if "truncated" in str(exc) and whole:
        return (
            "it is cut short, or holds a \\uD800-\\uDFFF escape without its pair (JSON text "
            "carries each character outside the BMP as two such escapes): send UTF-8 text"
        )
    return str(exc)


_TOO_DEEP: Final = "the event nests too deeply to read"
# msgspec's words for a field an event lacks or has too many, with where it is.
_AT: Final = re.compile(r" - at `\$\.([^`]{1,256})`$")
_FIELD: Final = re.compile(
    r"Object (missing required|contains unknown) field `([^`]{0,128})`"
    r"(?: - at `\$([^`]{0,256})`)?$"
)


def parameter_refusal(param: str, event_id: str | None, *, missing: bool) -> BadEvent:
    """OpenAI's refusal of a parameter an event lacks (``missing``) or that it does not
    define, naming its path (the service's answers: docs/openai-door.md)."""
    if missing:
        message, code = f"Missing required parameter: {param!r}.", "missing_required_parameter"
    else:
        message, code = f"Unknown parameter: {param!r}.", "unknown_parameter"
    return BadEvent(message, event_id, param, code)


_CLIENT_TYPES: Final = frozenset(
    str(kind.__struct_config__.tag)
    for kind in (
        SessionUpdate,
        ConversationItemCreate,
        ConversationItemRetrieve,
        ConversationItemDelete,
        ConversationItemTruncate,
        ResponseCreate,
        ResponseCancel,
        InputAudioBufferAppend,
        InputAudioBufferCommit,
        InputAudioBufferClear,
        OutputAudioBufferClear,
    )
)

# --- server → client -------------------------------------------------------------

ServerEvent = dict[str, Any]
"""A server event, as sent (its shapes are checked against the SDK's in the tests)."""

_encoder: Final = msgspec.json.Encoder()


def encode_frame(event: dict[str, Any]) -> bytes:
    """A server event as the text frame's bytes (``None`` fields are left out)."""
    if None in event.values():
        event = {k: v for k, v in event.items() if v is not None}
    return _encoder.encode(event)


def encode(event: dict[str, Any]) -> str:
    """A server event as the text frame sent (``None`` fields are left out)."""
    return encode_frame(event).decode()
