"""A session's own configuration: what the app wants of this one session.

Set when the app's backend makes the session (``POST /v1/sessions``) and
changed by a trusted client with a ``configure`` frame; stored with the
session, so every node that drives it (after a reconnect, a takeover or a
drain) gives the model the same instructions, tools and provider. The
gateway's key policy decides what a tenant may set; this module only says
what a configuration *is* and how a change applies to it.

Pure: Structs, their limits (as msgspec constraints, so a bad value is a
``bad_frame`` that says which field), and ``apply``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = [
    "ClientToolSpec",
    "ConfigChange",
    "InputAudio",
    "SessionConfig",
    "apply_change",
    "decode_config",
    "encode_config",
    "json_depth",
    "parameters_bytes",
    "schema_bytes",
]

ToolName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]
ShortText = Annotated[str, msgspec.Meta(max_length=512)]

MAX_INSTRUCTIONS: Final = 32_768
MAX_CLIENT_TOOLS: Final = 64
MAX_SERVER_TOOLS: Final = 512
"""Names a session's ``server_tools`` may list: a node's built-in, HTTP and MCP tools
(an MCP server gives at most 128). 70,000 were taken, and echoed as a 1 MB event."""
ServerToolNames = Annotated[tuple[ToolName, ...], msgspec.Meta(max_length=MAX_SERVER_TOOLS)]
MAX_METADATA: Final = 32
VAD_MS_MAX: Final = 10_000  # the longest VAD padding or silence a session may ask for
SERVER_VAD_TUNING: Final = ("threshold", "prefix_padding_ms", "silence_duration_ms")
"""``InputAudio``'s settings of server VAD (the control ``vad_tuning``)."""
SERVER_VAD_ONLY: Final = ("idle_timeout_ms", *SERVER_VAD_TUNING)
"""``InputAudio``'s fields that apply to ``server_vad`` only."""

# What a tenant's tool schemas and a model's tool args may be, checked by
# linear code before anything compiles or walks them: a schema or
# args past these once froze a node for seconds or crashed it with a
# RecursionError. docs/decisions/tenant-tool-schemas.md has the figures.
MAX_TOOL_DESCRIPTION: Final = 4096
"""Characters of a tool's description (a client's, an MCP server's)."""
MAX_TOOL_SCHEMA_BYTES: Final = 32_768
"""One client tool's ``parameters`` as compact JSON (a rich form tool is ~5 kB)."""
MAX_TOOL_SCHEMAS_BYTES: Final = 131_072
"""All of a session's client tools' ``parameters`` together."""
MAX_SCHEMA_DEPTH: Final = 32
"""Nesting levels of one ``parameters`` schema (each object or array is one)."""
MAX_ARGS_DEPTH: Final = 32
"""Nesting levels of one tool call's args (each object or array is one)."""


class ClientToolSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tool the client runs itself: the model calls it, the client answers.

    ``parameters`` is the JSON Schema of its arguments (an object schema).
    """

    name: ToolName
    description: Annotated[str, msgspec.Meta(max_length=MAX_TOOL_DESCRIPTION)] = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    # The turn does not wait for it: the model is told it started, the answer comes later.
    background: bool = False


class InputAudio(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """Audio the client sends: PCM16 little-endian mono at ``rate`` Hz, and how the
    provider hears it.

    - ``turn_detection``: ``server_vad`` (silence ends the user's turn),
      ``semantic_vad`` (the model judges when the user is done; ``eagerness``
      says how soon) or ``none`` (the client ends its turn with ``commit``);
    - ``idle_timeout_ms`` (``server_vad``): after the model's answer, this long
      without speech makes the model speak again;
    - ``threshold``, ``prefix_padding_ms``, ``silence_duration_ms`` (``server_vad``):
      how loud speech must be (0-1), how much audio before the detected start the
      turn keeps, and how long a silence ends the turn (a longer one lets a speaker
      pause mid-sentence); unset: the provider's default (OpenAI's 0.5, 300, 500 ms);
    - ``noise_reduction``: ``near_field`` (headset), ``far_field`` (laptop,
      room) or ``off``; unset: the provider's default.
    """

    format: Literal["pcm16"] = "pcm16"
    rate: Annotated[int, msgspec.Meta(ge=8000, le=48000)] = 24000
    turn_detection: Literal["server_vad", "semantic_vad", "none"] = "server_vad"
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    idle_timeout_ms: Annotated[int, msgspec.Meta(ge=1000, le=3_600_000)] | None = None
    threshold: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    prefix_padding_ms: Annotated[int, msgspec.Meta(ge=0, le=VAD_MS_MAX)] | None = None
    silence_duration_ms: Annotated[int, msgspec.Meta(ge=0, le=VAD_MS_MAX)] | None = None
    noise_reduction: Literal["near_field", "far_field", "off"] | None = None


Truncation = Literal["auto", "disabled"] | Annotated[float, msgspec.Meta(ge=0, le=1)]
"""How the provider cuts a context past the model's window: ``auto``, ``disabled`` (an
error instead), or the share of the window to keep when it cuts (a retention ratio)."""

ReasoningEffort = Literal["minimal", "low", "medium", "high", "xhigh"]

Speed = Annotated[float, msgspec.Meta(ge=0.25, le=1.5)]
"""How fast the voice speaks, 1.0 its normal pace (OpenAI's ``audio.output.speed``:
0.25-1.5); None: the provider's normal pace."""

DtmfHandling = Literal["event", "message"]
"""A phone caller's key presses: ``event`` (a ``dtmf`` event for the session's
clients), or ``message`` (that, and a message to the model saying which keys)."""


class SessionConfig(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """The effective configuration of one session ("" / None / empty = the node's default)."""

    instructions: Annotated[str, msgspec.Meta(max_length=MAX_INSTRUCTIONS)] = ""
    tools: Annotated[tuple[ClientToolSpec, ...], msgspec.Meta(max_length=MAX_CLIENT_TOOLS)] = ()
    server_tools: ServerToolNames | None = None
    provider: ShortText = ""
    model: ShortText = ""
    metadata: Annotated[dict[ShortText, ShortText], msgspec.Meta(max_length=MAX_METADATA)] = (
        msgspec.field(default_factory=dict)
    )
    input_audio: InputAudio | None = None
    output: Literal["text", "audio"] = "text"
    voice: ShortText = ""
    speed: Speed | None = None
    truncation: Truncation | None = None
    reasoning_effort: ReasoningEffort | None = None
    dtmf: DtmfHandling = "event"
    # Server tools whose calls wait for a user's approve (added to the operator's).
    require_approval: Annotated[tuple[ToolName, ...], msgspec.Meta(max_length=64)] = ()
    record: bool = False


class ConfigChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The fields a ``configure`` frame (or a session's creation) sets; the rest stay."""

    instructions: Annotated[str, msgspec.Meta(max_length=MAX_INSTRUCTIONS)] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    tools: (
        Annotated[tuple[ClientToolSpec, ...], msgspec.Meta(max_length=MAX_CLIENT_TOOLS)]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    server_tools: ServerToolNames | msgspec.UnsetType | None = msgspec.UNSET
    provider: ShortText | msgspec.UnsetType = msgspec.UNSET
    model: ShortText | msgspec.UnsetType = msgspec.UNSET
    metadata: (
        Annotated[dict[ShortText, ShortText], msgspec.Meta(max_length=MAX_METADATA)]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    input_audio: InputAudio | msgspec.UnsetType | None = msgspec.UNSET
    output: Literal["text", "audio"] | msgspec.UnsetType = msgspec.UNSET
    voice: ShortText | msgspec.UnsetType = msgspec.UNSET
    speed: Speed | msgspec.UnsetType | None = msgspec.UNSET
    truncation: Truncation | msgspec.UnsetType | None = msgspec.UNSET
    reasoning_effort: ReasoningEffort | msgspec.UnsetType | None = msgspec.UNSET
    dtmf: DtmfHandling | msgspec.UnsetType = msgspec.UNSET
    require_approval: (
        Annotated[tuple[ToolName, ...], msgspec.Meta(max_length=64)] | msgspec.UnsetType
    ) = msgspec.UNSET
    record: bool | msgspec.UnsetType = msgspec.UNSET


def apply_change(config: SessionConfig, change: ConfigChange) -> SessionConfig | str:
    """``config`` with ``change`` applied, or why the result is not a valid configuration."""
    fields = {
        name: value
        for name in ConfigChange.__struct_fields__
        if (value := getattr(change, name)) is not msgspec.UNSET
    }
    updated = msgspec.structs.replace(config, **fields)
    audio = updated.input_audio
    if audio is not None:
        if audio.eagerness is not None and audio.turn_detection != "semantic_vad":
            return (
                "input_audio.eagerness applies to turn_detection semantic_vad only; "
                'set "turn_detection": "semantic_vad" or leave eagerness out'
            )
        for name in SERVER_VAD_ONLY:
            if getattr(audio, name) is not None and audio.turn_detection != "server_vad":
                return (
                    f"input_audio.{name} applies to turn_detection server_vad only; "
                    f'set "turn_detection": "server_vad" or leave {name} out'
                )
    seen: set[str] = set()
    for tool in updated.tools:  # a set: a count per name was quadratic in the tools
        if tool.name in seen:
            return f"tools: the name {tool.name!r} is declared twice; give each tool its own name"
        seen.add(tool.name)
    total = 0
    for tool in updated.tools:
        if tool.parameters.get("type", "object") != "object":
            return (
                f"tools: {tool.name!r} parameters must be a JSON Schema of type object, "
                'e.g. {"type": "object", "properties": {…}}'
            )
        size = schema_bytes(tool)
        if isinstance(size, str):
            return size
        total += size
        if total > MAX_TOOL_SCHEMAS_BYTES:
            return (
                f"tools: the parameters of the tools up to {tool.name!r} come to {total:,} "
                f"bytes of JSON, over the limit of {MAX_TOOL_SCHEMAS_BYTES:,} for a "
                "session's tools together; declare fewer tools or shorter schemas"
            )
    return updated


def schema_bytes(tool: ClientToolSpec) -> int | str:
    """The size of ``tool``'s ``parameters`` as compact JSON, or why it is past the limits."""
    return parameters_bytes(tool.name, tool.parameters)


def parameters_bytes(name: str, parameters: Any) -> int | str:
    """The size of a tool's ``parameters`` as compact JSON, or why it is past the limits
    (a client's tool or an MCP server's).

    Size first (msgspec encodes in C: ~1 ms for 1 MB), then depth on what is
    left (a Python walk, so only over at most ``MAX_TOOL_SCHEMA_BYTES``).
    """
    try:
        size = len(_encoder.encode(parameters))
    except RecursionError:  # msgspec recurses per level: deeper than ~1,000 is no schema
        size = -1
    if size > MAX_TOOL_SCHEMA_BYTES:
        return (
            f"tools: {name!r} parameters are {size:,} bytes of JSON, over the limit "
            f"of {MAX_TOOL_SCHEMA_BYTES:,} for one tool; shorten its descriptions or "
            "split the tool"
        )
    if size < 0 or json_depth(parameters, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        return (
            f"tools: {name!r} parameters nest deeper than {MAX_SCHEMA_DEPTH} levels, "
            "the limit for a tool schema; flatten it (a part used in several places can "
            'live once under "$defs" and be named with "$ref": "#/$defs/NAME")'
        )
    return size


def json_depth(value: Any, limit: int) -> int:
    """How deeply decoded JSON ``value`` nests (a scalar 0, ``[]`` or ``{}`` 1).

    Iterative, and it stops as soon as the depth passes ``limit`` (returning
    ``limit + 1``): deep input cannot make it recurse, and wide input is
    walked once.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return limit + 1
        below = depth + 1
        stack.extend((c, below) for c in children if isinstance(c, dict | list | tuple))
    return deepest


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(SessionConfig)


def encode_config(config: SessionConfig) -> bytes:
    return _encoder.encode(config)


def decode_config(data: bytes | str) -> SessionConfig:
    """A stored configuration ("" or ``{}``: the defaults)."""
    return _decoder.decode(data) if data else SessionConfig()
