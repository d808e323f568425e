"""The gateway's network face: one port for the WebSocket endpoint and HTTP.

``ws://HOST:PORT/v1/realtime`` is the client protocol; ``GET /healthz`` answers
load balancers (503 while draining) and ``GET /metrics`` serves Prometheus.
Everything a handshake can refuse (unknown path, bad query, unknown or foreign
session) is refused with an HTTP status before the WebSocket opens, so a
client learns what was wrong without parsing a close frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http
import logging
from urllib.parse import parse_qs, urlsplit

import msgspec
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from gateway.config import Config
from gateway.edge import web
from gateway.edge.admission import Edges
from gateway.edge.connection import ClientConnection, CloseCode
from gateway.sessions.node import Node
from gateway.store.base import StoreUnavailable

__all__ = ["Gateway", "Handshake"]

log = logging.getLogger("gateway.edge.server")

WS_PATH = "/v1/realtime"


class _Connection(ServerConnection):
    """A server connection that hands the socket one write per send.

    websockets writes each frame's header and payload, and each frame of a
    batch, as separate ``transport.write`` calls; joined, a batch of events
    costs one syscall instead of several.
    """

    def send_data(self) -> None:
        writes = self.protocol.writes
        if len(writes) > 1 and all(writes):  # an empty write means EOF: keep it apart
            self.protocol.writes = [b"".join(writes)]
        super().send_data()


class Handshake(msgspec.Struct):
    """What the HTTP handshake established for one WebSocket connection."""

    principal: str
    session_id: str | None
    after: int | None


class Gateway:
    """A running gateway node: its server plus its ``Node``."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config: Config = node.config
        self.server: Server | None = None
        self._handshakes: dict[int, Handshake] = {}
        self.connections: set[ClientConnection] = set()
        # Auth, origins, connection limits, slow clients (raises ConfigError if unsafe).
        self.edges = Edges(self.config, node, self.connections)

    @property
    def port(self) -> int:
        assert self.server is not None, "start() first"
        sock = next(iter(self.server.sockets))
        return int(sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"ws://{self.config.host}:{self.port}{WS_PATH}"

    async def start(self) -> None:
        cfg = self.config
        self.node.start()
        self.server = await serve(
            self._handler,
            cfg.host,
            cfg.port,
            process_request=self._process_request,
            max_size=cfg.max_frame,
            compression="deflate" if cfg.compression else None,
            ping_interval=cfg.ping_interval,
            ping_timeout=cfg.ping_timeout,
            server_header="realtime-gateway",
            create_connection=_Connection,
            # Connection bursts (a load balancer moving many clients at once)
            # must queue in the kernel, not be refused.
            backlog=4096,
            reuse_port=cfg.reuse_port or None,
            select_subprotocol=self.edges.select_subprotocol,
            write_limit=cfg.write_limit,  # a send waits for a slow client to drain
        )
        self.edges.start()
        log.info("listening on %s (node %s)", self.url, self.node.node_id)

    # ------------------------------------------------------------------ HTTP

    async def _process_request(
        self, connection: ServerConnection, request: Request
    ) -> Response | None:
        url = urlsplit(request.path)
        path = url.path
        if path == "/healthz":
            if self.node.draining:
                return _text(http.HTTPStatus.SERVICE_UNAVAILABLE, "draining\n")
            return _text(http.HTTPStatus.OK, "ok\n")
        if path == "/metrics":
            return Response(
                200,
                "OK",
                Headers([("Content-Type", "text/plain; version=0.0.4; charset=utf-8")]),
                self.node.metrics.render(),
            )
        if path != WS_PATH:
            page = web.static_response(path)
            if page is not None:
                return page
            return _text(
                http.HTTPStatus.NOT_FOUND,
                f"no such endpoint {path!r}: connect a WebSocket to {WS_PATH}\n",
            )
        if self.node.draining:
            self.node.metrics.refused.labels("draining").inc()
            return _text(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                "this node is draining; connect to another node\n",
            )
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return _text(
                http.HTTPStatus.UPGRADE_REQUIRED,
                f"{WS_PATH} is a WebSocket endpoint: send an Upgrade: websocket request\n",
            )
        query = parse_qs(url.query)
        # Origin, API key (the principal), connection limits; freed when the connection closes.
        admitted = await self.edges.admit(
            connection, request, functools.partial(self._handshakes.pop, id(connection), None)
        )
        if isinstance(admitted, Response):
            return admitted
        principal = admitted
        sid = _one(query, "session_id")
        after_raw = _one(query, "after")
        after: int | None = None
        if after_raw is not None:
            if not after_raw.isdigit():
                return _text(
                    http.HTTPStatus.BAD_REQUEST,
                    f"after={after_raw!r} is not a seq: pass the last seq you received "
                    "(an integer >= 0)\n",
                )
            after = int(after_raw)
        if sid is not None:
            try:
                meta = await self.node.store.get_meta(sid)
            except StoreUnavailable:
                self.node.metrics.refused.labels("store").inc()
                return _text(
                    http.HTTPStatus.SERVICE_UNAVAILABLE,
                    "the session store is unavailable; retry in a few seconds\n",
                )
            if meta is None:
                self.node.metrics.refused.labels("unknown_session").inc()
                return _text(
                    http.HTTPStatus.NOT_FOUND,
                    f"session {sid!r} does not exist or has expired; "
                    "connect without session_id to start a new one\n",
                )
            if meta.get("owner", "") != principal:
                self.node.metrics.refused.labels("forbidden").inc()
                return _text(
                    http.HTTPStatus.FORBIDDEN,
                    "this session belongs to another API key\n",
                )
        self._handshakes[id(connection)] = Handshake(
            principal=principal, session_id=sid, after=after
        )
        return None

    # ------------------------------------------------------------------ WebSocket

    async def _handler(self, ws: ServerConnection) -> None:
        hs = self._handshakes.pop(id(ws), None)
        if hs is None:  # pragma: no cover - process_request always records one
            await ws.close(1011, "handshake state missing")
            return
        node = self.node
        node.metrics.connections.inc()
        node.metrics.connections_total.inc()
        try:
            if hs.session_id is None:
                runtime = await node.create_session(hs.principal)
                sid, after, resumed = runtime.sid, 0, False
            else:
                sid, after, resumed = hs.session_id, hs.after or 0, True
            conn = ClientConnection(node, ws, sid=sid, after=after, resumed=resumed)
            self.connections.add(conn)
            try:
                await conn.serve()
            finally:
                self.connections.discard(conn)
        except StoreUnavailable as exc:
            log.warning("connection refused: store unavailable: %s", exc)
            with contextlib.suppress(Exception):
                await ws.close(CloseCode.TRY_AGAIN_LATER, "session store unavailable; retry")
        finally:
            node.metrics.connections.dec()

    # ------------------------------------------------------------------ shutdown

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, let running turns finish (up to ``timeout``), close clients 1012."""
        node = self.node
        node.draining = True
        deadline = self.config.drain_timeout if timeout is None else timeout
        if self.server is not None:
            self.server.close(close_connections=False)
        turns = [rt.turn for rt in node.runtimes.values() if rt.turn is not None]
        if turns:
            log.info("draining: waiting up to %.0fs for %d running turns", deadline, len(turns))
            await asyncio.wait(turns, timeout=deadline)
        flushes = [asyncio.ensure_future(rt.flushed()) for rt in node.runtimes.values()]
        if flushes:
            await asyncio.wait(flushes, timeout=5.0)  # a store outage must not hold the exit
        await asyncio.gather(
            *(_close_or_abort(c.ws) for c in list(self.connections)), return_exceptions=True
        )
        await node.stop()
        if self.server is not None:
            await self.server.wait_closed()
        await self.edges.close()

    async def close(self) -> None:
        """Stop at once (tests, errors): clients get 1001."""
        self.node.draining = True
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        await self.edges.close()
        await self.node.stop()


async def _close_or_abort(ws: ServerConnection) -> None:
    """Close with 1012; a client that stopped reading cannot take the close
    frame, so after a few seconds its connection is aborted instead."""
    try:
        await asyncio.wait_for(
            ws.close(CloseCode.SERVICE_RESTART, "node draining; reconnect with after=SEQ"), 5.0
        )
    except (TimeoutError, OSError):
        ws.transport.abort()


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _text(status: http.HTTPStatus, body: str) -> Response:
    return Response(
        status.value,
        status.phrase,
        Headers([("Content-Type", "text/plain; charset=utf-8")]),
        body.encode(),
    )
