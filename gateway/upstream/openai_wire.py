"""The OpenAI Realtime (GA) wire: every message we send or receive, as msgspec Structs.

One definition of the wire, used by both sides we own (the objects the events
carry — session, item, response, usage — are ``gateway.upstream.openai_objects``'s,
named here too, so a reader of the wire needs this module only): the adapter
(``gateway.upstream.openai``) encodes client events and decodes server events;
the simulator (``gateway.sim.openai``) decodes client events and encodes server
events. Field names and required fields follow the official SDK's models
(``openai.types.realtime``): the simulator's frames must parse there.

Encoding conventions:

- Client events and the objects nested in them (``Session``, ``Item``,
  ``ContentPart``, ``ResponseParams``) omit fields left at their default, so we
  never send ``null`` for a parameter the API may not accept.
- Server events carry every field, ``null`` included, as the API does.
- Fields the adapter reads but the API might omit have defaults, so a lean
  frame still decodes; fields the SDK requires of server events have none, so
  the simulator cannot forget them.

Decoding on the adapter's hot path: ``decode_upstream`` decodes with one
reused ``Decoder`` over the small ``UpstreamServerEvent`` union (the frames the
adapter acts on). A frame of any other type fails fast on its tag and is
reported as ``None`` (skip it), after a second, tiny decode confirms that its
type really is one the adapter ignores.
"""

from __future__ import annotations

import typing
from typing import Final

import msgspec

from gateway.upstream.openai_objects import (
    AudioConfig,
    AudioFormat,
    AudioInput,
    AudioOutput,
    CachedTokenDetails,
    ContentPart,
    ErrorDetail,
    FunctionTool,
    InputTokenDetails,
    Item,
    NoiseReduction,
    OutputTokenDetails,
    RateLimit,
    Reasoning,
    Response,
    ResponseParams,
    ResponseUsage,
    RetentionRatio,
    Session,
    StatusDetails,
    StatusError,
    Transcription,
    TurnDetection,
)

__all__ = [
    "UPSTREAM_EVENT_TYPES",
    "AudioConfig",
    "AudioFormat",
    "AudioInput",
    "AudioOutput",
    "CachedTokenDetails",
    "ClientEvent",
    "ContentPart",
    "ConversationItemAdded",
    "ConversationItemCreate",
    "ConversationItemCreated",
    "ConversationItemDelete",
    "ConversationItemDeleted",
    "ConversationItemDone",
    "ErrorDetail",
    "ErrorEvent",
    "FunctionTool",
    "InputAudioBufferAppend",
    "InputAudioBufferClear",
    "InputAudioBufferCleared",
    "InputAudioBufferCommit",
    "InputAudioBufferCommitted",
    "InputAudioBufferSpeechStarted",
    "InputAudioBufferSpeechStopped",
    "InputAudioTranscriptionCompleted",
    "InputTokenDetails",
    "Item",
    "NoiseReduction",
    "OutputTokenDetails",
    "RateLimit",
    "RateLimitsUpdated",
    "Reasoning",
    "Response",
    "ResponseCancel",
    "ResponseContentPartAdded",
    "ResponseContentPartDone",
    "ResponseCreate",
    "ResponseCreated",
    "ResponseDone",
    "ResponseFunctionCallArgumentsDelta",
    "ResponseFunctionCallArgumentsDone",
    "ResponseOutputAudioDelta",
    "ResponseOutputAudioDone",
    "ResponseOutputAudioTranscriptDelta",
    "ResponseOutputAudioTranscriptDone",
    "ResponseOutputItemAdded",
    "ResponseOutputItemDone",
    "ResponseOutputTextDelta",
    "ResponseOutputTextDone",
    "ResponseParams",
    "ResponseUsage",
    "RetentionRatio",
    "ServerEvent",
    "Session",
    "SessionCreated",
    "SessionUpdate",
    "SessionUpdated",
    "StatusDetails",
    "StatusError",
    "Transcription",
    "TranscriptionUsage",
    "TurnDetection",
    "UnknownEvent",
    "UpstreamServerEvent",
    "decode_client_event",
    "decode_server_event",
    "decode_upstream",
    "encode",
    "event_type",
]


# --- client events (we send them; the simulator decodes them) ----------------------


class _ClientEvent(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    event_id: str | None = None


class SessionUpdate(_ClientEvent, tag="session.update"):
    session: Session


class ConversationItemCreate(_ClientEvent, tag="conversation.item.create"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemTruncate(_ClientEvent, tag="conversation.item.truncate"):
    """Cut an assistant item's audio at ``audio_end_ms`` (what the user heard); the
    server drops the item's transcript. ``audio_end_ms`` past the audio is an error."""

    item_id: str
    audio_end_ms: int
    content_index: int = 0


class ConversationItemDelete(_ClientEvent, tag="conversation.item.delete"):
    item_id: str


class ResponseCreate(_ClientEvent, tag="response.create"):
    response: ResponseParams | None = None


class ResponseCancel(_ClientEvent, tag="response.cancel"):
    response_id: str | None = None


class InputAudioBufferAppend(_ClientEvent, tag="input_audio_buffer.append"):
    """``audio``: PCM16 at the session's input rate (24 kHz), base64 on the wire
    (msgspec encodes and decodes ``bytes`` as base64 in C)."""

    audio: bytes


class InputAudioBufferCommit(_ClientEvent, tag="input_audio_buffer.commit"):
    pass


class InputAudioBufferClear(_ClientEvent, tag="input_audio_buffer.clear"):
    pass


ClientEvent = (
    SessionUpdate
    | ConversationItemCreate
    | ConversationItemDelete
    | ConversationItemTruncate
    | ResponseCreate
    | ResponseCancel
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
)


# --- server events (the simulator sends them; the adapter decodes some) ------------


class _ServerEvent(msgspec.Struct, tag_field="type", kw_only=True):
    event_id: str


class SessionCreated(_ServerEvent, tag="session.created"):
    session: Session


class SessionUpdated(_ServerEvent, tag="session.updated"):
    session: Session


class ConversationItemCreated(_ServerEvent, tag="conversation.item.created"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemAdded(_ServerEvent, tag="conversation.item.added"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemDone(_ServerEvent, tag="conversation.item.done"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemDeleted(_ServerEvent, tag="conversation.item.deleted"):
    item_id: str


class ConversationItemTruncated(_ServerEvent, tag="conversation.item.truncated"):
    item_id: str
    content_index: int
    audio_end_ms: int


class InputAudioBufferTimeoutTriggered(_ServerEvent, tag="input_audio_buffer.timeout_triggered"):
    """Server VAD's ``idle_timeout_ms`` passed with no speech: the (empty) audio is
    committed as a user item and a response is made."""

    item_id: str
    audio_start_ms: int
    audio_end_ms: int


class ResponseCreated(_ServerEvent, tag="response.created"):
    response: Response


class ResponseOutputItemAdded(_ServerEvent, tag="response.output_item.added"):
    response_id: str
    output_index: int
    item: Item


class ResponseOutputItemDone(_ServerEvent, tag="response.output_item.done"):
    response_id: str
    output_index: int
    item: Item


class ResponseContentPartAdded(_ServerEvent, tag="response.content_part.added"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class ResponseContentPartDone(_ServerEvent, tag="response.content_part.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class ResponseOutputTextDelta(_ServerEvent, tag="response.output_text.delta"):
    """The hot path: one per chunk of model text. The adapter reads
    ``response_id`` and ``delta``; the rest has defaults for lean decoding."""

    response_id: str
    delta: str
    item_id: str = ""
    output_index: int = 0
    content_index: int = 0


class ResponseOutputTextDone(_ServerEvent, tag="response.output_text.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    text: str


class ResponseDone(_ServerEvent, tag="response.done"):
    response: Response


class InputAudioBufferSpeechStarted(_ServerEvent, tag="input_audio_buffer.speech_started"):
    """Server VAD heard speech begin ``audio_start_ms`` into the session's input audio."""

    audio_start_ms: int
    item_id: str


class InputAudioBufferSpeechStopped(_ServerEvent, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int
    item_id: str


class InputAudioBufferCommitted(_ServerEvent, tag="input_audio_buffer.committed"):
    item_id: str
    previous_item_id: str | None = None


class InputAudioBufferCleared(_ServerEvent, tag="input_audio_buffer.cleared"):
    pass


class TranscriptionUsage(msgspec.Struct):
    """The usage of an input transcription (``duration``: ``seconds`` of audio)."""

    type: str
    seconds: float


class InputAudioTranscriptionCompleted(
    _ServerEvent, tag="conversation.item.input_audio_transcription.completed"
):
    item_id: str
    content_index: int
    transcript: str
    usage: TranscriptionUsage | None = None


class ResponseOutputAudioDelta(_ServerEvent, tag="response.output_audio.delta"):
    """``delta``: PCM16 at 24 kHz (base64 on the wire)."""

    response_id: str
    delta: bytes
    item_id: str = ""
    output_index: int = 0
    content_index: int = 0


class ResponseOutputAudioDone(_ServerEvent, tag="response.output_audio.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


class ResponseOutputAudioTranscriptDelta(
    _ServerEvent, tag="response.output_audio_transcript.delta"
):
    response_id: str
    delta: str
    item_id: str = ""
    output_index: int = 0
    content_index: int = 0


class ResponseOutputAudioTranscriptDone(_ServerEvent, tag="response.output_audio_transcript.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    transcript: str


class ResponseFunctionCallArgumentsDelta(
    _ServerEvent, tag="response.function_call_arguments.delta"
):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ResponseFunctionCallArgumentsDone(_ServerEvent, tag="response.function_call_arguments.done"):
    """The whole call: the adapter reads ``call_id``, ``name`` and ``arguments``."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class ErrorEvent(_ServerEvent, tag="error"):
    error: ErrorDetail


class RateLimitsUpdated(_ServerEvent, tag="rate_limits.updated"):
    rate_limits: list[RateLimit]


ServerEvent = (
    SessionCreated
    | SessionUpdated
    | ConversationItemCreated
    | ConversationItemAdded
    | ConversationItemDone
    | ConversationItemDeleted
    | ConversationItemTruncated
    | InputAudioBufferTimeoutTriggered
    | ResponseCreated
    | ResponseOutputItemAdded
    | ResponseOutputItemDone
    | ResponseContentPartAdded
    | ResponseContentPartDone
    | ResponseOutputTextDelta
    | ResponseOutputTextDone
    | ResponseDone
    | ErrorEvent
    | RateLimitsUpdated
    | InputAudioBufferSpeechStarted
    | InputAudioBufferSpeechStopped
    | InputAudioBufferCommitted
    | InputAudioBufferCleared
    | InputAudioTranscriptionCompleted
    | ResponseOutputAudioDelta
    | ResponseOutputAudioDone
    | ResponseOutputAudioTranscriptDelta
    | ResponseOutputAudioTranscriptDone
    | ResponseFunctionCallArgumentsDelta
    | ResponseFunctionCallArgumentsDone
)

# The server events the adapter acts on; every other type is skipped. The
# voice events are in the same union: a tagged union costs one lookup
# whatever its size, so the text deltas pay nothing for them.
UpstreamServerEvent = (
    ResponseOutputTextDelta
    | ResponseCreated
    | ResponseOutputItemAdded
    | ResponseDone
    | ErrorEvent
    | SessionCreated
    | ResponseOutputAudioDelta
    | ResponseOutputAudioTranscriptDelta
    | InputAudioBufferSpeechStarted
    | InputAudioBufferSpeechStopped
    | InputAudioTranscriptionCompleted
    | ResponseFunctionCallArgumentsDone
    | InputAudioBufferTimeoutTriggered
)

UPSTREAM_EVENT_TYPES: Final[frozenset[str]] = frozenset(
    str(kind.__struct_config__.tag) for kind in typing.get_args(UpstreamServerEvent)
)
"""The ``type`` of every event the adapter decodes (derived from the union)."""


class UnknownEvent(msgspec.Struct):
    """Just the ``type`` of a frame: used to tell "a type we skip" from "a broken frame"."""

    type: str = ""


# --- codecs (module-level, reused) ---------------------------------------------------

_encoder: Final = msgspec.json.Encoder()
_upstream_decoder: Final = msgspec.json.Decoder(UpstreamServerEvent)
_TYPE_FIRST: Final = b'{"type":"'
_UPSTREAM_TYPE_BYTES: Final = frozenset(kind.encode() for kind in UPSTREAM_EVENT_TYPES)
_server_decoder: Final = msgspec.json.Decoder(ServerEvent)
_client_decoder: Final = msgspec.json.Decoder(ClientEvent)
_type_decoder: Final = msgspec.json.Decoder(UnknownEvent)


def encode(event: ClientEvent | ServerEvent) -> bytes:
    """One JSON text frame's bytes (send it with ``text=True``)."""
    return _encoder.encode(event)


def decode_upstream(data: bytes | str) -> UpstreamServerEvent | None:
    """Decode a server frame for the adapter; ``None`` for a type the adapter skips.

    Raises ``msgspec.DecodeError``/``ValidationError`` when the frame is not JSON,
    has no string ``type``, or is a type the adapter needs but is malformed.
    """
    if type(data) is bytes and data.startswith(_TYPE_FIRST):
        # The type comes first (OpenAI's frames and msgspec's tagged encoding
        # alike): a frame the adapter skips is skipped unparsed. Decoding it
        # against the union failed with a ValidationError, whose message is
        # built on every raise: a measured 2% of the node's CPU at 50
        # streaming sessions, for the ~10 skipped frames of every response.
        end = data.find(b'"', 9)
        if end > 0 and data[9:end] not in _UPSTREAM_TYPE_BYTES and b"\\" not in data[9:end]:
            return None
    try:
        return _upstream_decoder.decode(data)
    except msgspec.ValidationError:
        kind = _type_decoder.decode(data).type
        if kind and kind not in UPSTREAM_EVENT_TYPES:
            return None
        raise


def decode_server_event(data: bytes | str) -> ServerEvent:
    """Decode any server event we model (tests, tools). Raises on anything else."""
    return _server_decoder.decode(data)


def decode_client_event(data: bytes | str) -> ClientEvent:
    """Decode a client event (the simulator). Raises on bad or unknown frames."""
    return _client_decoder.decode(data)


def event_type(data: bytes | str) -> str:
    """The ``type`` of a JSON frame, or ``""``; raises ``msgspec.DecodeError`` on bad JSON."""
    try:
        return _type_decoder.decode(data).type
    except msgspec.ValidationError:
        return ""
