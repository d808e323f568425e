"""The gateway's network face: one port for the WebSocket endpoint and HTTP.

``ws://HOST:PORT/v1/realtime`` is the client protocol; ``GET /healthz`` says the
process is alive, ``GET /readyz`` whether it would serve a new client (503 while
draining, full, short of file descriptors, or its store is unreachable:
``gateway.edge.health``), and
``GET /metrics`` serves Prometheus. The HTTP API (``POST``/``GET``/``DELETE``
``/v1/sessions``: ``gateway.edge.api``) is served on the same port: websockets
serves GET handshakes only, so ``gateway.edge.one_port`` reads each
connection's first request head and hands it to websockets or to aiohttp.
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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Literal, cast
from urllib.parse import parse_qs

import msgspec
from aiohttp.web import Application
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers, MultipleValuesError
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from gateway import console
from gateway.config import Config
from gateway.edge import web
from gateway.edge.admission import Edges
from gateway.edge.api import HttpApi
from gateway.edge.closes import CloseCode, close_reason
from gateway.edge.connection import ClientConnection
from gateway.edge.health import Descriptors, StoreProbe
from gateway.edge.http_requests import Caller, Owns, given_twice, split_target
from gateway.edge.media_streams import MediaStreamsFactory
from gateway.edge.new_sessions import NewSessions
from gateway.edge.one_port import Sniffer
from gateway.edge.openai_door import OPENAI_PATH, OpenAIDoor
from gateway.edge.pending import watched
from gateway.sessions.port import UNUSED, NodePort
from gateway.store.base import StoreUnavailable
from protocol.configuration import SessionConfig, decode_config

__all__ = ["Gateway", "Handshake", "ListenFailed"]

log = logging.getLogger("gateway.edge.server")

WS_PATH = "/v1/realtime"

StreamMode = Literal["token", "event"]
STREAM_MODES: Final[tuple[str, ...]] = ("token", "event")


class ListenFailed(OSError):
    """One of the node's ports could not be listened on; ``flag`` names its setting."""

    def __init__(self, exc: OSError, flag: str, host: str, port: int) -> None:
        super().__init__(exc.errno, exc.strerror or str(exc))
        self.flag = flag
        self.host = host
        self.port = port


class Handshake(msgspec.Struct):
    """What the HTTP handshake established for one WebSocket connection."""

    principal: str
    session_id: str | None
    after: int | None
    stream: StreamMode = "token"
    # The owner of a session of this node not stored yet (see ``Gateway.unrecorded``).
    unrecorded_owner: str | None = None
    # An API key (not a client token): its door may set a session's route as it opens.
    trusted: bool = True
    # May change the session's configuration: an API key, or a token minted with the
    # right (the OpenAI door's ephemeral keys: OpenAI's clients send session.update).
    may_configure: bool = True
    # May decide on calls that wait for approval (an API key, or a token with the right).
    may_approve: bool = True
    # A session the HTTP API made that no client has opened yet: its first connection
    # is not a resume (its session frame says ``resumed: false``).
    fresh: bool = False
    # The session's last seq, read to check ``after`` (0 when no ``after`` was given).
    last_seq: int = 0


# Routes a node's WebRTC calls on its HTTP app, beside its OpenAI door; given what
# serves an admitted client's socket (``Gateway._handler``: a call is served as any
# client is), what checks that a request's key owns a session (``HttpApi.owns``:
# a hangup) and what refuses unknown credentials (``Edges.caller``: before an offer
# holds a slot); returns what ends them. Given by ``gateway.app`` (``gateway.webrtc``
# stands on the door).
CallsInstaller = Callable[
    [
        Application,
        OpenAIDoor,
        Callable[[ServerConnection], Awaitable[None]],
        Owns,
        Caller,
    ],
    Callable[[], Awaitable[None]],
]


async def _no_calls() -> None:
    pass


class Gateway:
    """A running gateway node: its server plus its ``Node``."""

    def __init__(
        self,
        node: NodePort,
        phone: MediaStreamsFactory | None = None,
        calls: CallsInstaller | None = None,
    ) -> None:
        """``phone``: makes the node's phone calls (``gateway.app``); none: no phone edge.
        ``calls``: installs its WebRTC calls (``gateway.app``); none: no calls route."""
        self.node = node
        self.config: Config = node.config
        self.server: Server | None = None
        self._handshakes: dict[int, Handshake] = {}
        self.connections: set[ClientConnection] = set()
        # New sessions of this node not stored yet: a session is stored at its
        # first turn, so a connection that sends nothing leaves nothing behind.
        self.unrecorded = NewSessions()
        # Auth, origins, connection limits, slow clients (raises ConfigError if unsafe).
        self.edges = Edges(self.config, node, self.connections)
        self.store_probe = StoreProbe(node.store)
        self.descriptors = Descriptors()
        # Carriers' media streams (/v1/phone/CARRIER): phone calls as session clients.
        self.phone = phone(self.edges) if phone is not None else None
        # The HTTP API (POST/GET/DELETE /v1/sessions): on this port, and on --api-port if set.
        self.api = HttpApi(node, self.edges, self.phone)
        # The OpenAI Realtime door (/openai/v1/realtime): this door's checks, OpenAI's events.
        self.door = OpenAIDoor(
            self.config, node.policies, self._admit_client, self._config_of, node.setups.route_of
        )
        # Its WebRTC calls (POST /openai/v1/realtime/calls): the door's frames on a data channel.
        self._end_calls = (
            calls(self.api.app, self.door, self._handler, self.api.owns, self.edges.caller)
            if calls is not None
            else _no_calls
        )
        # The console's policy (it may call the HTTP API) and what it may configure.
        self.page_policy = console.content_security_policy(self.config.api_port)
        self.offer = web.offer_of(self.config, auth=self.edges.auth_on)

    @property
    def port(self) -> int:
        assert self.server is not None, "start() first"
        sock = next(iter(self.server.sockets))
        return int(sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"ws://{self.config.host}:{self.port}{WS_PATH}"

    @property
    def api_url(self) -> str:
        """``http://HOST:PORT`` of the HTTP API (the API's paths start with ``/v1/sessions``):
        ``--api-port``'s listener if set, else the gateway's own port."""
        port = self.api.own_port or self.port
        return f"http://{self.config.host}:{port}"

    @property
    def http_url(self) -> str:
        """``http://HOST:PORT``: the gateway's one port, for HTTP."""
        return f"http://{self.config.host}:{self.port}"

    async def start(self) -> None:
        cfg = self.config
        self.node.start()
        try:
            await self.api.start()
        except OSError as exc:
            raise ListenFailed(exc, "--api-port", cfg.host, cfg.api_port or 0) from exc
        try:
            self.server = await self._listen()
        except OSError as exc:
            await self.api.close()
            raise ListenFailed(exc, "--port", cfg.host, cfg.port) from exc
        self.edges.start()
        if self.api.own_port is not None:  # its actual port (api_port 0 picks one)
            self.offer = msgspec.structs.replace(self.offer, api_port=self.api.own_port)
            self.page_policy = console.content_security_policy(self.api.own_port)
        log.info("listening on %s (node %s)", self.url, self.node.node_id)

    async def _listen(self) -> Server:
        cfg = self.config
        return await serve(
            self._handler,
            cfg.host,
            cfg.port,
            process_request=self._process_request,
            max_size=cfg.max_frame,
            compression="deflate" if cfg.compression else None,
            ping_interval=cfg.ping_interval,
            ping_timeout=cfg.ping_timeout,
            server_header="realtime-gateway",
            # The first request's head decides: websockets (GET) or the HTTP API.
            # One socket write per batch; counted as pending until authenticated.
            create_connection=self._shared_port(),
            # The whole handshake, from the first byte: a stalled request is closed.
            open_timeout=cfg.header_timeout,
            # Connection bursts (a load balancer moving many clients at once)
            # must queue in the kernel, not be refused.
            backlog=4096,
            reuse_port=cfg.reuse_port or None,
            select_subprotocol=self._select_subprotocol,
            write_limit=cfg.write_limit,  # a send waits for a slow client to drain
        )

    def _shared_port(self) -> type[ServerConnection]:
        """websockets' connection factory, made to sniff first (``gateway.edge.one_port``)."""
        ws_class = watched(self.edges.pending)
        pending = self.edges.pending
        timeout = self.config.header_timeout
        api = self.api

        def make(protocol: ServerProtocol, server: Server, **kwargs: Any) -> asyncio.Protocol:
            return Sniffer(
                ws_class(protocol, server, **kwargs),
                api.protocol,
                timeout=timeout,
                on_open=pending.opened,
                on_close=pending.settled,
            )

        # websockets calls it as it would a ServerConnection subclass: with the same arguments.
        return cast("type[ServerConnection]", make)

    async def _config_of(self, sid: str) -> SessionConfig | None:
        live = self.node.live_state(sid)
        if live is not None:
            return live[1]
        meta = await self.node.store.get_meta(sid)
        if meta is None:
            return None
        try:
            return decode_config(meta.get("config", ""))
        except (ValueError, TypeError):
            return SessionConfig()

    def _select_subprotocol(
        self, connection: ServerConnection, offered: Sequence[Subprotocol]
    ) -> Subprotocol | None:
        real = connection.websocket if isinstance(connection, Sniffer) else connection
        if real.request is not None and split_target(real.request.path)[0] == OPENAI_PATH:
            return self.door.select_subprotocol(offered)
        return self.edges.select_subprotocol(real, offered)

    # ------------------------------------------------------------------ HTTP

    async def _process_request(
        self, connection: ServerConnection, request: Request
    ) -> Response | None:
        path, query = split_target(request.path)
        if path == "/healthz":  # liveness: the process answers (pages of apps may ask)
            return self._cors(request, _text(http.HTTPStatus.OK, "ok\n"))
        if path == "/readyz":
            return await self._readiness()
        if path == "/metrics":
            return Response(
                200,
                "OK",
                Headers([("Content-Type", "text/plain; version=0.0.4; charset=utf-8")]),
                self.node.metrics.render(),
            )
        phone = self.phone is not None and self.phone.handles(path)
        door = path == OPENAI_PATH
        if path != WS_PATH and not phone and not door:
            if path == web.NODE_PATH:
                return web.node_response(self.offer)
            page = console.static_response(path, self.page_policy)
            if page is not None:
                return self._cors(request, page) if path in web.CORS_PATHS else page
            return _text(
                http.HTTPStatus.NOT_FOUND,
                f"no such endpoint {path!r}: connect a WebSocket to {WS_PATH}\n",
            )
        if self.node.draining:
            self.node.metrics.clients.refused.labels("draining").inc()
            return _text(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                "this node is draining; connect to another node\n",
            )
        if not await self.store_probe.reachable():  # cached: one store ping a second at most
            self.node.metrics.clients.refused.labels("store").inc()
            return _text(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                "the session store is unreachable; connect to another node or retry in a few "
                "seconds\n",
            )
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return _text(
                http.HTTPStatus.UPGRADE_REQUIRED,
                f"{WS_PATH} is a WebSocket endpoint: send an Upgrade: websocket request\n",
            )
        if phone and self.phone is not None:  # a carrier's media stream: its own checks
            return await self.phone.handshake(connection, request)
        if door:  # the OpenAI door: its own query and credentials, then ``_admit_client``
            return await self.door.handshake(connection, request)
        admitted = await self._admit_client(connection, request, parse_qs(query))
        return admitted if isinstance(admitted, Response) else None

    async def _admit_client(
        self, connection: ServerConnection, request: Request, query: dict[str, list[str]]
    ) -> Handshake | Response:
        """Every check of a client's handshake after its path (either door's): origin, key
        or token, connection limits, the session's existence and owner, ``after``."""
        if twice := given_twice(query, _ONCE):
            return _text(http.HTTPStatus.BAD_REQUEST, twice + "\n")
        # Origin, API key (the principal), connection limits; freed when the connection closes.
        admitted = await self.edges.admit(
            connection, request, functools.partial(self._handshakes.pop, id(connection), None)
        )
        if isinstance(admitted, Response):
            return admitted
        principal = admitted.key
        sid = _one(query, "session_id")
        if admitted.session is not None:  # a client token: its session, and no other
            if sid is None:
                sid = admitted.session
            elif sid != admitted.session:
                self.node.metrics.clients.refused.labels("forbidden").inc()
                return _text(
                    http.HTTPStatus.FORBIDDEN,
                    "this client token opens its own session only: connect without "
                    "session_id (or with the session_id it was minted for)\n",
                )
        unrecorded_owner: str | None = None
        fresh = False
        stream = _one(query, "stream") or "token"
        if stream not in STREAM_MODES:
            return _text(
                http.HTTPStatus.BAD_REQUEST,
                f"stream={stream[:40]!r} is not a stream mode: use stream=token (a frame per "
                "model chunk, the default) or stream=event (one frame per think/respond segment)\n",
            )
        after_raw = _one(query, "after")
        if sid is not None:
            try:
                meta = await self.node.store.get_meta(sid)
            except StoreUnavailable:
                self.node.metrics.clients.refused.labels("store").inc()
                return _text(
                    http.HTTPStatus.SERVICE_UNAVAILABLE,
                    "the session store is unavailable; retry in a few seconds\n",
                )
            if meta is None:
                unrecorded_owner = self.unrecorded.owner(sid)
                if unrecorded_owner is not None:
                    meta = {"owner": unrecorded_owner}
            if meta is None:
                self.node.metrics.clients.refused.labels("unknown_session").inc()
                if admitted.session is not None and _one(query, "session_id") is None:
                    return _text(
                        http.HTTPStatus.NOT_FOUND,
                        "the session this client token opens was deleted or has expired; "
                        "ask the app's backend for a new session\n",
                    )
                return _text(
                    http.HTTPStatus.NOT_FOUND,
                    f"session {sid!r} does not exist or has expired; "
                    "connect without session_id to start a new one\n",
                )
            if meta.get("owner", "") != principal:
                self.node.metrics.clients.refused.labels("forbidden").inc()
                return _text(
                    http.HTTPStatus.FORBIDDEN,
                    "this session belongs to another API key\n",
                )
            fresh = meta.get(UNUSED) == "1"
        after: int | None = None
        last_seq = 0
        if after_raw is not None:
            checked = await self._check_after(after_raw, sid)
            if isinstance(checked, Response):
                return checked
            after, last_seq = checked
        handshake = self._handshakes[id(connection)] = Handshake(
            principal=principal,
            session_id=sid,
            after=after,
            stream="event" if stream == "event" else "token",
            unrecorded_owner=unrecorded_owner,
            trusted=admitted.session is None,
            may_configure=admitted.session is None or admitted.configure,
            may_approve=admitted.session is None or admitted.approve,
            fresh=fresh,
            last_seq=last_seq,
        )
        return handshake

    def _cors(self, request: Request, response: Response) -> Response:
        """CORS for the paths pages of other origins may read (``web.CORS_PATHS``)."""
        try:
            origin = request.headers.get("Origin")
        except MultipleValuesError:
            origin = None
        allow = web.cors_origin(origin, self.edges.origins, auth_on=self.edges.auth_on)
        return web.with_cors(response, allow)

    async def _check_after(self, raw: str, sid: str | None) -> tuple[int, int] | Response:
        """``(after, last seq)``: ``after`` as a seq the session has, a plain ASCII
        decimal <= its last seq (which the OpenAI door checks its ``after_event`` by).

        ``str.isdigit`` alone took "²" (then ``int`` raised: HTTP 500); a
        40-digit value opened and closed silently; a value past the log's end
        made the client drop the next turn's events as already seen.
        """
        if sid is None:
            last = 0  # a new session: nothing has been logged yet
        else:
            try:
                last = await self.node.store.last_seq(sid)
            except StoreUnavailable:
                self.node.metrics.clients.refused.labels("store").inc()
                return _text(
                    http.HTTPStatus.SERVICE_UNAVAILABLE,
                    "the session store is unavailable; retry in a few seconds\n",
                )
        if raw.isascii() and raw.isdecimal() and len(raw) <= 20:
            after = int(raw)
            if after <= last:
                return after, last
        self.node.metrics.clients.refused.labels("bad_after").inc()
        shown = raw if len(raw) <= 40 else raw[:40] + "…"
        where = (
            f"this session's last seq is {last}"
            if sid is not None
            else ("a new session has no events yet (last seq 0); pass session_id to resume one")
        )
        return _text(
            http.HTTPStatus.BAD_REQUEST,
            f"after={shown!r} is not a seq of this session: pass the seq of the last event "
            f"you received, a decimal number from 0 to the last seq; {where}\n",
        )

    async def _readiness(self) -> Response:
        """200 when a new client would be served now; 503 naming why not."""
        node = self.node
        cfg = self.config
        if node.draining:
            return _text(http.HTTPStatus.SERVICE_UNAVAILABLE, "not ready: draining\n")
        if 0 < cfg.max_connections <= self.edges.open:
            return _text(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"not ready: full ({cfg.max_connections} connections)\n",
            )
        shortage = self.descriptors.shortage()
        if shortage is not None:
            return _text(http.HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {shortage}\n")
        if (problem := await self.store_probe.problem()) is not None:
            return _text(http.HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {problem}\n")
        return _text(http.HTTPStatus.OK, "ready\n")

    # ------------------------------------------------------------------ WebSocket

    async def _handler(self, ws: ServerConnection) -> None:
        if self.phone is not None and self.phone.owns(ws):
            await self.phone.serve(ws)
            return
        hs = self._handshakes.pop(id(ws), None)
        if hs is None:  # pragma: no cover - process_request always records one
            await ws.close(1011, "handshake state missing")
            return
        node = self.node
        node.metrics.clients.connections.inc()
        node.metrics.clients.connections_total.inc()
        try:
            if hs.session_id is None:
                runtime = await node.create_session(hs.principal)
                sid, after, resumed = runtime.sid, 0, False
                self.unrecorded.add(sid, hs.principal)  # stored at its first turn
            else:
                sid, after, resumed = hs.session_id, hs.after or 0, not hs.fresh
                if hs.unrecorded_owner is not None:  # its last connection may have left since
                    self.unrecorded.add(sid, hs.unrecorded_owner)
            # The OpenAI door's clients are the same connection, speaking OpenAI's events.
            make = self.door.connection if self.door.owns(ws) else ClientConnection
            conn = make(
                node,
                ws,
                sid=sid,
                after=after,
                resumed=resumed,
                event_mode=hs.stream == "event",
                unrecorded=self.unrecorded,
                trusted=hs.may_configure,
                may_approve=hs.may_approve,
            )
            self.connections.add(conn)
            try:
                await conn.serve()
            finally:
                self.connections.discard(conn)
                if sid in self.unrecorded and not any(c.sid == sid for c in self.connections):
                    self.unrecorded.left(sid)
        except StoreUnavailable as exc:
            log.warning("connection refused: store unavailable: %s", exc)
            with contextlib.suppress(Exception):
                await ws.close(
                    CloseCode.TRY_AGAIN_LATER, close_reason("session store unavailable; retry")
                )
        finally:
            node.metrics.clients.connections.dec()

    # ------------------------------------------------------------------ shutdown

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, let running turns finish (up to ``timeout``) and phone calls end
        (up to ``drain_phone_timeout``), close clients 1012."""
        node = self.node
        node.draining = True
        deadline = self.config.drain_timeout if timeout is None else timeout
        if self.server is not None:
            self.server.close(close_connections=False)
        # Phone calls cannot move to another node: they go on until they end (or the
        # phone drain timeout), while the running turns of other clients finish.
        if self.phone is not None:
            calls = self.phone.drain(self.config.drain_phone_timeout)
            await asyncio.gather(calls, node.finish_turns(deadline))
        else:
            await node.finish_turns(deadline)
        await asyncio.gather(
            *(_close_or_abort(c.ws, c.drained) for c in list(self.connections)),
            return_exceptions=True,
        )
        await self._end_calls()
        await node.stop()
        if self.server is not None:
            await self.server.wait_closed()
        await self.api.close()
        await self.door.close()
        await self.edges.close()
        if self.phone is not None:
            await self.phone.close()

    async def close(self) -> None:
        """Stop at once (tests, errors): clients get 1001."""
        self.node.draining = True
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        await self._end_calls()
        await self.api.close()
        await self.door.close()
        await self.edges.close()
        await self.node.stop()
        if self.phone is not None:
            await self.phone.close()


async def _close_or_abort(ws: ServerConnection, reason: str) -> None:
    """Close with 1012; a client that stopped reading cannot take the close
    frame, so after a few seconds its connection is aborted instead."""
    try:
        await asyncio.wait_for(ws.close(CloseCode.SERVICE_RESTART, close_reason(reason)), 5.0)
    except (TimeoutError, OSError):
        ws.transport.abort()


_ONCE: Final = ("session_id", "after", "stream")
"""Query parameters a handshake takes once (the same value twice is once)."""


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
