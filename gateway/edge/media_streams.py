"""The port to the phone calls: all the edge asks of carriers' media streams.

A carrier's media stream (``/v1/phone/CARRIER``) is a client of a voice
session, driven by the phone room (``gateway.phone.edge.PhoneEdge``), which
needs the node itself (a call drives its session's runtime). The edge sees
that room only through ``MediaStreams``, as it sees the node only through
``gateway.sessions.port.NodePort``: ``gateway.app``, which holds both, hands
the server a ``MediaStreamsFactory`` (the phone room needs the server's
``Edges``: connection counts, pending handshakes, token secrets).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from aiohttp import web
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from gateway.edge.admission import Edges

__all__ = ["MediaStreams", "MediaStreamsFactory", "WebHandler"]

WebHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MediaStreams(Protocol):
    """The phone calls of a node, as the WebSocket server and the HTTP API use them."""

    def handles(self, path: str) -> bool:
        """Whether a request of ``path`` is a media stream's (the phone room's to check)."""
        ...

    async def handshake(self, connection: ServerConnection, request: Request) -> Response | None:
        """Accept a carrier's upgrade request (None) or the refusal to send."""
        ...

    def owns(self, ws: ServerConnection) -> bool:
        """Whether ``ws`` is a media stream ``handshake`` accepted."""
        ...

    async def serve(self, ws: ServerConnection) -> None: ...

    async def drain(self, timeout: float) -> None:
        """Let the calls go on until they end or ``timeout`` passes; then end the rest."""
        ...

    async def close(self) -> None: ...

    async def mint_stream_token(
        self, owner: str, *, sid: str, call: str, ttl: float | None
    ) -> tuple[str, float]:
        """A one-time stream token for ``owner``'s call, and its expiry (unix s)."""
        ...

    @property
    def webhooks(self) -> Mapping[str, WebHandler]:
        """The HTTP API's ``POST`` routes of the phone (a carrier's voice webhook)."""
        ...


MediaStreamsFactory = Callable[[Edges], MediaStreams]
