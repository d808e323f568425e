"""The gateway's production edges, as one object the server calls at its seams.

``Gateway`` (``gateway.edge.server``) owns an ``Edges`` and calls it in four places:
``admit`` in the HTTP handshake (origin, auth, connection limits), its
``select_subprotocol`` for ``serve``, ``start`` and ``close``. Everything the
edges decide lives here and in ``gateway.edge.auth``, ``gateway.sessions.limits`` and
``gateway.edge.backpressure``, so the server, connection and session code carry
one-line hooks only.

Until a connection authenticates it counts in ``pending``
(``gateway.edge.pending``), which bounds how many one address, and all of
them, may hold.

Handshake checks, in order, each refusal an HTTP status whose body says what
to do: node at ``max_connections`` → 503 (try another node); ``Origin`` not
allowed → 403 (see ``origin_allowed``); no or unknown API key → 401 (how to send one); the key at
``max_connections_per_key`` → 429 (close one). Connection slots are taken once
a handshake passes those checks and given back when its TCP connection closes,
however the handshake or the session ended: one watcher per connection awaits
the close, so no path can leak a slot.

After the handshake, the rights watch (``gateway.edge.rights``) keeps each
connection's key under watch: a connection whose key is revoked is closed
with 4401 within ``RIGHTS_CHECK`` seconds, and a key policy that changed is
applied to the sessions this node drives (``Node.policies_changed``).
"""

from __future__ import annotations

import asyncio
import http
import ipaddress
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers, MultipleValuesError
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from gateway.config import Config, ConfigError
from gateway.edge.auth import (
    ANONYMOUS,
    HOW_TO_AUTHENTICATE,
    SUBPROTOCOL,
    KeyFile,
    KeyId,
    KeyStoreUnavailable,
    RedisKeys,
    auth_configured,
    check_exposure,
    credentials_from,
    hash_key,
    is_loopback,
)
from gateway.edge.client_tokens import ClientTokens
from gateway.edge.health import descriptor_limit
from gateway.edge.pending import PendingConnections
from gateway.edge.reaper import SlowClientReaper
from gateway.edge.rights import Credential, KeyRights, Revocable, RightsWatch
from gateway.edge.tokens import TokenRefused, is_client_token
from gateway.sessions.limits import ConnectionSlots
from gateway.sessions.port import NodePort
from gateway.store.base import StoreError, StoreUnavailable

__all__ = ["Edges", "Principal", "parse_origins"]

log = logging.getLogger("gateway.edge.admission")

_REALM: Final = 'Bearer realm="realtime-gateway"'


ANY_ORIGIN: Final = "*"


def parse_origins(value: str) -> frozenset[str]:
    """``https://a.example, https://b.example`` → the normalized set (``*``: any)."""
    return frozenset(o.strip().rstrip("/").lower() for o in value.split(",") if o.strip())


def _host_port(origin: str) -> tuple[str, int] | None:
    """An ``http(s)://host[:port]`` origin's host (brackets stripped) and port."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
        return None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def origin_allowed(
    origin: str,
    allowed: frozenset[str],
    *,
    auth_on: bool,
    local_address: tuple[str, int] | None,
) -> bool:
    """Whether a browser page of ``origin`` (normalized) may open a WebSocket here.

    Browsers attach no credential to a WebSocket by themselves, but a node
    that runs open (no keys) has none to check: any page the developer visits
    could drive it (cross-site WebSocket hijacking). So:

    - the allow-list decides when set (``*`` accepts any origin);
    - without one, an open node accepts loopback origins only
      (``http(s)://localhost|127.x|[::1]``, any port: the developer's own
      pages), and a node with keys any origin (the page must present a key);
    - the node's own page is always accepted: an origin whose host is the IP
      address the connection arrived on (or a loopback name, when it arrived
      on loopback) and whose port is that connection's port.

    Never compared with the request's ``Host`` header: under DNS rebinding a
    page of ``http://evil.example`` whose name now points at 127.0.0.1 sends a
    matching ``Host``. Its origin is a name, not the address, so it fails every
    rule above.
    """
    if ANY_ORIGIN in allowed or origin in allowed:
        return True
    parsed = _host_port(origin)
    if parsed is None:
        return False  # "null" (sandboxed frames, file: pages) or not an origin
    host, port = parsed
    if local_address is not None and port == local_address[1]:
        local_ip = local_address[0]
        if host == local_ip or (is_loopback(host) and is_loopback(local_ip)):
            return True
    if allowed:
        return False
    return auth_on or is_loopback(host)


def validate(config: Config) -> None:
    """What the declared ranges cannot say; ``ConfigError`` names the setting and the fix.

    The edge settings' ranges are declared on their ``Config`` fields (and
    checked when a ``Config`` is built); the origins need parsing.
    """
    for origin in parse_origins(config.allowed_origins):
        if origin == ANY_ORIGIN:
            continue
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
            raise ConfigError(
                f"allowed_origins: {origin!r} is not an origin: write scheme://host[:port], "
                "e.g. https://app.example.com"
            )


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a handshake is: the key id that owns what it does, and what it may open.

    ``session`` is set for a client token: it opens that session and no
    other, and it may not change the session's configuration. ``digest`` is
    the SHA-256 of the API key behind it (presented, or named by the token;
    "" with auth off): the connection lives as long as that key.
    """

    key: str
    session: str | None = None
    digest: str = ""
    approve: bool = False  # a client token minted with the right to approve calls
    configure: bool = False  # one minted with the right to configure (an ephemeral key)


class _Admitted:
    """What one admitted handshake holds until its connection closes."""

    __slots__ = ("key", "slot")

    def __init__(self, key: str) -> None:
        self.key = key
        self.slot: str | None = None


class Edges:
    """Origin, auth and connection limits at the handshake; slow clients after it.

    Raises ``ConfigError`` when the settings cannot be served safely (see
    ``gateway.edge.auth.check_exposure``) or a keys file is unreadable.
    """

    def __init__(self, config: Config, node: NodePort, connections: Collection[Revocable]) -> None:
        validate(config)
        check_exposure(config)
        self.config = config
        self.node = node
        self.metrics = node.metrics
        self.auth_on = auth_configured(config)
        self.key_file = KeyFile(config.api_keys_file) if config.api_keys_file else None
        self.redis_keys = RedisKeys(node.store) if config.api_keys_redis else None
        self.origins = parse_origins(config.allowed_origins)
        self.slots = ConnectionSlots(node.store, node.node_id, config.max_connections_per_key)
        self.reaper = SlowClientReaper(connections, config.slow_client_timeout, node.metrics)
        self.limits = node.limits
        self.key_tools = node.key_tools  # per-key allow-lists, stored with new sessions
        self.tokens = ClientTokens(config, node.store)
        # Whether keys are still issued; closes the connections of revoked ones.
        self.rights = KeyRights(self.key_file, self.redis_keys)
        self.watch = RightsWatch(self.rights, node.store, connections, on_tick=self._reread)
        self._policies_seen = (node.policies.version, node.setups.guardrails.version)
        # Connections of both ports that have not authenticated yet (slow or stalled requests).
        limit = descriptor_limit()
        self.pending = PendingConnections(
            config.unauthenticated_per_address,
            max(64, limit // 2) if limit is not None else 0,
            on_close=lambda reason: self.metrics.clients.refused.labels(reason).inc(),
        )
        self.open = 0  # admitted connections not yet closed (the per-node limit)
        self._watchers: set[asyncio.Task[None]] = set()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.reaper.start()
        if self.key_file is not None:
            log.info("api keys file %s: %d keys", self.key_file.path, len(self.key_file))
        # Its ticks re-read the key policy and guardrails files (``_reread``): a file alone,
        # with no keys to check, still reaches the live sessions within a tick.
        files = (self.node.policies.path, self.node.setups.guardrails.path)
        if self.auth_on or any(path is not None for path in files):
            self.watch.start()

    async def close(self) -> None:
        """Stop the background work; give back slots of connections still closing.

        Idempotent: a drain closes the edges and the gateway's close does again.
        """
        if self._closed:
            return
        self._closed = True
        await self.watch.close()
        await self.reaper.close()
        if self._watchers:
            await asyncio.wait(set(self._watchers), timeout=5.0)
        for watcher in list(self._watchers):
            watcher.cancel()
        await self.slots.close()
        await self.limits.close()
        if self.redis_keys is not None:
            await self.redis_keys.close()

    def reload_keys(self) -> None:
        """SIGHUP: re-read the keys file now and close the connections of keys it
        no longer holds (Redis keys are always read live)."""
        if self.key_file is not None:
            self.key_file.reload()
        self.watch.look_now()

    def _reread(self) -> None:
        """Before each look of the rights watch: the files, if they changed."""
        if self.key_file is not None:
            self.key_file.poll()
        # The key policies and the guardrails file: a change sets live sessions up again.
        seen = (self.node.policies.poll(), self.node.setups.guardrails.poll())
        if seen != self._policies_seen:
            self._policies_seen = seen
            self.node.policies_changed()

    # ------------------------------------------------------------------ handshake

    def select_subprotocol(
        self, connection: ServerConnection, offered: Sequence[Subprotocol]
    ) -> Subprotocol | None:
        """Select ``rtgw.v1`` when offered; never a ``rtgw.bearer.KEY`` (that is a key).

        Clients that offer nothing get none, as before.
        """
        return Subprotocol(SUBPROTOCOL) if SUBPROTOCOL in offered else None

    async def admit(
        self,
        connection: ServerConnection,
        request: Request,
        on_close: Callable[[], object] | None = None,
    ) -> Response | Principal:
        """The principal of an acceptable handshake, or the refusal to send.

        ``on_close`` runs when the connection closes, however it ended (the
        server forgets its handshake state there).
        """
        cfg = self.config
        if 0 < cfg.max_connections <= self.open:
            return self._refuse(
                "node_full",
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"this node is at its limit of {cfg.max_connections} connections; "
                "connect to another node, or retry in a few seconds\n",
            )
        refusal = self._check_origin(connection, request.headers)
        if refusal is not None:
            return refusal
        principal = await self._authenticate(request)
        if isinstance(principal, Response):
            return principal
        self.pending.settled(connection.transport)
        admitted = _Admitted(principal.key)
        self.open += 1
        if self.auth_on:
            self.watch.track(connection, Credential(principal.key, principal.digest))
        watcher = asyncio.create_task(self._watch(connection, admitted, on_close))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        if self.slots.active:
            try:
                slot = await self.slots.acquire(principal.key)
            except StoreError as exc:
                return self._store_down(
                    f"connection slots unavailable: {exc}",
                    "the session store is unavailable; retry in a few seconds",
                )
            if slot is None:
                return self._refuse(
                    "key_full",
                    http.HTTPStatus.TOO_MANY_REQUESTS,
                    f"this API key already has {cfg.max_connections_per_key} open connections, "
                    "its limit; close one (or wait for it to end) and connect again, or ask "
                    "the operator for a higher limit\n",
                )
            admitted.slot = slot
        return principal

    async def _watch(
        self,
        connection: ServerConnection,
        admitted: _Admitted,
        on_close: Callable[[], object] | None,
    ) -> None:
        try:
            await connection.wait_closed()
        finally:
            self.watch.untrack(connection)
            self.open -= 1
            if on_close is not None:
                on_close()
            if admitted.slot is not None:
                await self.slots.release(admitted.key, admitted.slot)

    def _check_origin(self, connection: ServerConnection, headers: Headers) -> Response | None:
        try:
            origin = headers.get("Origin")
        except MultipleValuesError:
            origin = ""  # a browser sends one: refuse whatever sent several
        if origin is None:
            return None  # not a browser: browsers always send Origin on a WebSocket
        normalized = origin.strip().rstrip("/").lower()
        if origin_allowed(
            normalized,
            self.origins,
            auth_on=self.auth_on,
            local_address=_local_address(connection),
        ):
            return None
        if self.origins:
            how = "the page must be served from one of the origins the operator allowed"
        else:
            how = (
                "this node runs without API keys, so only pages from this machine "
                "(http://localhost, 127.0.0.1, [::1]) may connect"
            )
        return self._refuse(
            "origin",
            http.HTTPStatus.FORBIDDEN,
            f"origin {origin[:200]!r} may not connect to this gateway; {how} "
            "(the operator can allow it with --allowed-origins)\n",
        )

    async def key_id(self, key: str) -> KeyId | None:
        """The key id of an API key, None if it is not one (``KeyStoreUnavailable``: ask later).

        The key's allow-list of tools (``tools=``) is noted in ``key_tools``,
        where the node takes it for the sessions this key makes. The id
        carries the key's digest, so a client token minted for it names the key.
        """
        digest = hash_key(key)
        key_id = self.key_file.lookup(digest) if self.key_file is not None else None
        allowed = self.key_file.tools_for(key_id) if self.key_file and key_id else None
        if key_id is None and self.redis_keys is not None:
            found = await self.redis_keys.lookup(digest)
            if found is not None:
                key_id, allowed = found
        if key_id is None:
            return None
        self.key_tools.see(key_id, allowed)
        return KeyId(key_id, digest)

    async def caller(self, request: Request) -> Response | None:
        """The refusal of a request whose credentials are no valid key or client token
        (None: they are). A route that holds something for its caller (a WebRTC call's
        slot, the wait for its body) asks this first: nobody unknown holds anything."""
        principal = await self._authenticate(request)
        return principal if isinstance(principal, Response) else None

    async def _authenticate(self, request: Request) -> Principal | Response:
        creds = credentials_from(request.headers, request.path)
        if creds.key is not None and is_client_token(creds.key):
            return await self._check_token(creds.key)
        if not self.auth_on:
            return Principal(ANONYMOUS)
        if creds.problem:
            return self._refuse(
                "unauthorized",
                http.HTTPStatus.UNAUTHORIZED,
                f"{creds.problem}; {HOW_TO_AUTHENTICATE}\n",
            )
        if creds.key is None:
            return self._refuse(
                "unauthorized",
                http.HTTPStatus.UNAUTHORIZED,
                f"an API key is required: {HOW_TO_AUTHENTICATE}\n",
            )
        if creds.via == "query" and not self.config.allow_keys_in_urls:
            return self._refuse(
                "unauthorized",
                http.HTTPStatus.UNAUTHORIZED,
                "this gateway does not accept API keys in URLs (?token=KEY): a URL ends up in "
                "browser history and access logs. Let the app's backend make the session "
                "(POST /v1/sessions) and connect with its client_token (?token=CLIENT_TOKEN), "
                "or send the key in the Authorization header\n",
            )
        try:
            key_id = await self.key_id(creds.key)
        except KeyStoreUnavailable as exc:
            return self._store_down(
                f"cannot check API keys: Redis unavailable: {exc}",
                "API keys cannot be checked right now (the key store is unavailable); "
                "retry in a few seconds",
            )
        if key_id is None:
            return self._refuse(
                "unauthorized",
                http.HTTPStatus.UNAUTHORIZED,
                f"this API key is not valid (mistyped, or revoked): {HOW_TO_AUTHENTICATE}\n",
            )
        return Principal(key_id, digest=key_id.digest)

    async def _check_token(self, token: str) -> Principal | Response:
        try:
            claims = await self.tokens.verify(token)
        except StoreUnavailable as exc:
            return self._store_down(
                f"cannot check a client token: store unavailable: {exc}",
                "client tokens cannot be checked right now (the session store is unavailable); "
                "retry in a few seconds",
            )
        if isinstance(claims, TokenRefused):
            return self._refuse("unauthorized", http.HTTPStatus.UNAUTHORIZED, claims.message + "\n")
        if self.auth_on:
            try:
                issued = await self.rights.alive(Credential(claims.key, claims.kd))
            except KeyStoreUnavailable as exc:
                return self._store_down(
                    f"cannot check a client token's API key: Redis unavailable: {exc}",
                    "client tokens cannot be checked right now (the key store is unavailable); "
                    "retry in a few seconds",
                )
            if not issued:
                return self._refuse(
                    "unauthorized",
                    http.HTTPStatus.UNAUTHORIZED,
                    "the API key that minted this client token has been revoked, so the token "
                    "opens nothing any more; the app's backend needs a valid API key to mint a "
                    "new one\n",
                )
        return Principal(
            claims.key, claims.sid, digest=claims.kd, approve=claims.ap, configure=claims.cf
        )

    def _store_down(self, logged: str, body: str) -> Response:
        """A handshake the store's outage refuses: counted, logged, 503 with ``body``."""
        self.metrics.store_errors.inc()
        log.warning("%s", logged)
        return self._refuse("store", http.HTTPStatus.SERVICE_UNAVAILABLE, body + "\n")

    def _refuse(self, reason: str, status: http.HTTPStatus, body: str) -> Response:
        self.metrics.clients.refused.labels(reason).inc()
        headers = Headers([("Content-Type", "text/plain; charset=utf-8")])
        if status == http.HTTPStatus.UNAUTHORIZED:
            headers["WWW-Authenticate"] = _REALM
        elif status in (http.HTTPStatus.TOO_MANY_REQUESTS, http.HTTPStatus.SERVICE_UNAVAILABLE):
            headers["Retry-After"] = "5"
        return Response(status.value, status.phrase, headers, body.encode())


def _local_address(connection: ServerConnection) -> tuple[str, int] | None:
    """The IP address and port this TCP connection arrived on (not the Host header)."""
    sockname = connection.transport.get_extra_info("sockname")
    if not isinstance(sockname, tuple) or len(sockname) < 2:
        return None
    try:
        ip = ipaddress.ip_address(str(sockname[0]).split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(sockname[1])
