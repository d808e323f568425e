"""The seam between a session's event source and the client connections that read it.

A connection (``gateway.edge.connection``) reads a session from one of two
sources on its node: the ``SessionRuntime`` that drives it, or a
``LogFollower`` that tails the log of a session driven elsewhere. Both call
down to their subscribers through this Protocol and never through a class,
so sessions code knows nothing of WebSockets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.store.base import LogEntry
from protocol.events import Error

__all__ = ["EventSource", "Subscriber"]


class EventSource(Protocol):
    """Where a subscriber's events come from."""

    def attach(self, sub: Subscriber) -> None: ...

    def detach(self, sub: Subscriber) -> None: ...


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

    def switch_source(self, source: EventSource) -> None:
        """This node took the session over: the subscriber reads ``source`` now."""
