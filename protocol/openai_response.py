"""``response.create``'s per-response overrides on the OpenAI door. Pure.

The gateway's session has one configuration; a response that asks for other
``instructions``, ``tools``, ``tool_choice: "none"`` or ``output_modalities``
gets them as a ``configure`` sent before its turn's user message, and the
session's own values back (another ``configure``) once that response is done:
a ``configure`` takes effect at the next model step, so exactly the response
asked for runs with them (a step is one OpenAI response), whatever the
provider. Both are named ``~…`` so the door does not show them as
``session.updated`` (the client changed no session). ``metadata`` is echoed
on the response the create asked for and on no other (LiveKit's plugin discards
a response that echoes a create it gave up on); a create cancelled before its
first word still gets its response, created and then done as cancelled. What a
gateway cannot honour for one response is refused by name, saying what to do
instead. ``ShownResponse``: the response a conversation is streaming.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from protocol.configuration import SessionConfig
from protocol.events import Configure
from protocol.openai_events import SessionBody
from protocol.openai_session import config_change

__all__ = [
    "HIDDEN",
    "OVERRIDE",
    "TOKEN_REFUSAL",
    "Overrides",
    "ResponseOverrides",
    "ShownResponse",
    "changes_nothing",
    "response_overrides",
    "restore_of",
]

HIDDEN: Final = "~"
"""The prefix of the ids of the door's own configures (not shown as ``session.updated``)."""
OVERRIDE: Final = HIDDEN + "override"
RESTORE: Final = HIDDEN + "restore"

TOKEN_REFUSAL: Final = (
    "this connection uses a client token, which may not change its session's "
    "configuration, for one response either: leave response.instructions, tools, "
    "tool_choice and output_modalities unset (the app's backend sets the session up)"
)

_REFUSED: Final = {
    "audio": "response.audio (the voice) is not set per response on this gateway: set "
    "session.audio.output with session.update",
    "prompt": "response.prompt is not supported by this gateway: put the text in "
    "response.instructions",
    "reasoning": "response.reasoning is not set per response on this gateway: leave it unset",
    "parallel_tool_calls": "response.parallel_tool_calls is not supported by this gateway "
    "(the model's calls of one step run as one batch): leave it unset",
    "input": "response.input (a context of the response's own) is not supported by this "
    "gateway: the model answers from the session's conversation; delete what it should not "
    "see (conversation.item.delete), or open another session for it",
}


class Overrides(msgspec.Struct, frozen=True):
    """One response's overrides: the ``configure`` before it (None: none; ``restore_of``
    makes the one after it), and the metadata it echoes."""

    change: Configure | None = None
    metadata: dict[str, str] | None = None


def response_overrides(body: dict[str, Any]) -> Overrides | tuple[str, str]:
    """``response.create``'s ``response`` as ``Overrides``, or ``(refusal, param)``."""
    for name in sorted(body):
        if name in _REFUSED and body[name] is not None:
            return _REFUSED[name], f"response.{name}"
    conversation = body.get("conversation")
    if conversation not in (None, "auto"):
        return (
            "out-of-band responses (response.conversation other than 'auto') are not "
            "supported by this gateway: every response joins the session's conversation; "
            "open another session for an answer outside it",
            "response.conversation",
        )
    if body.get("max_output_tokens") not in (None, "inf"):
        return (
            "this gateway does not cap one response's tokens: leave "
            "response.max_output_tokens unset (or 'inf'), and ask for a short answer in "
            "response.instructions",
            "response.max_output_tokens",
        )
    metadata = body.get("metadata")
    if metadata is not None and not _metadata_ok(metadata):
        return (
            "response.metadata takes at most 16 string values, keys of at most 64 "
            "characters and values of at most 512",
            "response.metadata",
        )
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        return (
            "this gateway cannot make the model call a tool: response.tool_choice takes "
            "'auto' or 'none'; ask for the call in response.instructions",
            "response.tool_choice",
        )
    fields = {
        name: body[name]
        for name in ("instructions", "tools", "output_modalities")
        if body.get(name) is not None
    }
    if choice == "none":
        fields["tools"] = []  # no tool for the model to call in this response
    if not fields:
        return Overrides(metadata=metadata)
    try:
        change = config_change(
            msgspec.convert({**fields, "type": "realtime"}, SessionBody), model_route=None
        )
    except msgspec.ValidationError as exc:
        change = f"invalid response: {exc}"
    if isinstance(change, str):
        return change.replace("session.", "response."), "response"
    return Overrides(msgspec.structs.replace(change, id=OVERRIDE), metadata)


def changes_nothing(change: Configure, session: SessionConfig | None) -> bool:
    """``change`` asks for what ``session`` already has (pipecat sends its session's
    ``output_modalities`` with every response.create): not an override at all."""
    return session is not None and all(
        getattr(change, name) in (msgspec.UNSET, getattr(session, name))
        for name in ("instructions", "tools", "output")
    )


def restore_of(change: Configure, session: SessionConfig | None) -> Configure:
    """The session's own values (as it is now: a ``session.update`` sent with the
    response may have changed it since) of what ``change`` set."""
    session = session or SessionConfig()
    back: dict[str, Any] = {}
    if change.instructions is not msgspec.UNSET:
        back["instructions"] = session.instructions
    if change.tools is not msgspec.UNSET:
        back["tools"] = session.tools
    if change.output is not msgspec.UNSET:
        back["output"] = session.output
    return Configure(**back, id=RESTORE)


class ResponseOverrides:
    """One connection's overrides as they go (``Conversation`` holds one): the session's
    configuration as its client set it, the override of the response in flight and the
    session's configuration as it came, the metadata the next response echoes, whether a
    response.create is owed its response (``owed``), and the configures to send now
    (``due``)."""

    __slots__ = ("_before", "_override", "allowed", "config", "due", "metadata", "owed")

    def __init__(self) -> None:
        # A client token may not change its session's configuration, for one response either.
        self.allowed = True
        self.config: SessionConfig | None = None
        self.metadata: dict[str, str] | None = None
        self.owed = False
        self.due: list[Configure] = []
        self._override: Configure | None = None
        self._before: SessionConfig | None = None

    def start(self, change: Configure) -> None:
        """A response with ``change`` is asked for: its values go back once it is done."""
        self._override = change

    def configured(self, config: SessionConfig, ref: str | msgspec.UnsetType) -> bool:
        """A logged ``configured``; True when it is the door's own (not shown)."""
        if not (isinstance(ref, str) and ref.startswith(HIDDEN)):
            self.config = config
            return False
        if ref == OVERRIDE:
            self._before = self.config  # the session's own, as the override came
        else:
            self.config = config  # the session's own again
        return True

    def ask(self, metadata: dict[str, str] | None) -> None:
        """A response.create asked for a response: it is owed the client (created, then
        done, even if cancelled before its first word), with this metadata."""
        self.metadata, self.owed = metadata, True

    def shown(self) -> dict[str, str] | None:
        """A response is shown: it takes the metadata (no later one echoes it)."""
        metadata, self.metadata, self.owed = self.metadata, None, False
        return metadata

    def unask(self) -> None:
        """No response is owed any more (its turn is over, or its create's message was
        refused): the metadata goes nowhere, rather than onto a later response."""
        self.metadata, self.owed = None, False

    def put_back(self) -> None:
        """The response is done (or never started): the session's own values go back."""
        if self._override is not None:
            self.due.append(restore_of(self._override, self._before or self.config))
            self._override = self._before = None


def _metadata_ok(metadata: Any) -> bool:
    return (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        )
    )


class ShownResponse:
    """The response a conversation streams to its client: its id, its items so far, its
    open message (``protocol.openai_conversation``)."""

    __slots__ = ("audio", "first", "id", "last", "message", "metadata", "output", "text")

    def __init__(self, rid: str) -> None:
        self.id = rid
        self.audio = False  # audio of its open message was sent
        self.output: list[dict[str, Any]] = []
        self.message: str | None = None  # the open message item's id
        self.text: list[str] = []
        self.first = self.last = 0  # seqs of the open message's first and last chunks
        self.metadata: dict[str, str] | None = None  # response.create's, echoed
