"""The commands a session takes from its clients: one table of specs, one dispatch.

Every client message is either a command for the session (this table) or
something the connection answers itself (``CONNECTION_MESSAGES``: a ping,
audio). A command is run the same way wherever it comes from — a client
on the driving node (``gateway.edge.connection``) or one on another node
whose command was forwarded (``gateway.sessions.control``) — by
``dispatch(message, session)``. Its spec says all the rest: what it feeds
the session's turn machine, whether it interrupts what the driver awaits,
who may send it (``admit``, the checks every connection runs before it
runs or forwards a command), which logged event shows it took effect.

Replies name their command: a command's ``id`` (the call's id for
``tool_result`` and ``approve``) comes back as ``reply_to`` on the
``error`` that refuses it and on its ``confirms`` event.

To add a command: its message in ``protocol.events`` (the client
vocabulary: ``TurnCommand``), what the machine does with it (``protocol.turn``)
and its row in ``protocol.turn_table``, its row below, and the clients; a
message in ``ClientMessage`` with no row and no place in
``CONNECTION_MESSAGES`` fails ``tests/sessions/test_commands.py``
(docs/architecture.md's recipe; ``tests/house/test_command_recipe.py`` tries it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, cast

import msgspec

from gateway.upstream.base import VoiceConfig
from protocol.configuration import ConfigChange
from protocol.events import (
    Approval,
    Approve,
    AudioChunk,
    AudioCleared,
    Cancel,
    Cancelled,
    ClearAudio,
    Commit,
    Configure,
    Configured,
    ContextMessage,
    Error,
    Event,
    Forget,
    Forgotten,
    Ping,
    Played,
    Replying,
    ReplyNow,
    ToolResultMessage,
    User,
    UserMessage,
    answering,
)
from protocol.turn_events import Action, TurnInput
from tools.output import cap_output

__all__ = [
    "COMMANDS",
    "CONNECTION_MESSAGES",
    "FORWARDED",
    "CommandSpec",
    "Sender",
    "SessionCommands",
    "admit",
    "dispatch",
    "run",
]

CLOSING: Final = "session is closing; reconnect and resend"


class SessionCommands(Protocol):
    """What a session does with its clients' commands (``SessionRuntime``)."""

    @property
    def closed(self) -> bool: ...

    @property
    def voice(self) -> VoiceConfig | None: ...

    @property
    def tool_max_output(self) -> int: ...

    def feed(self, given: TurnInput) -> Sequence[Action]:
        """The turn machine's actions for ``given`` (not performed yet)."""
        ...

    def perform(self, actions: Sequence[Action], *, interrupt: bool) -> Error | None:
        """Hand actions to the driver; the machine's refusal among them, if any."""
        ...

    async def configure(self, change: ConfigChange) -> Error | None: ...

    def forget(self, message: Forget) -> Error | None:
        """Take logged messages out of what the model sees (``forgotten``), or why not."""
        ...

    async def clear_audio(self) -> Error | None:
        """Discard the user's audio not yet committed, or why not."""
        ...

    def heard(self, message: Any, refused: Error | None) -> None:
        """A command was run (``refused``: the error it got): the session may record it."""

    async def screen(self, message: Any) -> Any:
        """A user's message or a tool's result as the session's HTTP checker rules leave
        it (awaited before it reaches the model); None: blocked (the client was told)."""
        ...


class Sender(Protocol):
    """The connection a command came from, as ``admit`` checks it."""

    @property
    def trusted(self) -> bool:
        """It presented an API key (not a client token)."""
        ...

    @property
    def may_approve(self) -> bool: ...

    @property
    def draining(self) -> bool:
        """Its node is shutting down."""
        ...

    async def admit_turn(self) -> Error | None:
        """The key's turn limits (``gateway.sessions.limits``): a refusal, or None."""
        ...

    async def record(self) -> Error | None:
        """Store the session if it is new (its first turn or configure); why not, or None."""
        ...


# --- what each command feeds the machine ---------------------------------------
# A feed returns the machine's input, or the refusal of a command the machine
# must not see.


def _message(
    message: UserMessage | ReplyNow | ContextMessage, session: SessionCommands
) -> TurnInput | Error:
    # After the model's <end> or a cancel the turn only waits for its usage: a
    # message sent then starts right after it (the machine queues it).
    return Error(code="internal", content=CLOSING) if session.closed else message


def _as_is(message: TurnInput, session: SessionCommands) -> TurnInput | Error:
    return message


def _tool_result(message: ToolResultMessage, session: SessionCommands) -> TurnInput | Error:
    # A client tool's answer is cut to the node's tool_max_output, like a server tool's.
    content = cap_output(message.content, session.tool_max_output)
    return msgspec.structs.replace(message, content=content)


def _commit(message: Commit, session: SessionCommands) -> TurnInput | Error:
    audio = session.voice.audio_in if session.voice is not None else None
    if audio is None or audio.turn_detection != "none":
        return Error(
            code="bad_frame",
            content='commit ends a spoken turn when input_audio.turn_detection is "none"; '
            'configure that first (with "server_vad" the gateway commits by itself)',
        )
    return message


Who = Literal["anyone", "api_key", "approver"]


class _Confirmation(Protocol):
    """An event that confirms a command names it: the command's ``id`` as ``reply_to``."""

    reply_to: str | msgspec.UnsetType


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One command.

    - ``what``: how the client names it in messages (its ``type``);
    - ``feeds``: what it feeds the turn machine (or the refusal of a command
      the machine must not see); None: ``configure`` and ``forget``, which the
      session applies;
    - ``interrupts``: the driver's current await is broken for it (a cancel);
    - ``who``: who may send it (``admit``): ``api_key``: only a connection
      with an API key (a client token may not change the configuration);
      ``approver``: a connection allowed to approve (an API key, or a client
      token minted with the ``approve`` right);
    - ``confirms``: the logged event that shows it took effect, which carries
      the command's ``id`` as ``reply_to``; a forwarded command is "taken"
      once it is in the log; None: taken once the driver's machine accepted it;
    - ``forwarded``: it may run on the node driving the session when that
      is another one; voice commands run where the microphone is;
    - ``records``: it stores a session made by this connection at its first use;
    - ``answer``: the unlogged event the connection answers it with once it ran;
    - ``turn``: it starts a turn (per-key turn limits and draining apply);
    - ``drains``: refused while the node drains, as a turn is (what it adds to the
      conversation would wait on a node that is going).
    """

    what: str
    feeds: Callable[[Any, SessionCommands], TurnInput | Error] | None
    interrupts: bool = False
    who: Who = "anyone"
    confirms: type[Event] | None = None
    forwarded: bool = True
    records: bool = False
    turn: bool = False
    drains: bool = False
    answer: type[AudioCleared] | None = None

    def __post_init__(self) -> None:
        if self.confirms is not None and "reply_to" not in self.confirms.__struct_fields__:
            raise TypeError(
                f"{self.what} is confirmed by {self.confirms.__name__}: give it reply_to"
            )

    @property
    def landmark(self) -> type[Event] | None:
        """The event a forwarding node waits for (``confirms``, but not an approval:
        an ``approve`` is taken once the machine holds it)."""
        return None if self.confirms is Approval else self.confirms


COMMANDS: Final[dict[type, CommandSpec]] = {
    UserMessage: CommandSpec("message", _message, confirms=User, records=True, turn=True),
    ReplyNow: CommandSpec("reply", _message, confirms=Replying, records=True, turn=True),
    # Confirmed by the machine taking it, not its event: one sent while the model answers
    # is logged when the answer is written, which a forwarding node would not wait for.
    ContextMessage: CommandSpec("context", _message, records=True, drains=True),
    Cancel: CommandSpec("cancel", _as_is, interrupts=True, confirms=Cancelled),
    ToolResultMessage: CommandSpec("tool_result", _tool_result),
    Configure: CommandSpec("configure", None, who="api_key", confirms=Configured, records=True),
    Commit: CommandSpec("commit", _commit, forwarded=False),
    Played: CommandSpec("played", _as_is),
    Approve: CommandSpec("approve", _as_is, who="approver", confirms=Approval),
    Forget: CommandSpec("forget", None, confirms=Forgotten),
    ClearAudio: CommandSpec("clear_audio", None, forwarded=False, answer=AudioCleared),
}
"""Every command, by its message type."""

_SCREENED: Final = (UserMessage, ContextMessage, ToolResultMessage)
"""What the session's HTTP checkers read before the machine does (``SessionCommands.screen``)."""

CONNECTION_MESSAGES: Final = (Ping, AudioChunk)
"""Client messages the connection answers itself (not commands of the session)."""

FORWARDED: Final = tuple(kind for kind, spec in COMMANDS.items() if spec.forwarded)
"""The message types a node forwards to the one driving the session."""


_FORBIDDEN: Final[dict[Who, str]] = {
    "api_key": "a client token cannot send {what}: it may not change the session's "
    "configuration; the app's backend sets it (POST /v1/sessions) or connects with its API key",
    "approver": "this connection may not approve calls: approve with the API key, "
    'or with a client token minted with "rights": ["approve"] (POST /v1/sessions/ID/tokens)',
}
_KEY_ROLES: Final = frozenset({"system", "assistant"})
"""The ``context`` roles only an API key may add: a ``system`` message instructs the model
as the session's instructions do (a client token may not change those), an ``assistant``
one speaks for the model (a page could forge its earlier answers and calls)."""
_DRAINING: Final = (
    "this gateway node is shutting down; reconnect (with session_id and after=SEQ) to reach "
    "another node and send the message again"
)


async def admit(message: Any, sender: Sender) -> Error | None:
    """Whether ``sender`` may send this command now: its refusal (``reply_to`` set), or None.

    Run where the client is connected, before the command runs or is forwarded
    (the driving node trusts the origin's check).
    """
    spec = COMMANDS[type(message)]
    speaks_for = type(message) is ContextMessage and message.role in _KEY_ROLES
    who: Who = "api_key" if speaks_for else spec.who
    allowed = {"anyone": True, "api_key": sender.trusted, "approver": sender.may_approve}
    refusal: Error | None = None
    if not allowed[who]:
        what = f"a {message.role} message" if speaks_for else spec.what
        refusal = Error(code="forbidden", content=_FORBIDDEN[who].format(what=what))
    elif (spec.turn or spec.drains) and sender.draining:
        refusal = Error(code="draining", content=_DRAINING)
    elif spec.records:
        refusal = await sender.record()
    if refusal is None and spec.turn:
        refusal = await sender.admit_turn()
    return None if refusal is None else answering(refusal, message)


def run(message: Any, session: SessionCommands) -> Error | None:
    """Feed a command (not ``configure``) to the session's machine; its refusal, if any.

    Also the way in for commands that are no client's (a phone call's greeting,
    keypad and playback): they are not ``heard``.
    """
    spec = COMMANDS[type(message)]
    assert spec.feeds is not None, f"{spec.what} is applied, not fed: use dispatch"
    given = spec.feeds(message, session)
    if isinstance(given, Error):
        return answering(given, message)
    actions = session.feed(given)
    ref = getattr(message, "id", msgspec.UNSET)
    if spec.confirms is not None and isinstance(ref, str):
        for action in actions:
            if type(action) is spec.confirms:
                cast(_Confirmation, action).reply_to = ref  # CommandSpec checked it has one
                break
    refused = session.perform(actions, interrupt=spec.interrupts)
    return None if refused is None else answering(refused, message)


async def dispatch(message: Any, session: SessionCommands) -> Error | None:
    """Run a command on ``session``; its refusal (an ``error`` for the client), if any.

    Every client's command goes through here, whichever node it came to, so
    this is where a recording session hears its clients (``heard``): a new
    command is recorded with no change beyond its row.
    """
    if type(message) is Configure:
        refused = await session.configure(message)
        refused = None if refused is None else answering(refused, message)
    elif type(message) is Forget:
        refused = session.forget(message)
        refused = None if refused is None else answering(refused, message)
    elif type(message) is ClearAudio:
        refused = await session.clear_audio()
        refused = None if refused is None else answering(refused, message)
    else:
        if type(message) in _SCREENED:
            message = await session.screen(message)
            if message is None:
                return None  # blocked: the guardrail event tells the client
        refused = run(message, session)
    session.heard(message, refused)
    return refused
