"""The HTTP API: an app's backend makes, reads, exports and deletes sessions.

    POST   /v1/sessions                 make a session → 201 {session_id, client_token, expires_at}
    GET    /v1/sessions/{id}            its configuration, status, usage, created
    GET    /v1/sessions/{id}/events     its logged events (?after=SEQ&limit=N): the transcript
    GET    /v1/sessions/{id}/recording  its recording, JSON Lines (?offset=BYTES), paged by bytes
    POST   /v1/sessions/{id}/tokens     a fresh client token for it
    DELETE /v1/sessions/{id}            delete it everywhere (clients closed with 4404)
    POST   /v1/phone/tokens             a one-time stream token for a phone call's TwiML
    POST   /v1/phone/twilio/voice       the TwiML helper: a Twilio number's voice webhook
                                        (signed by Twilio, not an API key: gateway.phone.webhook)

Every call needs an API key (``Authorization: Bearer API_KEY``) and works on
the key's own sessions only; a client token is refused (403): it opens one
session's WebSocket and nothing else. Bodies and answers are JSON; every
refusal is ``{"error": {"code", "message", "type", "param"}}`` with a 4xx status and a message
naming the field and what to do.

It is served on the gateway's own port (``gateway.edge.one_port`` hands a
connection whose first request is not a WebSocket's ``GET`` to aiohttp's
protocol), and also on ``--api-port`` if set (a listener of its own, for
deployments that route ``/v1/sessions`` to a port of its own). aiohttp's
server runs in the node's own event loop, next to the sessions it reads.
CORS is answered for the allowed origins (``--allowed-origins``), preflights
included.

Nothing one client sends may hold the node's descriptors or memory (issue
29): a request's headers must arrive within ``header_timeout`` (aiohttp's
keep-alive timer, which runs from the connection's start), its body within
``body_timeout`` (408), and its answer be taken within ``body_timeout``; a
connection counts in ``Edges.pending`` until a request of it authenticates;
an export page holds at most ``PAGE_BYTES`` (or one larger event or line); a
session made here is kept ``unused_session_ttl`` until a client connects, and
its configuration counts against its key's ``config_bytes_per_key``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from aiohttp import web

from gateway.config import Config
from gateway.edge.admission import ANY_ORIGIN, Edges
from gateway.edge.api_messages import (
    CreateSession,
    Minted,
    MintStreamToken,
    MintToken,
    SessionInfo,
    StreamTokenMinted,
    create_decoder,
    encode,
    mint_decoder,
    stream_token_decoder,
)
from gateway.edge.auth import ANONYMOUS, KeyStoreUnavailable
from gateway.edge.http_requests import (
    HTTP_LOG,
    MAX_BODY,
    Refusal,
    error_response,
    json_response,
    query_int,
    read_body,
)
from gateway.edge.media_streams import MediaStreams
from gateway.edge.openai_secrets import OPENAI_CLIENT_SECRETS, client_secret
from gateway.edge.pending import WatchedProtocol
from gateway.edge.tokens import is_client_token
from gateway.sessions.port import CONFIG_QUOTA, UNUSED, NodePort, config_bytes
from gateway.sessions.setup import ConfigProblem
from gateway.store.base import RECORDING, StoreUnavailable, read_recording_page
from protocol.configuration import (
    ConfigChange,
    SessionConfig,
    apply_change,
    decode_config,
)
from protocol.events import Usage
from tools.client import prepare

__all__ = ["API_PREFIX", "HttpApi"]

log = logging.getLogger("gateway.edge.api")

API_PREFIX: Final = "/v1/sessions"
MAX_PAGE: Final = 1000
DEFAULT_PAGE: Final = 500
PAGE_BYTES: Final = 1 << 20
"""An export page holds at most this many bytes (one larger event or recorded line comes alone)."""

PHONE_TOKENS: Final = "/v1/phone/tokens"

_HOW: Final = (
    "send your API key as `Authorization: Bearer API_KEY` (the gateway's operator issues "
    "keys: `gateway keys add KEY_ID`)"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _door_404(path: str) -> str:
    return (
        f"no such endpoint {path[:200]!r} on the OpenAI door: it serves the WebSocket "
        f"/openai/v1/realtime, POST {OPENAI_CLIENT_SECRETS}, POST /openai/v1/realtime/calls "
        "and POST /openai/v1/realtime/calls/CALL_ID/hangup"
    )


class HttpApi:
    """The HTTP API of one node, served by aiohttp in the node's event loop."""

    def __init__(self, node: NodePort, edges: Edges, phone: MediaStreams | None = None) -> None:
        self.node = node
        self.edges = edges
        self.phone = phone
        self.config: Config = node.config
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors, self._cors])
        app.router.add_post(API_PREFIX, self.create)
        app.router.add_get(API_PREFIX + "/{sid}", self.describe)
        app.router.add_get(API_PREFIX + "/{sid}/events", self.events)
        app.router.add_get(API_PREFIX + "/{sid}/recording", self.recording)
        app.router.add_post(API_PREFIX + "/{sid}/tokens", self.mint)
        app.router.add_delete(API_PREFIX + "/{sid}", self.delete)
        # OpenAI's ephemeral keys (gateway.edge.openai_secrets): a session and its token.
        app.router.add_post(OPENAI_CLIENT_SECRETS, functools.partial(client_secret, self))
        self.phone_paths: list[str] = []
        if phone is not None:
            app.router.add_post(PHONE_TOKENS, self.phone_token)
            for path, handler in phone.webhooks.items():
                app.router.add_post(path, handler)
            self.phone_paths = [PHONE_TOKENS, *phone.webhooks]
        app.on_response_prepare.append(self._one_answer)
        self.app = app
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._socket: socket.socket | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Ready to serve the gateway's port (``protocol``); with ``api_port`` set, also
        listen on ``host:api_port`` (with ``reuse_port``, workers share it)."""
        cfg = self.config
        # aiohttp's keep-alive timer runs from the connection's start and from each
        # answer to the next request's headers: it is the header timeout.
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=cfg.header_timeout,
            # A compressed body arrives as sent: aiohttp would inflate it as it arrives,
            # before any handler checks the key or the size (a 971 KB gzip body inflating
            # to 1 GB held a node 3-4 s past its 401); ``_body`` inflates after both.
            auto_decompress=False,
            logger=HTTP_LOG,  # a request aiohttp cannot parse: one line, not a traceback
        )
        await runner.setup()
        self._runner = runner
        if cfg.api_port is None:
            return
        # A socket of our own: its address is known (api_port 0) with no private API.
        host = cfg.host or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if cfg.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, cfg.api_port or 0))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._server = await asyncio.get_running_loop().create_server(
            self.protocol, sock=sock, backlog=1024
        )
        self._socket = sock
        log.info("HTTP API on http://%s:%d%s", host, self.port, API_PREFIX)

    def protocol(self) -> asyncio.Protocol:
        """A connection's protocol (``start`` first), counted as pending until it authenticates."""
        assert self._runner is not None and self._runner.server is not None, "start() first"
        # aiohttp's web.Server is a protocol factory.
        return WatchedProtocol(self._runner.server(), self.edges.pending)

    @property
    def own_port(self) -> int | None:
        """The port of ``--api-port``'s listener; none when the API is on the gateway's only."""
        return self.port if self._socket is not None else None

    async def _one_answer(self, request: web.Request, response: web.StreamResponse) -> None:
        """On the gateway's port, one answer per connection: a browser may send the next
        ``GET`` of a page down a kept-alive connection, and pages are websockets'."""
        transport = request.transport
        sockname = transport.get_extra_info("sockname") if transport is not None else None
        own = self.own_port
        if own is None or not isinstance(sockname, tuple) or sockname[1] != own:
            response.force_close()  # the connection closes after this answer
            response.headers["Connection"] = "close"  # (headers are made before this hook)

    @property
    def port(self) -> int:
        assert self._socket is not None, "start() first"
        return int(self._socket.getsockname()[1])

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # no new connections; the runner closes the open ones
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if server is not None:
            await server.wait_closed()
        if self._socket is not None:
            self._socket.close()

    # ------------------------------------------------------------------ middleware

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every refusal as JSON that says what to do; nothing a client sends is a 500.

        The answer is sent here, within ``body_timeout``: a client that does not read it
        (an export page is up to 1 MiB) is cut off, not let hold it in the node's memory.
        """
        response = await self._answer(request, handler)
        # A refusal raised past ``_cors`` carries its CORS headers too: a page of
        # an allowed origin reads why it was refused (404, 401…), not a network error.
        self._allow_origin(request, response)
        transport = request.transport
        try:
            async with asyncio.timeout(self.config.body_timeout):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            log.info("HTTP API: a client took no answer in %gs; closed", self.config.body_timeout)
            if transport is not None:
                transport.abort()
        except ConnectionError:  # gone before its answer: aiohttp's traceback was an ERROR
            if transport is not None:
                transport.abort()
        else:
            if response.status == 408 and transport is not None:
                transport.close()  # rather than wait for the rest of a body that stalled
        return response

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except Refusal as exc:
            return error_response(exc.status, exc.message)
        except web.HTTPRequestEntityTooLarge:
            return error_response(
                413, f"the body is larger than {MAX_BODY} bytes; send a smaller one"
            )
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            return error_response(
                405, f"{request.method} is not allowed on {request.path}; use {allowed}"
            )
        except web.HTTPNotFound:
            if request.path.startswith("/openai/"):  # an OpenAI SDK's call the door lacks
                return error_response(404, _door_404(request.path))
            return error_response(
                404,
                f"no such endpoint {request.path[:200]!r}: the API is POST {API_PREFIX}, "
                f"GET|DELETE {API_PREFIX}/ID, GET {API_PREFIX}/ID/events, "
                f"GET {API_PREFIX}/ID/recording, POST {API_PREFIX}/ID/tokens"
                + "".join(f", POST {path}" for path in self.phone_paths),
            )
        except StoreUnavailable:
            self.node.metrics.store_errors.inc()
            return error_response(503, "the session store is unavailable; retry in a few seconds")
        except web.HTTPException:
            raise
        except Exception:
            log.exception("HTTP API: %s %s failed", request.method, request.path)
            return error_response(500, "internal error; retry, and report it if it persists")

    def _origin_allowed(self, origin: str) -> bool:
        origins = self.edges.origins
        return ANY_ORIGIN in origins or origin.rstrip("/").lower() in origins

    @web.middleware
    async def _cors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """CORS for the allowed origins (``--allowed-origins``): preflights and answers."""
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if origin is None or not self._origin_allowed(origin):
                return error_response(
                    403,
                    f"origin {str(origin)[:200]!r} may not call this API from a browser; the "
                    "operator can allow it with --allowed-origins",
                )
            response: web.StreamResponse = web.Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
            # X-OpenAI-Agents-SDK: agents-js's WebRTC transport sends it with its offer.
            response.headers["Access-Control-Allow-Headers"] = (
                "Authorization, Content-Type, X-OpenAI-Agents-SDK"
            )
            response.headers["Access-Control-Max-Age"] = "600"
        else:
            response = await handler(request)
        self._allow_origin(request, response)
        return response

    def _allow_origin(self, request: web.Request, response: web.StreamResponse) -> None:
        """The CORS headers of an answer to a page of an allowed origin (else none)."""
        origin = request.headers.get("Origin")
        if origin is not None and self._origin_allowed(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = (
                "X-Next-Offset, X-Has-More, Link, Location"
            )
            response.headers["Vary"] = "Origin"

    # ------------------------------------------------------------------ checks

    async def _key_id(self, request: web.Request) -> str:
        """The key id of the request's API key; ``Refusal`` (401/403/503) otherwise."""
        try:
            authorization = request.headers.getone("Authorization", None)
        except KeyError:  # pragma: no cover - getone with a default does not raise
            authorization = None
        if len(request.headers.getall("Authorization", [])) > 1:
            raise Refusal(401, "send one Authorization header, not several")
        if authorization is None:
            if not self.edges.auth_on:
                self._authenticated(request)
                return ANONYMOUS
            raise Refusal(401, f"an API key is required: {_HOW}")
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Refusal(401, f"the Authorization header must be `Bearer API_KEY`: {_HOW}")
        if is_client_token(key):
            raise Refusal(
                403,
                "a client token opens one session's WebSocket and nothing else; the HTTP API "
                "needs an API key, kept on the app's backend",
            )
        if not self.edges.auth_on:
            self._authenticated(request)
            return ANONYMOUS
        try:
            key_id = await self.edges.key_id(key)
        except KeyStoreUnavailable as exc:
            self.node.metrics.store_errors.inc()
            log.warning("cannot check API keys: Redis unavailable: %s", exc)
            raise Refusal(
                503, "API keys cannot be checked right now; retry in a few seconds"
            ) from exc
        if key_id is None:
            raise Refusal(401, f"this API key is not valid (mistyped, or revoked): {_HOW}")
        self._authenticated(request)
        return key_id

    def _authenticated(self, request: web.Request) -> None:
        """The connection is a client's now: no longer counted as pending."""
        if request.transport is not None:
            self.edges.pending.settled(request.transport)

    async def _owned(self, request: web.Request) -> tuple[str, str, dict[str, str]]:
        """``(key_id, sid, meta)`` of a session of the caller's; ``Refusal`` otherwise."""
        key_id = await self._key_id(request)
        sid = request.match_info["sid"]
        return key_id, sid, await self._meta_of(key_id, sid)

    async def _meta_of(self, key_id: str, sid: str) -> dict[str, str]:
        meta = await self.node.store.get_meta(sid)
        if meta is None:
            raise Refusal(404, f"session {sid[:100]!r} does not exist (deleted, or expired)")
        if meta.get("owner", "") != key_id:
            raise Refusal(403, "this session belongs to another API key")
        return meta

    async def owns(self, request: web.Request, sid: str | None) -> None:
        """The request's API key owns session ``sid`` (None: it is a valid key);
        ``Refusal`` otherwise. For a route beside the API's: a WebRTC call's hangup."""
        key_id = await self._key_id(request)
        if sid is not None:
            await self._meta_of(key_id, sid)

    async def _body(self, request: web.Request, decode: Callable[[bytes], Any]) -> Any:
        """The request's JSON body, decoded (``read_body``); called after ``_key_id``:
        a caller with no key never gets its body read."""
        return await read_body(request, decode, self.config.body_timeout)

    # ------------------------------------------------------------------ handlers

    async def create(self, request: web.Request) -> web.Response:
        key_id = await self._key_id(request)
        body: CreateSession = await self._body(request, create_decoder.decode)
        ttl = None if body.ttl is msgspec.UNSET else body.ttl
        minted = await self.make_session(key_id, body, ttl, approve="approve" in body.rights)
        return json_response(201, minted)

    async def make_session(
        self,
        key_id: str,
        change: ConfigChange,
        ttl: float | None,
        *,
        approve: bool = False,
        configure: bool = False,
    ) -> Minted:
        """A new session of ``key_id`` configured by ``change``, and its client token;
        ``Refusal`` (400/403/413/429) if the key may not have it."""
        config = apply_change(SessionConfig(), change)
        if isinstance(config, str):
            raise Refusal(400, config)
        problem = await prepare(config.tools)  # compiled off the loop, once per schema
        if problem is not None:
            raise Refusal(400, problem)
        setup = self.node.setups.setup(key_id, config, self.node.key_tools.get(key_id))
        if isinstance(setup, str):
            raise Refusal(400 if isinstance(setup, ConfigProblem) else 403, str(setup))
        sid = self.node.new_session_id()
        meta = self.node.setups.session_meta(key_id, setup)
        await self._hold_quota(key_id, sid, config_bytes(meta))
        meta[UNUSED] = "1"  # until a client connects (Node._load): kept unused_session_ttl
        try:
            await self.node.store.create_session(sid, meta, ttl=self.config.unused_session_ttl)
        except Exception:
            with contextlib.suppress(Exception):
                await self.node.store.release_bytes(CONFIG_QUOTA.format(key=key_id), sid)
            raise
        token, expires_at = await self.edges.tokens.mint(
            sid, key_id, ttl, approve=approve, configure=configure
        )
        return Minted(sid, token, expires_at)

    async def _hold_quota(self, key_id: str, sid: str, size: int) -> None:
        """Count ``size`` bytes of configuration against the key's quota; 413/429 if it is full.

        Held for ``unused_session_ttl`` (the session's own lifetime until a
        client connects; ``Node._load`` then holds it for ``session_ttl``).
        """
        cfg = self.config
        quota = cfg.config_bytes_per_key
        if quota and size > quota:
            raise Refusal(
                413,
                f"this session's configuration is {size} bytes, more than this API key may "
                f"store in all its sessions ({quota} bytes, --config-bytes-per-key); send a "
                "smaller one",
            )
        held, total = await self.node.store.hold_bytes(
            CONFIG_QUOTA.format(key=key_id), sid, size, quota, cfg.unused_session_ttl
        )
        if not held:
            raise Refusal(
                429,
                f"this API key's sessions already store {total} bytes of configuration and "
                f"this one is {size} more, past its quota of {quota} bytes "
                "(--config-bytes-per-key): delete the sessions you no longer need "
                f"(DELETE {API_PREFIX}/ID), or wait for unused ones to expire "
                f"({cfg.unused_session_ttl:g} s after they were made), or ask the operator "
                "for a larger quota",
            )

    async def mint(self, request: web.Request) -> web.Response:
        key_id, sid, _ = await self._owned(request)
        body: MintToken = await self._body(request, mint_decoder.decode)
        ttl = None if body.ttl is msgspec.UNSET else body.ttl
        approve = "approve" in body.rights
        token, expires_at = await self.edges.tokens.mint(sid, key_id, ttl, approve=approve)
        return json_response(201, Minted(sid, token, expires_at))

    async def phone_token(self, request: web.Request) -> web.Response:
        """A one-time stream token: the app puts it in the TwiML of a call it answers."""
        assert self.phone is not None
        key_id = await self._key_id(request)
        body: MintStreamToken = await self._body(request, stream_token_decoder.decode)
        sid = "" if body.session_id is msgspec.UNSET else body.session_id
        if sid:
            meta = await self.node.store.get_meta(sid)
            if meta is None:
                raise Refusal(404, f"session {sid[:100]!r} does not exist (deleted, or expired)")
            if meta.get("owner", "") != key_id:
                raise Refusal(403, "this session belongs to another API key")
        ttl = None if body.ttl is msgspec.UNSET else body.ttl
        call = "" if body.call is msgspec.UNSET else body.call
        token, expires_at = await self.phone.mint_stream_token(
            str(key_id), sid=sid, call=call, ttl=ttl
        )
        return json_response(201, StreamTokenMinted(token, expires_at, sid or None))

    async def describe(self, request: web.Request) -> web.Response:
        _, sid, meta = await self._owned(request)
        store = self.node.store
        driver = await store.lease_owner(sid)
        last_seq = await store.last_seq(sid)
        live = self.node.live_state(sid)
        if live is not None:
            usage, config = live
        else:
            usage = Usage(
                input=_int(meta.get("usage_input")), output=_int(meta.get("usage_output"))
            )
            try:
                config = decode_config(meta.get("config", ""))
            except (ValueError, TypeError):
                config = SessionConfig()
        info = SessionInfo(
            session_id=sid,
            status="active" if driver is not None else "idle",
            config=config,
            usage=usage,
            created=_float(meta.get("created")),
            last_seq=last_seq,
            node=driver,
        )
        return json_response(200, info)

    async def events(self, request: web.Request) -> web.Response:
        _, sid, _ = await self._owned(request)
        after = query_int(request, "after", 0, 0, 10**18)
        limit = query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        store = self.node.store
        # Paged by count and by bytes, decided by the store as it reads, so a
        # page of large events is never read whole (a 300-event page was once
        # 251 MB, and +845 MB in this process).
        entries, last = await asyncio.gather(
            store.read_log(sid, after, limit, max_bytes=PAGE_BYTES), store.last_seq(sid)
        )
        next_after = entries[-1].seq if entries else after
        more = next_after < last
        # The events exactly as logged (and sent on the WebSocket), spliced in.
        body = b"".join(
            [
                b'{"session_id":',
                encode(sid),
                b',"events":[',
                b",".join(e.data for e in entries),
                b'],"next_after":',
                str(next_after).encode(),
                b',"has_more":',
                b"true" if more else b"false",
                b"}",
            ]
        )
        return json_response(200, body)

    async def recording(self, request: web.Request) -> web.Response:
        """A page of the session's recording: JSON Lines from byte ``offset`` (0, or where
        a line starts), at most ``PAGE_BYTES`` or one longer line; ``X-Next-Offset`` and
        ``X-Has-More`` (and a ``Link rel="next"``) say where the next page starts."""
        _, sid, meta = await self._owned(request)
        offset = query_int(request, "offset", 0, 0, 1 << 40)
        read = self.node.store.read_recording
        page, size, problem = await read_recording_page(read, sid, offset, PAGE_BYTES)
        if size == 0 and RECORDING not in meta:
            raise Refusal(
                404,
                f"session {sid[:100]!r} is not recorded: record it with configure "
                '{"record": true} (or "record": true when making it), a key policy\'s '
                "record = true, or serve --record",
            )
        if problem is not None:  # pages start at line starts only: see read_recording_page
            raise Refusal(400, f"{problem}: start at 0, then at each page's X-Next-Offset")
        following = offset + len(page)
        more = following < size
        headers = {"X-Next-Offset": str(following), "X-Has-More": "true" if more else "false"}
        if more:
            headers["Link"] = f'<{API_PREFIX}/{sid}/recording?offset={following}>; rel="next"'
        return web.Response(body=page, content_type="application/x-ndjson", headers=headers)

    async def delete(self, request: web.Request) -> web.Response:
        key_id, sid, _ = await self._owned(request)
        await self.node.delete_session(sid)
        await self.node.store.release_bytes(CONFIG_QUOTA.format(key=key_id), sid)
        log.info("session %s deleted through the HTTP API", sid, extra={"sid": sid})
        return web.Response(status=http.HTTPStatus.NO_CONTENT)


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _float(value: str | None) -> float:
    try:
        return float(value or 0)
    except ValueError:
        return 0.0
