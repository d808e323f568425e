"""The OpenAI Realtime (GA) wire's objects: what its events carry, as msgspec Structs.

A session (its audio, turn detection, transcription, tools), a conversation
item and its content parts, a response with its status and usage, an error's
detail, a rate limit. Apart from the events (``gateway.upstream.openai_wire``,
which names these too) because they are the API's data model, shared by many
events and changed with it, while the events are its verbs. The encoding
conventions are that module's: objects nested in client events omit fields
left at their default, server events carry every field.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "AudioConfig",
    "AudioFormat",
    "AudioInput",
    "AudioOutput",
    "CachedTokenDetails",
    "ContentPart",
    "ErrorDetail",
    "FunctionTool",
    "InputTokenDetails",
    "Item",
    "NoiseReduction",
    "OutputTokenDetails",
    "RateLimit",
    "Reasoning",
    "Response",
    "ResponseParams",
    "ResponseUsage",
    "RetentionRatio",
    "Session",
    "StatusDetails",
    "StatusError",
    "Transcription",
    "TurnDetection",
]


class ContentPart(msgspec.Struct, omit_defaults=True):
    """One content part of a message item (``input_text``/``output_text``,
    ``input_audio``/``output_audio`` with a ``transcript``), or the ``part`` of
    ``response.content_part.*`` (type ``text`` or ``audio``)."""

    type: str
    text: str | None = None
    transcript: str | None = None
    audio: str | None = None


class Item(msgspec.Struct, omit_defaults=True):
    """A conversation item: a ``message`` (give it a ``content`` list, even an
    empty one: the API requires it), a ``function_call`` (``call_id``, ``name``,
    ``arguments`` JSON text) or a ``function_call_output`` (``call_id``,
    ``output``); other types (MCP) decode with what they share."""

    type: str
    id: str | None = None
    object: str | None = None
    status: str | None = None
    role: str | None = None
    content: list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class AudioFormat(msgspec.Struct, omit_defaults=True):
    """``audio/pcm`` (PCM16, ``rate`` 24000 — the only rate), ``audio/pcmu``, ``audio/pcma``."""

    type: str = "audio/pcm"
    rate: int | None = None


class TurnDetection(msgspec.Struct, omit_defaults=True):
    """``server_vad`` (or ``semantic_vad``): the server detects speech, commits the
    buffer when it ends and (``create_response``) answers; speech during a
    response cancels it (``interrupt_response``). Send ``null`` to turn it off."""

    type: str
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None
    eagerness: str | None = None


class Transcription(msgspec.Struct, omit_defaults=True):
    """Input transcription (off unless set): the ASR ``model`` and hints."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class NoiseReduction(msgspec.Struct, omit_defaults=True):
    type: str
    strength: float | None = None


class RetentionRatio(msgspec.Struct, omit_defaults=True):
    """``session.truncation`` as a share of the window kept when a long context is cut."""

    retention_ratio: float
    type: str = "retention_ratio"
    token_limits: dict[str, int] | None = None


class Reasoning(msgspec.Struct, omit_defaults=True):
    effort: str | None = None


class AudioInput(msgspec.Struct, omit_defaults=True):
    """``session.audio.input``. ``turn_detection`` UNSET keeps the server's
    setting; ``None`` (sent as ``null``) turns detection off."""

    format: AudioFormat | None = None
    transcription: Transcription | None = None
    turn_detection: TurnDetection | msgspec.UnsetType | None = msgspec.UNSET
    # ``{"type": "near_field" | "far_field", "strength"?}``; null turns it off.
    noise_reduction: NoiseReduction | msgspec.UnsetType | None = msgspec.UNSET


class AudioOutput(msgspec.Struct, omit_defaults=True):
    """``session.audio.output``: the ``voice`` (a name such as ``alloy``, ``marin``)."""

    format: AudioFormat | None = None
    voice: str | None = None
    speed: float | None = None


class AudioConfig(msgspec.Struct, omit_defaults=True):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class FunctionTool(msgspec.Struct, omit_defaults=True):
    """A function the model may call (``session.tools``): JSON Schema ``parameters``."""

    type: str = "function"
    name: str | None = None
    description: str | None = None
    parameters: object | None = None


class Session(msgspec.Struct, omit_defaults=True):
    """The session configuration: sent in ``session.update``, echoed in
    ``session.created``/``session.updated`` (which also carry ``id``/``object``).

    OpenAI's GA shape sets ``type`` ("realtime") and nests voice and turn
    detection under ``audio``; xAI's flat shape has no ``type`` and sets
    ``voice`` and ``turn_detection`` here (docs/providers.md).
    """

    type: str | None = None
    id: str | None = None
    object: str | None = None
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[str] | None = None
    max_output_tokens: int | str | None = None
    expires_at: int | None = None
    audio: AudioConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | None = None
    truncation: str | RetentionRatio | None = None
    reasoning: Reasoning | None = None
    # xAI's flat session shape.
    voice: str | None = None
    turn_detection: TurnDetection | msgspec.UnsetType | None = msgspec.UNSET


class ResponseParams(msgspec.Struct, omit_defaults=True):
    """Per-response overrides of ``response.create`` (the simulator ignores them)."""

    instructions: str | None = None
    output_modalities: list[str] | None = None
    conversation: str | None = None
    metadata: dict[str, str] | None = None


class CachedTokenDetails(msgspec.Struct):
    """Of ``cached_tokens``, how many were text, audio or image tokens."""

    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0


class InputTokenDetails(msgspec.Struct):
    """``audio_tokens`` counts cached audio too (``cached_tokens_details`` says how much)."""

    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_details: CachedTokenDetails | None = None


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
