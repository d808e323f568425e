"""The Gemini Live (``BidiGenerateContent``) wire: the messages we send and receive, as Structs.

One definition of the wire for both sides we own: the adapter
(``gateway.upstream.gemini``) encodes client messages and decodes server
messages; the simulator (``gateway.sim.gemini``) decodes client messages and
encodes server messages. Field names follow the Gemini API's JSON (camelCase,
``rename="camel"``) as the official ``google-genai`` SDK reads and writes them
(``google.genai.types``: ``LiveClientSetup``, ``LiveClientContent``,
``LiveServerMessage``, ``LiveServerContent``, ``UsageMetadata``,
``LiveServerGoAway``, ``LiveServerSessionResumptionUpdate``); the simulator's
frames are validated against those pydantic models, with extra fields
forbidden, in ``tests/upstream/test_gemini_sdk.py``.

Gemini messages are not tagged: each is a JSON object whose one key says what
it is (``{"setup": …}``, ``{"serverContent": …}``); a server message may carry
two (``serverContent`` with ``turnComplete`` and ``usageMetadata`` together).
So each direction is ONE Struct with an optional field per top-level key, and
decoding is one call of a reused ``Decoder``; msgspec skips the keys we do not
declare (tool calls, transcriptions, voice activity), so they cost nothing.

Encoding omits fields left at their default (``omit_defaults``): we never send
``null`` for a field the API may not accept, and a frame holds exactly what
was set.

Client messages are strict where the simulator needs it: the top-level
message, ``setup`` and ``clientContent`` forbid unknown fields, as the real API
does ("Invalid JSON payload received. Unknown name …"), so a misspelt field in
the adapter fails a test instead of being ignored. The setup fields we never
send are declared (as ``object``) only so that the simulator accepts every
setup a real client such as the SDK may send.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = [
    "ActivityMarker",
    "AutomaticActivityDetection",
    "Blob",
    "ClientContent",
    "ClientMessage",
    "Content",
    "ErrorBody",
    "FunctionCall",
    "FunctionDeclaration",
    "FunctionResponse",
    "GenerationConfig",
    "GoAway",
    "ModalityTokenCount",
    "Part",
    "PrebuiltVoiceConfig",
    "RealtimeInput",
    "RealtimeInputConfig",
    "ServerContent",
    "ServerMessage",
    "SessionResumptionUpdate",
    "Setup",
    "SetupComplete",
    "SpeechConfig",
    "Tool",
    "ToolCall",
    "ToolCallCancellation",
    "ToolResponse",
    "Transcription",
    "UsageMetadata",
    "VoiceActivity",
    "VoiceConfig",
    "camelize",
    "decode_client_message",
    "decode_server_message",
    "encode",
    "text_content",
]


# --- content: shared by setup, clientContent and serverContent -------------------


class Blob(msgspec.Struct, omit_defaults=True, rename="camel"):
    """Inline media: ``data`` base64, ``mimeType`` e.g. ``audio/pcm;rate=16000``."""

    mime_type: str | None = None
    data: bytes | None = None  # base64 on the wire


class Part(msgspec.Struct, omit_defaults=True, rename="camel"):
    """One part of a turn: ``text`` or ``inlineData`` (audio output); ``thought``
    marks a thinking model's reasoning summary, which is not output (the
    adapter skips such parts)."""

    text: str | None = None
    thought: bool | None = None
    inline_data: Blob | None = None


class Content(msgspec.Struct, omit_defaults=True, rename="camel"):
    """A turn: ``role`` is ``user`` or ``model`` (absent in ``systemInstruction``
    and, from some servers, in ``modelTurn``)."""

    parts: list[Part] = []
    role: str | None = None


def text_content(role: str | None, text: str) -> Content:
    """A one-part text turn (``role`` ``None`` for a system instruction)."""
    return Content(parts=[Part(text=text)], role=role)


# --- client messages (we send them; the simulator decodes them) ----------------------


class PrebuiltVoiceConfig(msgspec.Struct, omit_defaults=True, rename="camel"):
    voice_name: str | None = None


class VoiceConfig(msgspec.Struct, omit_defaults=True, rename="camel"):
    prebuilt_voice_config: PrebuiltVoiceConfig | None = None


class SpeechConfig(msgspec.Struct, omit_defaults=True, rename="camel"):
    """``generationConfig.speechConfig``: the voice of AUDIO output (e.g. ``Puck``)."""

    voice_config: VoiceConfig | None = None
    language_code: str | None = None
    multi_speaker_voice_config: object | None = None


class FunctionDeclaration(msgspec.Struct, omit_defaults=True, rename="camel"):
    """A function the model may call; ``parametersJsonSchema`` is plain JSON Schema."""

    name: str | None = None
    description: str | None = None
    parameters: object | None = None
    parameters_json_schema: object | None = None
    response: object | None = None
    response_json_schema: object | None = None
    behavior: str | None = None


class Tool(msgspec.Struct, omit_defaults=True, rename="camel"):
    """One entry of ``setup.tools``; we declare functions, other kinds pass through."""

    function_declarations: list[FunctionDeclaration] | None = None
    google_search: object | None = None
    code_execution: object | None = None


class AutomaticActivityDetection(msgspec.Struct, omit_defaults=True, rename="camel"):
    """Server-side VAD; ``disabled``: the client marks speech with activityStart/End."""

    disabled: bool | None = None
    start_of_speech_sensitivity: str | None = None
    end_of_speech_sensitivity: str | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None


class RealtimeInputConfig(msgspec.Struct, omit_defaults=True, rename="camel"):
    automatic_activity_detection: AutomaticActivityDetection | None = None
    activity_handling: str | None = None
    turn_coverage: str | None = None


class ActivityMarker(msgspec.Struct, omit_defaults=True):
    """``activityStart`` / ``activityEnd``: an empty object."""


class RealtimeInput(msgspec.Struct, omit_defaults=True, rename="camel"):
    """Streamed input: ``audio`` chunks, and (manual activity detection) the
    ``activityStart``/``activityEnd`` around the user's speech."""

    audio: Blob | None = None
    audio_stream_end: bool | None = None
    activity_start: ActivityMarker | None = None
    activity_end: ActivityMarker | None = None
    text: str | None = None
    video: object | None = None
    media_chunks: object | None = None


class FunctionResponse(msgspec.Struct, omit_defaults=True, rename="camel"):
    """The output of one call (``id`` from the ``toolCall``); ``response`` a JSON object."""

    id: str | None = None
    name: str | None = None
    response: dict[str, Any] | None = None
    will_continue: bool | None = None
    scheduling: str | None = None
    parts: object | None = None


class ToolResponse(msgspec.Struct, omit_defaults=True, rename="camel"):
    function_responses: list[FunctionResponse] | None = None


class ThinkingConfig(msgspec.Struct, omit_defaults=True, rename="camel"):
    """``generationConfig.thinkingConfig``: thoughts in the output (``includeThoughts``),
    a budget (2.5 models) or a level (3.x: MINIMAL|LOW|MEDIUM|HIGH|XHIGH)."""

    include_thoughts: bool | None = None
    thinking_budget: int | None = None
    thinking_level: str | None = None


class SessionResumptionConfig(msgspec.Struct, omit_defaults=True, rename="camel"):
    """``setup.sessionResumption``: ask for resumption handles (``sessionResumptionUpdate``);
    with ``handle``, continue that session. ``transparent`` is Vertex AI's only."""

    handle: str | None = None
    transparent: bool | None = None


class SlidingWindow(msgspec.Struct, omit_defaults=True, rename="camel"):
    """Compression keeps the newest turns up to ``targetTokens`` (default: half the trigger)."""

    target_tokens: int | None = None


class ContextWindowCompression(msgspec.Struct, omit_defaults=True, rename="camel"):
    """``setup.contextWindowCompression``: past ``triggerTokens`` the context is cut
    (``slidingWindow``), so a session is not limited to the context's length."""

    trigger_tokens: int | None = None
    sliding_window: SlidingWindow | None = None


class GenerationConfig(msgspec.Struct, omit_defaults=True, rename="camel"):
    """``setup.generationConfig``: we set only ``responseModalities`` (``["TEXT"]``)."""

    response_modalities: list[str] | None = None
    candidate_count: int | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    speech_config: SpeechConfig | None = None
    media_resolution: str | None = None
    thinking_config: ThinkingConfig | None = None
    enable_affective_dialog: bool | None = None


class Setup(msgspec.Struct, omit_defaults=True, rename="camel", forbid_unknown_fields=True):
    """The first client message: the model (``models/NAME``) and the session's configuration."""

    model: str
    generation_config: GenerationConfig | None = None
    system_instruction: Content | None = None
    tools: list[Tool] | None = None
    realtime_input_config: RealtimeInputConfig | None = None
    # Transcription configs: ``{}`` turns a transcription on.
    input_audio_transcription: object | None = None
    output_audio_transcription: object | None = None
    # Ask for ``voiceActivity`` messages (speech start/end) from the server's VAD.
    explicit_vad_signal: bool | None = None
    session_resumption: SessionResumptionConfig | None = None
    context_window_compression: ContextWindowCompression | None = None
    # Declared so the simulator accepts any real setup; the adapter never sets them.
    proactivity: object | None = None
    history_config: object | None = None
    avatar_config: object | None = None
    safety_settings: object | None = None
    labels: object | None = None


class ClientContent(msgspec.Struct, omit_defaults=True, rename="camel", forbid_unknown_fields=True):
    """Turns appended to the conversation, in order. ``turnComplete`` asks the
    model to answer; without it the turns are only context."""

    turns: list[Content] | None = None
    turn_complete: bool | None = None


class ClientMessage(msgspec.Struct, omit_defaults=True, rename="camel", forbid_unknown_fields=True):
    """One client frame: exactly one of its fields is set."""

    setup: Setup | None = None
    client_content: ClientContent | None = None
    realtime_input: RealtimeInput | None = None
    tool_response: ToolResponse | None = None


# --- server messages (the simulator sends them; the adapter decodes them) ------------


class SetupComplete(msgspec.Struct, omit_defaults=True, rename="camel"):
    session_id: str | None = None


class ServerContent(msgspec.Struct, omit_defaults=True, rename="camel"):
    """Model output and turn state. A model turn arrives as many ``modelTurn``
    messages, then ``generationComplete`` (no more output), then ``turnComplete``
    (the model waits for input). ``interrupted``: a client message cut the
    generation short."""

    model_turn: Content | None = None
    generation_complete: bool | None = None
    turn_complete: bool | None = None
    interrupted: bool | None = None
    input_transcription: Transcription | None = None
    output_transcription: Transcription | None = None


class Transcription(msgspec.Struct, omit_defaults=True, rename="camel"):
    """A piece of the user's (input) or the model's (output) speech as text."""

    text: str | None = None
    finished: bool | None = None


class FunctionCall(msgspec.Struct, omit_defaults=True, rename="camel"):
    id: str | None = None
    name: str | None = None
    args: dict[str, Any] | None = None


class ToolCall(msgspec.Struct, omit_defaults=True, rename="camel"):
    """The model calls functions; it waits for a ``toolResponse`` to go on."""

    function_calls: list[FunctionCall] | None = None


class ToolCallCancellation(msgspec.Struct, omit_defaults=True, rename="camel"):
    ids: list[str] | None = None


class VoiceActivity(msgspec.Struct, omit_defaults=True, rename="camel"):
    """The server's VAD (with ``explicitVadSignal``): ``ACTIVITY_START``/``ACTIVITY_END``
    at ``audioOffset`` (a protobuf Duration such as ``"1.200s"``) into the input audio."""

    voice_activity_type: str | None = None
    audio_offset: str | None = None


class ModalityTokenCount(msgspec.Struct, omit_defaults=True, rename="camel"):
    modality: str | None = None
    token_count: int | None = None


class UsageMetadata(msgspec.Struct, omit_defaults=True, rename="camel"):
    """Token counts of a model turn. The Live API names the output
    ``responseTokenCount``; ``candidatesTokenCount`` (the ``generateContent``
    name) is read too, should a server send that instead."""

    prompt_token_count: int | None = None
    response_token_count: int | None = None
    candidates_token_count: int | None = None
    total_token_count: int | None = None
    cached_content_token_count: int | None = None
    thoughts_token_count: int | None = None
    prompt_tokens_details: list[ModalityTokenCount] | None = None
    response_tokens_details: list[ModalityTokenCount] | None = None


class GoAway(msgspec.Struct, omit_defaults=True, rename="camel"):
    """The server will close the connection; ``timeLeft`` is a protobuf Duration ("12.5s")."""

    time_left: str | None = None


class SessionResumptionUpdate(msgspec.Struct, omit_defaults=True, rename="camel"):
    new_handle: str | None = None
    resumable: bool | None = None
    last_consumed_client_message_index: int | None = None


class ErrorBody(msgspec.Struct, omit_defaults=True, rename="camel"):
    """An in-band ``{"error": {...}}`` (the Live API usually closes the socket
    with the error text as close reason instead)."""

    code: int | None = None
    message: str = ""
    status: str | None = None


class ServerMessage(msgspec.Struct, omit_defaults=True, rename="camel"):
    """One server frame: one or more of these fields set; undeclared keys are skipped."""

    setup_complete: SetupComplete | None = None
    server_content: ServerContent | None = None
    usage_metadata: UsageMetadata | None = None
    go_away: GoAway | None = None
    session_resumption_update: SessionResumptionUpdate | None = None
    error: ErrorBody | None = None
    tool_call: ToolCall | None = None
    tool_call_cancellation: ToolCallCancellation | None = None
    voice_activity: VoiceActivity | None = None


# --- codecs (module-level, reused) ----------------------------------------------------

_encoder: Final = msgspec.json.Encoder()
_server_decoder: Final = msgspec.json.Decoder(ServerMessage)
_any_decoder: Final = msgspec.json.Decoder()


def encode(message: ClientMessage | ServerMessage) -> bytes:
    """One JSON text frame's bytes (send it with ``text=True``)."""
    return _encoder.encode(message)


def decode_server_message(data: bytes | str) -> ServerMessage:
    """Decode a server frame (the adapter's hot path).

    Raises ``msgspec.DecodeError`` on bad JSON and ``msgspec.ValidationError``
    when a declared field has the wrong type.
    """
    return _server_decoder.decode(data)


def camelize(value: Any) -> Any:
    """``value`` with every object key in lowerCamelCase (``turn_complete`` → ``turnComplete``).

    The API parses JSON the protobuf way, accepting a field's original
    snake_case name as well as its camelCase JSON name; the SDK relies on it
    (it sends ``{"client_content": {... "turnComplete": true}}``).
    """
    if isinstance(value, dict):
        return {_camel(key): camelize(item) for key, item in value.items()}
    if isinstance(value, list):
        return [camelize(item) for item in value]
    return value


def _camel(key: str) -> str:
    if "_" not in key:
        return key
    head, *rest = key.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def decode_client_message(data: bytes | str) -> ClientMessage:
    """Decode a client frame (the simulator), accepting snake_case or camelCase names.

    Raises ``msgspec.DecodeError`` on bad JSON, ``msgspec.ValidationError`` on
    unknown fields or wrong types (the message names the path, e.g. ``$.setup``).
    """
    message = camelize(_any_decoder.decode(data))
    _standard_base64(message)
    return msgspec.convert(message, ClientMessage)


def _standard_base64(message: Any) -> None:
    """Rewrite URL-safe base64 audio (the SDK's pydantic encoding) to the standard alphabet.

    The API parses bytes the protobuf way, accepting either; msgspec reads the
    standard one only.
    """
    realtime = message.get("realtimeInput") if isinstance(message, dict) else None
    audio = realtime.get("audio") if isinstance(realtime, dict) else None
    if isinstance(audio, dict) and isinstance(audio.get("data"), str):
        data: str = audio["data"].replace("-", "+").replace("_", "/")
        audio["data"] = data + "=" * (-len(data) % 4)
