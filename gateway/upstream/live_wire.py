"""The GPT-Live wire (``/v1/live/sessions``): the events we send and read, as msgspec Structs.

GPT-Live is OpenAI's voice protocol of its own (docs/providers.md, "GPT-Live"):
it shares no event with the Realtime wire (``openai_wire``). One definition,
used by both sides we own: the adapter (``gateway.upstream.live``) encodes
client events and decodes server events; the simulator (``gateway.sim.live``)
decodes client events strictly and encodes server events. Field names and
required fields follow the official SDK's models (``openai.types.live``):
``tests/conformance/test_live_frames.py`` validates our frames there.

Conventions:

- Client events omit fields left at their default (``omit_defaults``), so we
  never send ``null`` where the API may refuse it — except ``delegation_id``
  of the ``*.append`` commands, which the API requires present and nullable
  (``null``: general context), so it has no default and is always sent.
- Client-side Structs forbid unknown fields: the session object is strict on
  the service ("a strict configuration object that rejects unknown fields"),
  and the simulator refuses what the service refuses by decoding with them.
- Server events: fields the adapter reads but the service might omit have
  defaults; types the adapter does not act on decode as ``None`` (skipped).
"""

from __future__ import annotations

import typing
from typing import Any, Final, Literal

import msgspec

__all__ = [
    "ADAPTER_EVENT_TYPES",
    "AudioFormat",
    "ClientEvent",
    "CommentaryAppend",
    "Delegation",
    "DelegationCreated",
    "DelegationRef",
    "ErrorDetail",
    "ErrorEvent",
    "InitialItem",
    "InputAudioAppend",
    "InputTranscriptDelta",
    "InstructionsAppend",
    "OutputAudioDelta",
    "OutputTranscriptDelta",
    "ResponseCreate",
    "ResponseEvent",
    "ResponseItemCreate",
    "ServerEvent",
    "SessionAudio",
    "SessionClose",
    "SessionClosed",
    "SessionConfig",
    "SessionResource",
    "SessionStart",
    "SessionStarted",
    "SessionUsage",
    "SessionUsageUpdated",
    "TextPart",
    "ThinkingAppend",
    "Voice",
    "decode_client_event",
    "decode_server_event",
    "decode_upstream",
    "encode",
]

PATH: Final = "/live/sessions"
"""Where the service listens, under the API's base (``/v1``, Azure's ``/openai/v1``)."""

CLOSE_REASONS: Final = ("close_requested", "expired", "content", "remote_hangup", "connection_lost")
"""``session.closed.reason`` as the SDK lists them."""


class _Client(
    msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True, frozen=True
):
    """A client-side object: defaults omitted, unknown fields refused."""


# --- the session object ---------------------------------------------------------------


class AudioFormat(_Client, frozen=True):
    """``audio/pcm`` at 16000 or 24000 Hz; ``audio/pcmu``/``audio/pcma`` at 8000 Hz."""

    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
    rate: int


class Voice(_Client, frozen=True):
    voice: str | None = None


class SessionAudio(_Client, frozen=True):
    """Startup audio: the format (primary WebSocket only) and the voice; both immutable."""

    format: AudioFormat | None = None
    output: Voice | None = None


class Delegation(_Client, frozen=True):
    """Who handles delegated work: ``client`` (the application) or ``responses``
    (a Responses model the session runs; ``responses`` holds its settings)."""

    type: Literal["client", "responses"]
    responses: dict[str, Any] | None = None
    acknowledgement_delay_ms: int | None = None


class TextPart(_Client, frozen=True):
    type: Literal["input_text", "output_text"]
    text: str


class InitialItem(_Client, frozen=True):
    """One message of the startup history: one text part (developer, user or assistant)."""

    role: Literal["developer", "user", "assistant"]
    content: list[TextPart]
    type: Literal["message"] = "message"


class SessionConfig(_Client, frozen=True):
    """``session.start``'s session (the SDK's ``SessionConfig``)."""

    model: str
    instructions: str | None = None
    audio: SessionAudio | None = None
    delegation: Delegation | None = None
    input: list[InitialItem] | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    triggers: list[dict[str, Any]] | None = None
    client: dict[str, Any] | None = None


# --- client events --------------------------------------------------------------------


class SessionStart(_Client, frozen=True, tag="session.start", tag_field="type"):
    session: SessionConfig
    event_id: str | None = None


class InputAudioAppend(_Client, frozen=True, tag="session.input_audio.append", tag_field="type"):
    """Audio in the startup format, base64 (msgspec encodes ``bytes`` so)."""

    audio: bytes
    event_id: str | None = None


class InstructionsAppend(_Client, frozen=True, tag="session.instructions.append", tag_field="type"):
    content: str
    delegation_id: str | None  # required, nullable: always sent
    event_id: str | None = None


class ThinkingAppend(_Client, frozen=True, tag="session.thinking.append", tag_field="type"):
    content: str
    delegation_id: str | None
    event_id: str | None = None


class CommentaryAppend(_Client, frozen=True, tag="session.commentary.append", tag_field="type"):
    content: str
    delegation_id: str | None
    event_id: str | None = None


class ResponseItemCreate(_Client, frozen=True, tag="response.item.create", tag_field="type"):
    """An input item for the Responses backend (Responses delegation only)."""

    item: dict[str, Any]
    event_id: str | None = None


class ResponseCreate(_Client, frozen=True, tag="response.create", tag_field="type"):
    event_id: str | None = None


class InputAudioMute(_Client, frozen=True, tag="session.input_audio.mute", tag_field="type"):
    event_id: str | None = None


class InputAudioUnmute(_Client, frozen=True, tag="session.input_audio.unmute", tag_field="type"):
    event_id: str | None = None


class SessionUpdate(_Client, frozen=True, tag="session.update", tag_field="type"):
    session: dict[str, Any]
    event_id: str | None = None


class SessionClose(_Client, frozen=True, tag="session.close", tag_field="type"):
    event_id: str | None = None


ClientEvent = (
    SessionStart
    | InputAudioAppend
    | InstructionsAppend
    | ThinkingAppend
    | CommentaryAppend
    | ResponseItemCreate
    | ResponseCreate
    | InputAudioMute
    | InputAudioUnmute
    | SessionUpdate
    | SessionClose
)

# --- server events --------------------------------------------------------------------


class _Server(msgspec.Struct, kw_only=True, frozen=True):
    """A server event: every field sent (the simulator's frames carry them all)."""


class SessionResource(_Server, frozen=True):
    """The resolved session (``session.started``, ``.updated``, ``.closed``)."""

    id: str
    expires_at: int
    model: str
    status: Literal["active"] = "active"
    instructions: str | None = None
    audio: dict[str, Any] | None = None
    delegation: dict[str, Any] | None = None
    input: list[dict[str, Any]] | None = None
    store: bool | None = None


class SessionStarted(_Server, frozen=True, tag="session.started", tag_field="type"):
    event_id: str
    session: SessionResource
    client_event_id: str | None = None


class OutputAudioDelta(_Server, frozen=True, tag="session.output_audio.delta", tag_field="type"):
    delta: bytes  # base64 on the wire, in the session's format


class InputTranscriptDelta(
    _Server, frozen=True, tag="session.input_transcript.delta", tag_field="type"
):
    event_id: str
    delta: str
    start_ms: int
    end_ms: int


class OutputTranscriptDelta(
    _Server, frozen=True, tag="session.output_transcript.delta", tag_field="type"
):
    event_id: str
    delta: str
    start_ms: int
    end_ms: int


class DelegationRef(_Server, frozen=True):
    """The delegated work's identity and target: metadata, never the task's text."""

    id: str
    target: Literal["client", "responses", "decisions"]
    type: Literal["delegation"] = "delegation"
    response_id: str | None = None


class DelegationCreated(_Server, frozen=True, tag="session.delegation.created", tag_field="type"):
    event_id: str
    delegation: DelegationRef
    offset_ms: int


class ResponseEvent(_Server, frozen=True, tag="response.event", tag_field="type"):
    """A Responses stream event of a Responses delegation (``event``: as the backend sent it)."""

    event_id: str
    event: dict[str, Any]
    delegation_id: str | None = None


class SessionUsage(_Server, frozen=True):
    """Cumulative billable seconds (never to be summed across events)."""

    seconds: float
    active_seconds: int | None = None
    paused_seconds: int | None = None


class SessionUsageUpdated(_Server, frozen=True, tag="session.usage.updated", tag_field="type"):
    event_id: str
    usage: SessionUsage


class SessionClosed(_Server, frozen=True, tag="session.closed", tag_field="type"):
    event_id: str
    reason: str
    session: SessionResource
    usage: SessionUsage


class ErrorDetail(_Server, frozen=True):
    code: str
    message: str
    type: str
    param: str | None = None
    client_event_id: str | None = None


class ErrorEvent(_Server, frozen=True, tag="error", tag_field="type"):
    event_id: str
    error: ErrorDetail
    client_event_id: str | None = None


class Acknowledged(_Server, frozen=True):
    """The acknowledgements of the ``*.append`` commands (``session.*.appended``)."""

    event_id: str
    start_ms: int
    end_ms: int
    client_event_id: str | None = None


class CommentaryAppended(
    Acknowledged, frozen=True, tag="session.commentary.appended", tag_field="type"
):
    pass


class ThinkingAppended(
    Acknowledged, frozen=True, tag="session.thinking.appended", tag_field="type"
):
    pass


class InstructionsAppended(
    Acknowledged, frozen=True, tag="session.instructions.appended", tag_field="type"
):
    pass


class SessionUpdated(_Server, frozen=True, tag="session.updated", tag_field="type"):
    event_id: str
    session: SessionResource
    client_event_id: str | None = None


class InputAudioMuted(_Server, frozen=True, tag="session.input_audio.muted", tag_field="type"):
    event_id: str
    client_event_id: str | None = None


class InputAudioUnmuted(_Server, frozen=True, tag="session.input_audio.unmuted", tag_field="type"):
    event_id: str
    client_event_id: str | None = None


AdapterEvent = (
    SessionStarted
    | OutputAudioDelta
    | InputTranscriptDelta
    | OutputTranscriptDelta
    | DelegationCreated
    | ResponseEvent
    | SessionUsageUpdated
    | SessionClosed
    | ErrorEvent
)
"""The server events the adapter acts on; any other type is skipped."""

ServerEvent = (
    AdapterEvent
    | CommentaryAppended
    | ThinkingAppended
    | InstructionsAppended
    | SessionUpdated
    | InputAudioMuted
    | InputAudioUnmuted
)

ADAPTER_EVENT_TYPES: Final[frozenset[str]] = frozenset(
    str(kind.__struct_config__.tag) for kind in typing.get_args(AdapterEvent)
)


class _Type(msgspec.Struct):
    type: str = ""


_encoder: Final = msgspec.json.Encoder()
_adapter_decoder: Final = msgspec.json.Decoder(AdapterEvent)
_server_decoder: Final = msgspec.json.Decoder(ServerEvent)
_client_decoder: Final = msgspec.json.Decoder(ClientEvent)
_type_decoder: Final = msgspec.json.Decoder(_Type)


def encode(event: ClientEvent | ServerEvent) -> bytes:
    """One JSON text frame's bytes."""
    return _encoder.encode(event)


def event_type(data: bytes | str) -> str:
    """The ``type`` of a JSON frame, or ``""``; raises ``msgspec.DecodeError`` on bad JSON."""
    try:
        return _type_decoder.decode(data).type
    except msgspec.ValidationError:
        return ""


def decode_upstream(data: bytes | str) -> AdapterEvent | None:
    """A server frame for the adapter; ``None`` for a type it skips (acknowledgements,
    ``info``, sideband-only events…). Raises on bad JSON or a malformed event it needs."""
    try:
        return _adapter_decoder.decode(data)
    except msgspec.ValidationError:
        kind = event_type(data)
        if kind and kind not in ADAPTER_EVENT_TYPES:
            return None
        raise


def decode_server_event(data: bytes | str) -> ServerEvent:
    """Any server event we model (tests). Raises on anything else."""
    return _server_decoder.decode(data)


def decode_client_event(data: bytes | str) -> ClientEvent:
    """A client event, strictly (the simulator): unknown types and fields raise."""
    return _client_decoder.decode(data)
