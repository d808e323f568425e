"""The browser console at ``/``, its assets, and what a page of another origin may fetch.

The console is static files shipped as package data (``gateway/edge/web/static``),
so any node serves it with no build step and no CDN. Only the files named in
``_ASSETS`` are served: a request path is looked up in that table, never joined
onto a filesystem path, so no path can reach another file.

``/node.json`` tells the console what this node offers (its providers and their
models, whether it needs a key, where its HTTP API listens), so the settings
panel offers only what a ``configure`` can get.

Cross-origin apps import the client from the gateway (``/client.js`` and its
modules ``/errors.js``, ``/socket.js``;
``/client.d.ts``) and check it is up (``/healthz``): those answer with CORS
headers for the pages that may open a WebSocket here (``cors_origin``), so a
page learns nothing from them that its handshake would not tell it.
"""

from __future__ import annotations

import functools
import http
from importlib import resources
from typing import Final

import msgspec
from websockets.datastructures import Headers
from websockets.http11 import Response

from gateway.config import Config
from gateway.edge.admission import origin_allowed
from gateway.upstream import providers

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "CORS_PATHS",
    "NODE_PATH",
    "NodeOffer",
    "ProviderOffer",
    "content_security_policy",
    "cors_origin",
    "node_response",
    "offer_of",
    "static_response",
    "with_cors",
]

# Same-origin scripts and styles only, no inline code, no frames, no plugins.
# connect-src names ws:/wss: as well as 'self' because browsers before CSP
# level 3 do not count a WebSocket to the page's own host as 'self'.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; "
    "script-src 'self'; "
    "style-src 'self'; "
    "img-src 'self' data: blob:; "
    "media-src 'self' blob:; "
    "connect-src 'self' ws: wss:; "
    "base-uri 'none'; "
    "form-action 'none'; "
    "frame-ancestors 'none'"
)


def content_security_policy(api_port: int | None) -> str:
    """The page's policy; with an HTTP API on its own port, the console may call it
    (delete a session) on whatever host the page was reached by."""
    if not api_port:
        return CONTENT_SECURITY_POLICY
    api = f"http://*:{api_port} https://*:{api_port}"
    return CONTENT_SECURITY_POLICY.replace(
        "connect-src 'self' ws: wss:", f"connect-src 'self' ws: wss: {api}"
    )


_JS: Final = "text/javascript; charset=utf-8"

# URL path → (file in static/, Content-Type).
_ASSETS: Final[dict[str, tuple[str, str]]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
    # The console's modules: app.js wires the rest.
    "/static/app.js": ("app.js", _JS),
    "/static/conversation.js": ("conversation.js", _JS),
    "/static/inspector.js": ("inspector.js", _JS),
    "/static/recording.js": ("recording.js", _JS),
    "/static/settings.js": ("settings.js", _JS),
    "/static/voice.js": ("voice.js", _JS),
    "/static/markdown.js": ("markdown.js", _JS),
    "/static/dom.js": ("dom.js", _JS),
    # The microphone's AudioWorklet (PCM16 frames and a level for the meter).
    "/static/mic-worklet.js": ("mic-worklet.js", _JS),
    # The JavaScript client library (an ES module; the console imports it too).
    "/client.js": ("client.js", _JS),
    # Its modules, imported by client.js relative to itself (so also cross-origin).
    "/errors.js": ("errors.js", _JS),
    "/socket.js": ("socket.js", _JS),
    "/client.d.ts": ("client.d.ts", "text/plain; charset=utf-8"),
}

CORS_PATHS: Final = frozenset(
    {"/client.js", "/errors.js", "/socket.js", "/client.d.ts", "/healthz"}
)
"""What a page of another origin may read: the client library and liveness."""

NODE_PATH: Final = "/node.json"


@functools.cache
def _body(name: str) -> bytes:
    """A static file's bytes, read once (importlib.resources works from a wheel too)."""
    return resources.files(__name__).joinpath("static", name).read_bytes()


def _headers(content_type: str, length: int, csp: str) -> Headers:
    return Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(length)),
            # Revalidate on every load: a node upgrade must not leave an old
            # app.js talking to a newer protocol.
            ("Cache-Control", "no-cache"),
            ("Content-Security-Policy", csp),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            # websockets closes the TCP connection after any non-101 response.
            ("Connection", "close"),
        ]
    )


def static_response(path: str, csp: str = CONTENT_SECURITY_POLICY) -> Response | None:
    """The HTTP response for a page path, or None when ``path`` is not one of ours."""
    asset = _ASSETS.get(path)
    if asset is None:
        return None
    name, content_type = asset
    body = _body(name)
    headers = _headers(content_type, len(body), csp)
    return Response(http.HTTPStatus.OK.value, http.HTTPStatus.OK.phrase, headers, body)


# ---------------------------------------------------------------------- the node's offer


class ProviderOffer(msgspec.Struct, frozen=True):
    """One provider a session may pick: its default model and the models known for it."""

    name: str
    label: str
    default_model: str
    models: tuple[str, ...]
    wire: str


class NodeOffer(msgspec.Struct, frozen=True):
    """What ``/node.json`` says: the console's settings panel is built from it."""

    provider: str
    providers: tuple[ProviderOffer, ...]
    auth: bool
    api_port: int | None


def offer_of(config: Config, *, auth: bool) -> NodeOffer:
    """The node's offer: its own providers (first the default), then those with a key.

    ``sim`` is offered only by a node whose own provider it is (it runs in-process).
    """
    own = config.providers
    keyed = (row.name for row in providers.PROVIDERS if config.upstream(row.name).api_key)
    rows: list[ProviderOffer] = []
    for name in [*own, *(n for n in keyed if n not in own)]:
        if name == providers.SIM:
            flavor = config.sim.flavor
            label = f"built-in simulator ({flavor} wire)"
            rows.append(ProviderOffer(name, label, "sim", ("sim",), flavor))
            continue
        row = providers.by_name(name)
        rows.append(ProviderOffer(name, row.label, row.default_model, row.served(), row.wire))
    return NodeOffer(own[0], tuple(rows), auth, config.api_port)


def node_response(offer: NodeOffer) -> Response:
    body = msgspec.json.encode(offer)
    headers = _headers("application/json", len(body), CONTENT_SECURITY_POLICY)
    return Response(http.HTTPStatus.OK.value, http.HTTPStatus.OK.phrase, headers, body)


# ---------------------------------------------------------------------- CORS


def cors_origin(origin: str | None, allowed: frozenset[str], *, auth_on: bool) -> str | None:
    """The ``Access-Control-Allow-Origin`` for a page of ``origin``, or None.

    The same rule as the WebSocket's (``origin_allowed``): ``--allowed-origins``
    when set; without it, loopback pages of an open node, any page of a node
    with keys. The node's own page is same-origin and needs no CORS.
    """
    if origin is None:
        return None
    normalized = origin.strip().rstrip("/").lower()
    if origin_allowed(normalized, allowed, auth_on=auth_on, local_address=None):
        return origin.strip()
    return None


def with_cors(response: Response, allow: str | None) -> Response:
    """``response`` with CORS headers for ``allow`` (an origin), unchanged for None."""
    response.headers["Vary"] = "Origin"
    if allow is not None:
        response.headers["Access-Control-Allow-Origin"] = allow
    return response
