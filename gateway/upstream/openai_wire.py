"""The OpenAI Realtime (GA) wire: every message we send or receive, as msgspec Structs.

One definition of the wire, used by both sides we own: the adapter
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

from typing import Final

import msgspec

__all__ = [
    "UPSTREAM_EVENT_TYPES",
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
    "InputTokenDetails",
    "Item",
    "OutputTokenDetails",
    "RateLimit",
    "RateLimitsUpdated",
    "Response",
    "ResponseCancel",
    "ResponseContentPartAdded",
    "ResponseContentPartDone",
    "ResponseCreate",
    "ResponseCreated",
    "ResponseDone",
    "ResponseOutputItemAdded",
    "ResponseOutputItemDone",
    "ResponseOutputTextDelta",
    "ResponseOutputTextDone",
    "ResponseParams",
    "ResponseUsage",
    "ServerEvent",
    "Session",
    "SessionCreated",
    "SessionUpdate",
    "SessionUpdated",
    "StatusDetails",
    "StatusError",
    "UnknownEvent",
    "UpstreamServerEvent",
    "decode_client_event",
    "decode_server_event",
    "decode_upstream",
    "encode",
    "event_type",
]


# --- objects nested in events ----------------------------------------------------


class ContentPart(msgspec.Struct, omit_defaults=True):
    """One content part of a message item (``input_text``/``output_text``), or the
    ``part`` of ``response.content_part.*`` (type ``text``)."""

    type: str
    text: str | None = None
    transcript: str | None = None


class Item(msgspec.Struct, omit_defaults=True):
    """A conversation item. We only create ``message`` items (give them a
    ``content`` list, even an empty one: the API requires it); items of other
    types (function calls, MCP) decode with ``role`` and ``content`` unset."""

    type: str
    id: str | None = None
    object: str | None = None
    status: str | None = None
    role: str | None = None
    content: list[ContentPart] | None = None


class Session(msgspec.Struct, omit_defaults=True):
    """The session configuration: sent in ``session.update``, echoed in
    ``session.created``/``session.updated`` (which also carry ``id``/``object``)."""

    type: str
    id: str | None = None
    object: str | None = None
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[str] | None = None
    max_output_tokens: int | str | None = None
    expires_at: int | None = None


class ResponseParams(msgspec.Struct, omit_defaults=True):
    """Per-response overrides of ``response.create`` (the simulator ignores them)."""

    instructions: str | None = None
    output_modalities: list[str] | None = None
    conversation: str | None = None
    metadata: dict[str, str] | None = None


class InputTokenDetails(msgspec.Struct):
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0
    cached_tokens: int = 0


class OutputTokenDetails(msgspec.Struct):
    text_tokens: int = 0
    audio_tokens: int = 0


class ResponseUsage(msgspec.Struct):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: InputTokenDetails | None = None
    output_token_details: OutputTokenDetails | None = None


class StatusError(msgspec.Struct):
    type: str | None = None
    code: str | None = None
    message: str | None = None


class StatusDetails(msgspec.Struct):
    """Why a response did not complete (``reason``) or how it failed (``error``)."""

    type: str | None = None
    reason: str | None = None
    error: StatusError | None = None


class Response(msgspec.Struct):
    """The response resource of ``response.created``/``response.done``."""

    id: str
    status: str
    object: str = "realtime.response"
    status_details: StatusDetails | None = None
    output: list[Item] = []
    conversation_id: str | None = None
    output_modalities: list[str] | None = None
    max_output_tokens: int | str | None = None
    usage: ResponseUsage | None = None
    metadata: dict[str, str] | None = None


class ErrorDetail(msgspec.Struct):
    """The ``error`` object of an ``error`` event; ``event_id`` names the client
    event that caused it, when there is one."""

    type: str
    message: str
    code: str | None = None
    param: str | None = None
    event_id: str | None = None


class RateLimit(msgspec.Struct):
    name: str
    limit: int
    remaining: int
    reset_seconds: float


# --- client events (we send them; the simulator decodes them) ----------------------


class _ClientEvent(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    event_id: str | None = None


class SessionUpdate(_ClientEvent, tag="session.update"):
    session: Session


class ConversationItemCreate(_ClientEvent, tag="conversation.item.create"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemDelete(_ClientEvent, tag="conversation.item.delete"):
    item_id: str


class ResponseCreate(_ClientEvent, tag="response.create"):
    response: ResponseParams | None = None


class ResponseCancel(_ClientEvent, tag="response.cancel"):
    response_id: str | None = None


ClientEvent = (
    SessionUpdate
    | ConversationItemCreate
    | ConversationItemDelete
    | ResponseCreate
    | ResponseCancel
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
)

# The server events the adapter acts on; every other type is skipped.
UpstreamServerEvent = (
    ResponseOutputTextDelta
    | ResponseCreated
    | ResponseOutputItemAdded
    | ResponseDone
    | ErrorEvent
    | SessionCreated
)

UPSTREAM_EVENT_TYPES: Final[frozenset[str]] = frozenset(
    {
        "response.output_text.delta",
        "response.created",
        "response.output_item.added",
        "response.done",
        "error",
        "session.created",
    }
)


class UnknownEvent(msgspec.Struct):
    """Just the ``type`` of a frame: used to tell "a type we skip" from "a broken frame"."""

    type: str = ""


# --- codecs (module-level, reused) ---------------------------------------------------

_encoder: Final = msgspec.json.Encoder()
_upstream_decoder: Final = msgspec.json.Decoder(UpstreamServerEvent)
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
