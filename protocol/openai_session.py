"""The OpenAI door's sessions: ``session.update`` as a ``configure``, a configuration as
OpenAI's session object, the gateway's usage as OpenAI's. Pure."""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from protocol.configuration import (
    MAX_CLIENT_TOOLS,
    SERVER_VAD_ONLY,
    ClientToolSpec,
    ConfigChange,
    InputAudio,
    SessionConfig,
    apply_change,
)
from protocol.events import Configure, Usage
from protocol.openai_events import AudioInput, FunctionTool, SessionBody

__all__ = [
    "call_parts",
    "config_change",
    "input_audio_of",
    "output_of",
    "route_configure",
    "session_of",
    "usage_of",
]


_NO_DEFAULTS: Final = (
    ("max_output_tokens", (None, "inf")),
    ("truncation", (None, "auto")),
    ("prompt", (None,)),
    ("reasoning", (None,)),
)


def config_change(body: SessionBody, *, model_route: tuple[str, str] | None) -> Configure | str:
    """``session.update``'s session as a ``configure``; a refusal (what to change) otherwise."""
    if body.type != "realtime":
        return "only realtime sessions are served (session.type 'realtime'); transcription is not"
    for name, allowed in _NO_DEFAULTS:
        if getattr(body, name) not in allowed:
            return f"session.{name} is not supported by this gateway; leave it unset"
    if body.include:
        return "session.include is not supported by this gateway; leave it unset"
    change: dict[str, Any] = {}
    if model_route is not None:
        change["provider"], change["model"] = model_route
    if body.instructions is not None:
        change["instructions"] = body.instructions
    if body.tools is not None:
        if len(body.tools) > MAX_CLIENT_TOOLS:  # before any work per tool
            return (
                f"session.tools: {len(body.tools)} tools, at most {MAX_CLIENT_TOOLS}; "
                "declare the ones this session needs"
            )
        tools: list[dict[str, Any]] = []  # checked as the gateway checks a configure's
        for raw in body.tools:
            if raw.get("type", "function") != "function":
                kind = str(raw.get("type"))[:40]
                return (
                    f"tools of type {kind!r} are not supported through this door: declare "
                    "function tools (the gateway's own tools, MCP included, are configured "
                    "by its operator)"
                )
            try:
                tool = msgspec.convert(raw, FunctionTool)
            except msgspec.ValidationError as exc:
                return f"invalid function tool: {exc}"
            tools.append(
                {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters or {"type": "object", "properties": {}},
                }
            )
        try:
            specs = msgspec.convert(tools, tuple[ClientToolSpec, ...])
        except msgspec.ValidationError as exc:
            return f"invalid function tool: {exc}".replace("`$", "`$.session.tools")
        # What the session would refuse of them (a name twice, a schema not an object or
        # past the limits): refused here, before anything of the event is sent.
        problem = apply_change(SessionConfig(), ConfigChange(tools=specs))
        if isinstance(problem, str):
            return f"session.{problem}"
        change["tools"] = specs
    if body.tool_choice not in (None, "auto"):
        return "session.tool_choice other than 'auto' is not supported by this gateway"
    if body.output_modalities is not None:
        modes = set(body.output_modalities)
        if len(modes) != 1:
            return "session.output_modalities takes one of ['text'] or ['audio']"
        change["output"] = "audio" if "audio" in modes else "text"
    audio = body.audio
    if audio is not None and audio.output is not None:
        out = audio.output
        if out.format is not None and out.format.type != "audio/pcm":
            return "output audio is PCM 24 kHz (audio/pcm) on this gateway"
        if out.voice is not None:
            change["voice"] = out.voice
        if out.speed is not None:  # 1.0, the normal pace, is every provider's own
            change["speed"] = None if out.speed == 1.0 else out.speed
    if audio is not None and audio.input is not None:
        heard = input_audio_of(audio.input)
        if isinstance(heard, str):
            return heard
        change["input_audio"] = heard
    try:
        return msgspec.convert(change, Configure)
    except msgspec.ValidationError as exc:
        return f"invalid session: {exc}"


_call_decoder: Final = msgspec.json.Decoder(dict[str, Any])


def call_parts(content: str) -> tuple[str, str]:
    """``(name, arguments as JSON text)`` of a ``call`` event's content."""
    try:
        raw = _call_decoder.decode(content)
    except msgspec.DecodeError:
        return "", "{}"
    return str(raw.get("name", "")), msgspec.json.encode(raw.get("args", {})).decode()


def input_audio_of(audio: AudioInput) -> InputAudio | str:
    """``session.audio.input`` as the gateway's ``input_audio``; a refusal otherwise."""
    fmt = audio.format
    if fmt is not None and (fmt.type != "audio/pcm" or fmt.rate not in (None, 24000)):
        return "input audio is PCM 24 kHz (audio/pcm) on this gateway"
    # ``transcription`` asks for the user's speech as text: the gateway always sends it
    # (the provider's own transcript, whatever transcription model is named).
    noise = audio.noise_reduction.type if audio.noise_reduction else None
    td = audio.turn_detection
    if td is msgspec.UNSET:
        return InputAudio(noise_reduction=noise)
    if td is None:
        return InputAudio(turn_detection="none", noise_reduction=noise)
    if td.create_response is False or td.interrupt_response is False:
        return (
            "turn_detection.create_response and interrupt_response are always on with this "
            "gateway's voice activity detection; leave them unset"
        )
    heard: dict[str, Any] = {"turn_detection": td.type, "noise_reduction": noise}
    if td.type == "semantic_vad":
        heard["eagerness"] = td.eagerness
    else:  # server VAD's own settings, checked as a configure's are
        for name in SERVER_VAD_ONLY:
            heard[name] = getattr(td, name)
    try:
        return msgspec.convert(heard, InputAudio)
    except msgspec.ValidationError as exc:
        return f"invalid session.audio.input.turn_detection: {exc}"


def usage_of(usage: Usage) -> dict[str, Any]:
    return {
        "total_tokens": usage.input + usage.output,
        "input_tokens": usage.input,
        "output_tokens": usage.output,
        "input_token_details": {
            "cached_tokens": usage.cached,
            "audio_tokens": usage.input_audio,
            "text_tokens": max(0, usage.input - usage.input_audio),
        },
        "output_token_details": {
            "audio_tokens": usage.output_audio,
            "text_tokens": max(0, usage.output - usage.output_audio),
        },
    }


def session_of(config: SessionConfig, sid: str, model: str) -> dict[str, Any]:
    """The session as OpenAI shows it (``session.created``/``updated``)."""
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": sid,
        "model": config.model or model,
        "instructions": config.instructions,
        "output_modalities": [config.output],
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
            }
            for t in config.tools
        ],
        "tool_choice": "auto",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 24000}, **_heard(config.input_audio)},
            "output": {
                "format": {"type": "audio/pcm", "rate": 24000},
                **({"voice": config.voice} if config.voice else {}),
                "speed": config.speed or 1.0,
            },
        },
    }


def _heard(audio: InputAudio | None) -> dict[str, Any]:
    """``session.audio.input``'s turn detection and noise reduction, as configured (OpenAI
    shows them back in ``session.updated``); nothing before input audio is."""
    if audio is None:
        return {}
    shown: dict[str, Any] = {}
    if audio.noise_reduction in ("near_field", "far_field"):
        shown["noise_reduction"] = {"type": audio.noise_reduction}
    if audio.turn_detection == "none":
        return {**shown, "turn_detection": None}
    detection: dict[str, Any] = {"type": audio.turn_detection}
    names = ("eagerness",) if audio.turn_detection == "semantic_vad" else SERVER_VAD_ONLY
    detection |= {n: v for n in names if (v := getattr(audio, n)) is not None}
    detection |= {"create_response": True, "interrupt_response": True}
    return {**shown, "turn_detection": detection}


def output_of(content: str) -> str:
    """A logged ``result``'s one output as the client gave it (its ``content``: the JSON
    array of ``{"tool", "status", "content"}``), as a ``function_call_output``'s text."""
    try:
        given = msgspec.json.decode(content)[0]["content"]
    except (msgspec.DecodeError, LookupError, TypeError):
        return content
    return given if isinstance(given, str) else msgspec.json.encode(given).decode()


def route_configure(route: tuple[str, str], *, audio: bool) -> Configure:
    """The door's configure of ``?model=``'s route (``(provider, model)``); a new session
    answers in audio, OpenAI's default (pipecat needs it)."""
    output: Literal["audio"] | msgspec.UnsetType = "audio" if audio else msgspec.UNSET
    return Configure(provider=route[0], model=route[1], output=output)
