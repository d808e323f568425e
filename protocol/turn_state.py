"""Where a session's turn is: the states of ``protocol.turn.TurnMachine``.

Its own module so the machine's rooms (``protocol.turn``, ``protocol.turn_tools``,
``protocol.turn_voice``) share one definition, and the constant actions they return without allocating.
"""

from __future__ import annotations

import enum
from typing import Final

from protocol.turn_events import Request

__all__ = [
    "BACKOFF",
    "BEFORE_BATCH",
    "CANCELLING",
    "ENDING",
    "IDLE",
    "MALFORMED_LIMIT",
    "NOTHING",
    "RETRY",
    "STOPPING",
    "STREAMING",
    "TOOLS",
    "TurnState",
]


class TurnState(enum.Enum):
    """Where the session's turn is."""

    # Members are singletons: hashing by identity (in C) keeps ``feed``'s table lookup
    # cheap (Enum's own ``__hash__`` is a Python call: ~300 ns per feed).
    __hash__ = object.__hash__

    IDLE = "idle"
    """No turn runs; a user message starts one."""
    STREAMING = "streaming"
    """A response was requested; its deltas go through the parser to the client."""
    STOPPING = "stopping"
    """The parser stopped at ``</execute>`` (or a malformed block): waiting for the response's end."""
    ENDING = "ending"
    """The model wrote ``<end>`` (``end`` is sent): waiting for the usage. A message queues."""
    TOOLS = "tools"
    """The batch runs; waiting for ``ToolsDone`` and for every client-side call's result."""
    BACKOFF = "backoff"
    """The upstream was lost mid-step; waiting for ``RetryNow`` to rerun the step."""
    CANCELLING = "cancelling"
    """``cancelled`` is sent; waiting for the stopped response's usage. A message queues."""


# The states as module constants: the machine's rooms compare ``self.state is IDLE``
# against a module global, not an enum attribute looked up each time.
IDLE: Final = TurnState.IDLE
STREAMING: Final = TurnState.STREAMING
STOPPING: Final = TurnState.STOPPING
ENDING: Final = TurnState.ENDING
TOOLS: Final = TurnState.TOOLS
BACKOFF: Final = TurnState.BACKOFF
CANCELLING: Final = TurnState.CANCELLING
# Where a client may already answer a call it was sent: the batch has not run yet.
BEFORE_BATCH: Final = frozenset((TurnState.STREAMING, TurnState.STOPPING))

# The constant actions, made once: the machine returns them without allocating.
RETRY: Final = Request()
NOTHING: Final[tuple[()]] = ()
MALFORMED_LIMIT: Final = 3  # malformed <execute> blocks in a row that stop the turn
