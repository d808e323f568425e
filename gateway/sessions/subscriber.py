"""The seam between a session's event source and the client connections that read it.

A connection (``gateway.edge.connection``) reads a session from one of two
sources on its node: the ``SessionRuntime`` that drives it (a
``DrivenSession`` to the connection, which also sends it commands and
audio), or a ``LogFollower`` that tails the log of a session driven
elsewhere (a ``FollowedSession``). Both call down to their subscribers
through ``Subscriber`` and never through a class, so sessions code knows
nothing of WebSockets, and the edge names no session class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.sessions.commands import SessionCommands
from gateway.store.base import LogEntry
from gateway.upstream.base import VoiceConfig
from protocol.events import Error

__all__ = ["DrivenSession", "EventSource", "FollowedSession", "Subscriber"]


class EventSource(Protocol):
    """Where a subscriber's events come from."""

    def attach(self, sub: Subscriber) -> None: ...

    def detach(self, sub: Subscriber) -> None: ...


class DrivenSession(SessionCommands, EventSource, Protocol):
    """A session this node drives, as a client connection uses it: its commands,
    its events (attach), its voice input, where its log stands."""

    @property
    def sid(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def provider(self) -> str:
        """The provider its upstream uses now (the first frame names it)."""
        ...

    @property
    def voice(self) -> VoiceConfig | None: ...

    def send_audio_now(self, pcm16: bytes) -> bool:
        """The user's audio handed on without awaiting; False (a closed session, or a
        socket that cannot take it now): use ``send_audio``."""
        ...

    async def send_audio(self, pcm16: bytes) -> None: ...


class FollowedSession(EventSource, Protocol):
    """A session driven by another node, tailed from its log here."""


class Subscriber(Protocol):
    """A client connection attached to a session."""

    def deliver(self, entries: Sequence[LogEntry]) -> None:
        """Logged events, in seq order. Must not block."""

    def notify(self, event: Error) -> None:
        """An unlogged notice for this client (store outage). Must not block."""

    def deliver_audio(self, frame: bytes) -> None:
        """A binary frame of the model's speech (``protocol.audio``), unlogged. Must not
        block; a client that is behind may miss it (it has the transcript)."""

    def session_lost(self, reason: str) -> None:
        """This node stopped driving the session; the client should reconnect."""

    def switch_source(self, session: DrivenSession) -> None:
        """This node took the session over: the subscriber reads and commands ``session`` now."""
