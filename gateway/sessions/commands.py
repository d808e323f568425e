"""The commands a session takes from its clients: one table, one dispatch.

Every client message is either a command for the session (this table) or
something the connection answers itself (``CONNECTION_MESSAGES``: a ping,
audio). A command is run the same way wherever it comes from — a client
on the driving node (``gateway.edge.connection``) or one on another node
whose command was forwarded (``gateway.sessions.control``) — by
``dispatch(message, target)`` over the small ``SessionCommands`` Protocol
the runtime implements. What the edge and the relay need to know of a
command (how clients name it, which logged event shows it took effect,
whether it may run on another node, who may send it) is its row here.

To add a command: its message in ``protocol.events`` (the client
vocabulary), what it does in the machine or the runtime, its row below,
and the clients; a message in ``ClientMessage`` with no row and no place in
``CONNECTION_MESSAGES`` fails ``tests/sessions/test_commands.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from protocol.configuration import ConfigChange
from protocol.events import (
    Approve,
    AudioChunk,
    Cancel,
    Cancelled,
    Commit,
    Configure,
    Configured,
    Error,
    Event,
    Ping,
    Played,
    ToolResultMessage,
    User,
    UserMessage,
)

__all__ = [
    "COMMANDS",
    "CONNECTION_MESSAGES",
    "FORWARDED",
    "CommandSpec",
    "SessionCommands",
    "dispatch",
]


class SessionCommands(Protocol):
    """What a session does with its clients' commands (``SessionRuntime``)."""

    def start_turn(self, text: str) -> Error | None: ...

    def cancel_turn(self) -> Error | None: ...

    def tool_result(self, answer: ToolResultMessage) -> Error | None: ...

    async def configure(self, change: ConfigChange) -> Error | None: ...

    def commit_audio(self) -> Error | None: ...

    def approve(self, decision: Approve) -> Error | None: ...

    def played(self, report: Played) -> Error | None: ...

    def heard(self, message: Any, refused: Error | None) -> None:
        """A command was run (``refused``: the error it got): the session may record it."""


async def _start(target: SessionCommands, message: Any) -> Error | None:
    return target.start_turn(message.content)


async def _cancel(target: SessionCommands, message: Any) -> Error | None:
    return target.cancel_turn()


async def _tool_result(target: SessionCommands, message: Any) -> Error | None:
    return target.tool_result(message)


async def _configure(target: SessionCommands, message: Any) -> Error | None:
    return await target.configure(message)


async def _approve(target: SessionCommands, message: Any) -> Error | None:
    return target.approve(message)


async def _commit(target: SessionCommands, message: Any) -> Error | None:
    return target.commit_audio()


async def _played(target: SessionCommands, message: Any) -> Error | None:
    return target.played(message)


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One command.

    - ``what``: how the client names it in messages (its ``type``);
    - ``run``: what it does to the session (``dispatch``);
    - ``landmark``: the logged event that shows it took effect (a forwarded
      command is "taken" once it is in the log); None: taken once the
      driver's machine accepted it;
    - ``forwarded``: it may run on the node driving the session when that
      is another one; voice commands run where the microphone is;
    - ``trusted``: only a connection with an API key may send it (a client
      token may not change the session's configuration);
    - ``approving``: only a connection allowed to approve may send it (an API
      key, or a client token minted with the ``approve`` right);
    - ``records``: it stores a session made by this connection at its first use;
    - ``turn``: it starts a turn (per-key turn limits and draining apply).
    """

    what: str
    run: Callable[[SessionCommands, Any], Awaitable[Error | None]]
    landmark: type[Event] | None = None
    forwarded: bool = True
    trusted: bool = False
    approving: bool = False
    records: bool = False
    turn: bool = False


COMMANDS: Final[dict[type, CommandSpec]] = {
    UserMessage: CommandSpec("message", _start, landmark=User, records=True, turn=True),
    Cancel: CommandSpec("cancel", _cancel, landmark=Cancelled),
    ToolResultMessage: CommandSpec("tool_result", _tool_result),
    Configure: CommandSpec(
        "configure", _configure, landmark=Configured, trusted=True, records=True
    ),
    Commit: CommandSpec("commit", _commit, forwarded=False),
    Played: CommandSpec("played", _played),
    Approve: CommandSpec("approve", _approve, approving=True),
}
"""Every command, by its message type."""

CONNECTION_MESSAGES: Final = (Ping, AudioChunk)
"""Client messages the connection answers itself (not commands of the session)."""

FORWARDED: Final = tuple(kind for kind, spec in COMMANDS.items() if spec.forwarded)
"""The message types a node forwards to the one driving the session."""


async def dispatch(message: Any, target: SessionCommands) -> Error | None:
    """Run a command on ``target``; its refusal (an ``error`` for the client), if any.

    Every command goes through here, whichever node it came to, so this is where
    a recording session hears its clients (``heard``): a new command is recorded
    with no change beyond its row.
    """
    refused = await COMMANDS[type(message)].run(target, message)
    target.heard(message, refused)
    return refused
