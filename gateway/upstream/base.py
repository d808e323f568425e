"""The interface every upstream adapter (OpenAI Realtime, Gemini Live) implements.

The session loop drives one adapter per session and reads its events with
``recv()`` from a single task: no reader task, no queue between the socket and
the parser, so a token costs one decode and one parser feed. Adapters translate
their provider's wire events into the four ``UpstreamEvent`` kinds below and
nothing else; provider details (item ids, event ids, setup handshakes) stay
inside the adapter.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from protocol.assembly import Message
from protocol.events import Usage

__all__ = [
    "AdapterFactory",
    "ResponseDone",
    "TextDelta",
    "Upstream",
    "UpstreamClosed",
    "UpstreamError",
    "UpstreamEvent",
    "UpstreamFactory",
]


class TextDelta(msgspec.Struct, frozen=True):
    """A piece of the model's text for the running response."""

    text: str


class ResponseDone(msgspec.Struct, frozen=True):
    """The running response finished.

    ``status`` is ``completed``, ``cancelled``, ``failed`` or ``incomplete``;
    ``usage`` the response's token counts when the provider reports them, or
    the adapter's estimate (then ``estimated``) when it stopped waiting for
    them: every response's usage is counted, also of a cancelled one.
    """

    status: str
    usage: Usage | None = None
    detail: str = ""
    estimated: bool = False


class UpstreamError(msgspec.Struct, frozen=True):
    """The provider reported an error that did not end the connection."""

    code: str
    message: str


UpstreamEvent = TextDelta | ResponseDone | UpstreamError


class UpstreamClosed(Exception):
    """The upstream connection is gone (dropped, closed by the provider, time limit).

    The session reconnects with context rebuilt from history; ``reason`` is for logs.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Upstream(abc.ABC):
    """One upstream realtime session (one WebSocket to the provider)."""

    provider: str = "upstream"

    @abc.abstractmethod
    async def open(self, instructions: str, history: Sequence[Message]) -> None:
        """Connect, configure text output with ``instructions``, and load ``history``.

        Raises ``UpstreamClosed`` when the provider cannot be reached or refuses.
        """

    @abc.abstractmethod
    async def add_message(self, message: Message) -> None:
        """Append a message (user text, ``<results>``) to the upstream conversation."""

    @abc.abstractmethod
    async def start_response(self) -> None:
        """Ask the model for a response; its text arrives as ``TextDelta`` events."""

    @abc.abstractmethod
    async def cancel_response(self) -> None:
        """Ask the provider to stop the running response; a ``ResponseDone`` follows."""

    @abc.abstractmethod
    async def replace_response(self, text: str) -> None:
        """After a response ended early, make the conversation hold ``text`` as its output.

        Called after ``</execute>`` stopped a response: the model may have written
        past the marker before the cancel arrived, and that overrun must not stay
        in its context. ``text`` is what the parser accepted, re-assembled.
        """

    @abc.abstractmethod
    async def recv(self) -> UpstreamEvent:
        """The next event. Raises ``UpstreamClosed`` when the connection is gone."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection (idempotent)."""


class UpstreamFactory(abc.ABC):
    """Makes a fresh, unopened ``Upstream`` for a session (one per connection attempt)."""

    provider: str = "upstream"

    @abc.abstractmethod
    def create(self) -> Upstream: ...


class AdapterFactory(UpstreamFactory):
    """Makes adapters of one class, all with the same settings (keyword arguments)."""

    def __init__(self, adapter: Callable[..., Upstream], provider: str, **settings: Any) -> None:
        self._adapter = adapter
        self.provider = provider
        self._settings = settings

    def create(self) -> Upstream:
        return self._adapter(**self._settings)
