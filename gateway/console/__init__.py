"""The browser console at ``/`` and the JavaScript client library: files, served.

The console and the client library are static files shipped as package data
(``gateway/console/static``, also the npm package ``realtime-gateway-client``),
so any node serves them with no build step and no CDN. This room holds the
files and the one table of what is served; the edge asks it for a path's
response (``static_response``) and serves what it gets. Only the files named
in ``_ASSETS`` are served: a request path is looked up in that table, never
joined onto a filesystem path, so no path can reach another file.

It imports nothing of ours: which providers a node offers (``/node.json``)
and which origins may read the client (CORS) are the edge's
(``gateway.edge.web``).
"""

from __future__ import annotations

import functools
import http
from importlib import resources
from typing import Final

from websockets.datastructures import Headers
from websockets.http11 import Response

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "content_security_policy",
    "page_response",
    "static_response",
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
    "/static/openai-door.js": ("openai-door.js", _JS),
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


@functools.cache
def _body(name: str) -> bytes:
    """A static file's bytes, read once (importlib.resources works from a wheel too)."""
    return resources.files(__name__).joinpath("static", name).read_bytes()


def page_response(body: bytes, content_type: str, csp: str = CONTENT_SECURITY_POLICY) -> Response:
    """A 200 with the page's headers: its policy, no caching, no sniffing, then close."""
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
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
    return Response(http.HTTPStatus.OK.value, http.HTTPStatus.OK.phrase, headers, body)


def static_response(path: str, csp: str = CONTENT_SECURITY_POLICY) -> Response | None:
    """The HTTP response for a page path, or None when ``path`` is not one of ours."""
    asset = _ASSETS.get(path)
    if asset is None:
        return None
    name, content_type = asset
    return page_response(_body(name), content_type, csp)
