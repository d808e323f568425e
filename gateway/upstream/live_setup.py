"""What a GPT-Live session starts with, and the ``session.start`` that says it.

The conversation (``gateway.upstream.live_conversation``) keeps what changes as
the session goes (the turn, the caller's speech, the delegations); these are
the settings that do not: the model, the instructions, the startup history,
the voice, the delegation mode (and its backend) and the tool a client
delegation calls. ``session_start`` writes them as the connection's first
frame, the history as a model that only speaks reads it (the text protocol's
markup taken out) and cut to the service's startup limits. Pure: no socket.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from gateway.upstream import live_wire as wire
from gateway.upstream.base import FunctionTool, VoiceConfig
from protocol.assembly import Message
from protocol.events import Respond
from protocol.parser import Parser

__all__ = ["AUDIO_RATE", "DELEGATE_TOOL", "LiveSettings", "delegation_tool"]

log = logging.getLogger("gateway.upstream.live")

AUDIO_RATE: Final = 24000
"""The session's audio format: PCM16 mono 24 kHz, both ways (one format per session)."""

HISTORY_MESSAGES: Final = 128
HISTORY_CHARS: Final = 24000
"""The startup history: at most 128 messages (the SDK) within the default 8,192-token
budget, counted at 3 characters a token; older messages are left out."""

DELEGATE_TOOL: Final = "delegate"


@dataclass(frozen=True, slots=True)
class LiveSettings:
    """A GPT-Live session's start (see the module docstring); ``delegate``: the tool
    a client delegation calls (``delegation_tool``), None when the voice has none."""

    model: str
    instructions: str
    history: tuple[Message, ...]
    voice: VoiceConfig | None
    delegation: Literal["client", "responses"] = "client"
    backend: wire.Delegation | None = None
    delegate: FunctionTool | None = field(init=False)

    def __post_init__(self) -> None:
        tools = self.voice.tools if self.voice is not None else ()
        object.__setattr__(self, "delegate", delegation_tool(tools))

    def session_start(self, event_id: str) -> wire.SessionStart:
        """The connection's first frame."""
        voice = self.voice
        chosen = voice.audio_out.voice if voice is not None and voice.audio_out else ""
        if self.delegation == "responses" and self.backend is not None:
            delegation = self.backend
        else:
            delegation = wire.Delegation(type="client")
        items = _initial_items(self.history)
        session = wire.SessionConfig(
            model=self.model,
            instructions=self.instructions or None,
            audio=wire.SessionAudio(
                format=wire.AudioFormat(type="audio/pcm", rate=AUDIO_RATE),
                output=wire.Voice(voice=chosen) if chosen else None,
            ),
            delegation=delegation,
            input=items or None,
        )
        return wire.SessionStart(session=session, event_id=event_id)


def _plain(message: Message) -> Message:
    """``message`` as a model that speaks reads it: the history the session keeps is
    written in the text protocol (``<think>``, ``<execute>``, ``<end>``, ``<results>``),
    which GPT-Live neither writes nor reads. An assistant message keeps what was said;
    a tool results message becomes a developer note."""
    content = message.content
    if message.role == "assistant" and "<" in content:
        parser = Parser()
        events = [*parser.feed(content), *parser.close()]
        said = "".join(e.content for e in events if isinstance(e, Respond)).strip()
        return Message(role="assistant", content=said)
    if message.role == "user" and content.startswith("<results>"):
        body = content.removeprefix("<results>").removesuffix("</results>").strip()
        return Message(role="system", content=f"Tool results: {body}")
    return message


def _initial_items(history: Sequence[Message]) -> list[wire.InitialItem]:
    """The newest messages of ``history`` that fit the startup limits, in order."""
    kept: list[wire.InitialItem] = []
    budget = HISTORY_CHARS
    for message in map(_plain, reversed(history)):
        if not message.content:
            continue
        if len(kept) == HISTORY_MESSAGES or len(message.content) > budget:
            break
        budget -= len(message.content)
        role: Literal["developer", "user", "assistant"] = (
            "assistant"
            if message.role == "assistant"
            else "user"
            if message.role == "user"
            else "developer"
        )
        part = wire.TextPart(
            type="output_text" if role == "assistant" else "input_text", text=message.content
        )
        kept.append(wire.InitialItem(role=role, content=[part]))
    if len(kept) < len([m for m in map(_plain, history) if m.content]):
        log.info(
            "GPT-Live: startup history limited to its newest %d messages (%d characters)",
            len(kept),
            HISTORY_CHARS - budget,
        )
    kept.reverse()
    return kept


def delegation_tool(tools: Sequence[FunctionTool]) -> FunctionTool | None:
    """The tool a client delegation calls: ``delegate``, else the client's only one
    (an app that declares one function tool means it, whatever tools the gateway
    adds), else the only one, else none."""
    for tool in tools:
        if tool.name == DELEGATE_TOOL:
            return tool
    declared = [tool for tool in tools if tool.client]
    if len(declared) == 1:
        return declared[0]
    return tools[0] if len(tools) == 1 else None
