"""The OpenAI simulator's conversation state: items, responses, the session's audio.

Pure data and pure functions for ``gateway.sim.openai``: a conversation item
and a running response as the simulated server keeps them, how an item is
shown on the wire, and how a ``session.update`` merges into the session.
"""

from __future__ import annotations

import asyncio
from typing import Final

import msgspec

from gateway.upstream import openai_wire as wire

__all__ = [
    "CONTENT_TYPES",
    "DEFAULT_TURN_DETECTION",
    "INPUT_RATE",
    "Item",
    "RealtimeResponse",
    "merge_audio",
    "wire_item",
]

# The input audio rate of the API (PCM16 mono).
INPUT_RATE: Final = 24000
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
            for name in ("format", "transcription", "noise_reduction")
            if getattr(update.input, name) is not None
        }
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
