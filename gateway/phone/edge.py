"""The phone calls of a node: media-stream handshakes, the calls, their drain.

The gateway's server hands this edge every request under ``/v1/phone/``
(``gateway.edge.server``): ``handshake`` refuses what must be refused
before the WebSocket opens (no such carrier, the node full, a signature
that does not check out), ``serve`` runs an accepted stream as a call
(``gateway.phone.call``).

**Drain.** A carrier never moves a call's media stream to another node:
the call lives and dies with its socket. So a draining node (``SIGTERM``)
keeps its calls until they end, or until ``drain_phone_timeout`` passes,
then closes the rest (1001; the carrier ends those calls). The load
balancer's readiness check (``/readyz``, 503 while draining) already sends
new calls elsewhere. A node that dies ends its calls at once; their
sessions stay in the store (history, transcript, cost) for the app to read,
or to call back with.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
import weakref
from collections.abc import Mapping
from typing import Final
from urllib.parse import parse_qs

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from gateway.edge.admission import Edges
from gateway.edge.auth import ANONYMOUS
from gateway.edge.http_requests import split_target
from gateway.edge.media_streams import WebHandler
from gateway.phone.admission import StreamTokens, check_signature
from gateway.phone.call import CallServices, PhoneCallConnection
from gateway.phone.carriers import CARRIERS, PHONE_PREFIX, Carrier, by_path
from gateway.phone.control import PhoneControl
from gateway.phone.metrics import PhoneMetrics
from gateway.phone.opening import Opening
from gateway.phone.plans import CallPlans
from gateway.phone.webhook import TWIML_PATH, VoiceWebhook
from gateway.sessions.node import Node

__all__ = ["PhoneEdge"]

log = logging.getLogger("gateway.phone")

_GOING_AWAY: Final = 1001


class PhoneEdge:
    """The phone side of one node (see the module docstring): the server's
    ``gateway.edge.media_streams.MediaStreams``."""

    def __init__(self, node: Node, edges: Edges, control: PhoneControl) -> None:
        settings = node.config.phone
        self.config = node.config
        self.settings = settings
        self.edges = edges
        self.control = control
        self.metrics = PhoneMetrics(node.metrics.registry)
        # Without API keys every session is the anonymous key's; calls too, by default.
        owner = settings.key or (ANONYMOUS if not edges.auth_on else "phone")
        self.plans = CallPlans(settings.numbers_file, owner)
        self.tokens = StreamTokens(edges.tokens.secrets, node.store, settings.token_ttl)
        self.services = CallServices(
            opening=Opening(
                host=node,
                settings=settings,
                plans=self.plans,
                tokens=self.tokens,
                lease_ttl=node.config.lease_ttl,
                live=control.calls,
            ),
            metrics=self.metrics,
            calls=control.calls,
            settle=lambda ws: edges.pending.settled(ws.transport),
        )
        webhook = VoiceWebhook(
            settings, self.plans, self.tokens, edges.pending, self.config.body_timeout
        )
        self.webhooks: Mapping[str, WebHandler] = {TWIML_PATH: webhook.voice}
        self.streams: dict[PhoneCallConnection, asyncio.Event] = {}  # set when its call ended
        # Handshakes accepted, waiting for their handler: (carrier, signed, URL token).
        self._accepted: weakref.WeakKeyDictionary[ServerConnection, tuple[Carrier, bool, str]] = (
            weakref.WeakKeyDictionary()
        )

    @staticmethod
    def handles(path: str) -> bool:
        return path.startswith(PHONE_PREFIX)

    async def handshake(self, connection: ServerConnection, request: Request) -> Response | None:
        """Accept a carrier's upgrade request (None) or the refusal to send."""
        path, query = split_target(request.path)
        carrier = by_path(path)
        if carrier is None:
            names = ", ".join(c.path for c in CARRIERS)
            return self._refuse(
                "unknown_carrier",
                http.HTTPStatus.NOT_FOUND,
                f"no such phone endpoint {path[:80]!r}: the carriers' endpoints are {names} "
                "(the voice webhook, POST /v1/phone/twilio/voice, is on the HTTP API's port)",
            )
        cfg = self.config
        if 0 < cfg.max_connections <= self.edges.open + len(self.streams):
            return self._refuse(
                "node_full",
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"this node is at its limit of {cfg.max_connections} connections",
            )
        verdict = check_signature(carrier, self.settings, request, time.time())
        if verdict.status:
            return self._refuse(verdict.reason, http.HTTPStatus(verdict.status), verdict.message)
        if verdict.signed:
            self.edges.pending.settled(connection.transport)
        tokens = parse_qs(query).get("token")
        self._accepted[connection] = (carrier, verdict.signed, tokens[-1] if tokens else "")
        return None

    def owns(self, ws: ServerConnection) -> bool:
        """Whether ``ws`` is a media stream this edge accepted."""
        return ws in self._accepted

    async def serve(self, ws: ServerConnection) -> None:
        carrier, signed, token = self._accepted.pop(ws)
        call = PhoneCallConnection(self.services, ws, carrier, signed=signed, url_token=token)
        ended = self.streams[call] = asyncio.Event()
        try:
            await call.serve()
        finally:
            del self.streams[call]
            ended.set()

    async def mint_stream_token(
        self, owner: str, *, sid: str, call: str, ttl: float | None
    ) -> tuple[str, float]:
        """A one-time stream token for ``owner``'s call (``POST /v1/phone/tokens``)."""
        return await self.tokens.mint(owner, sid=sid, call=call, ttl=ttl)

    async def drain(self, timeout: float) -> None:
        """Let the calls go on until they end or ``timeout`` passes; then end the rest."""
        streams = [asyncio.ensure_future(ended.wait()) for ended in self.streams.values()]
        if not streams:
            return
        log.info("draining: %d phone calls go on for up to %.0fs", len(streams), timeout)
        await asyncio.wait(streams, timeout=timeout)
        for call in list(self.streams):
            log.info("draining: ending phone call %s", call.call_id)
            call.stop("drain", _GOING_AWAY, "the gateway node is shutting down")
        await asyncio.wait(streams, timeout=10.0)
        for task in streams:
            task.cancel()

    async def close(self) -> None:
        await self.control.close()

    def _refuse(self, reason: str, status: http.HTTPStatus, body: str) -> Response:
        self.metrics.streams_refused.labels(reason).inc()
        return Response(
            status.value,
            status.phrase,
            Headers([("Content-Type", "text/plain; charset=utf-8")]),
            (body + "\n").encode(),
        )
