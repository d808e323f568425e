"""The browser client page: ``/`` and its assets under ``/static/``.

The page is three static files shipped as package data (``gateway/edge/web/static``),
so any node serves it with no build step and no CDN. Only the files named in
``_ASSETS`` are served: a request path is looked up in that table, never joined
onto a filesystem path, so no path can reach another file.
"""

from __future__ import annotations

import functools
import http
from importlib import resources
from typing import Final

from websockets.datastructures import Headers
from websockets.http11 import Response

__all__ = ["CONTENT_SECURITY_POLICY", "static_response"]

# Same-origin scripts and styles only, no inline code, no frames, no plugins.
# connect-src names ws:/wss: as well as 'self' because browsers before CSP
# level 3 do not count a WebSocket to the page's own host as 'self'.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; "
    "script-src 'self'; "
    "style-src 'self'; "
    "img-src 'self' data:; "
    "connect-src 'self' ws: wss:; "
    "base-uri 'none'; "
    "form-action 'none'; "
    "frame-ancestors 'none'"
)

# URL path → (file in static/, Content-Type).
_ASSETS: Final[dict[str, tuple[str, str]]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
    # The microphone's AudioWorklet (PCM16 frames from the page's mic button).
    "/static/mic-worklet.js": ("mic-worklet.js", "text/javascript; charset=utf-8"),
    # The JavaScript client library (an ES module; the page imports it too).
    "/client.js": ("client.js", "text/javascript; charset=utf-8"),
    "/client.d.ts": ("client.d.ts", "text/plain; charset=utf-8"),
}


@functools.cache
def _body(name: str) -> bytes:
    """A static file's bytes, read once (importlib.resources works from a wheel too)."""
    return resources.files(__name__).joinpath("static", name).read_bytes()


def static_response(path: str) -> Response | None:
    """The HTTP response for a page path, or None when ``path`` is not one of ours."""
    asset = _ASSETS.get(path)
    if asset is None:
        return None
    name, content_type = asset
    body = _body(name)
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            # Revalidate on every load: a node upgrade must not leave an old
            # app.js talking to a newer protocol.
            ("Cache-Control", "no-cache"),
            ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            # websockets closes the TCP connection after any non-101 response.
            ("Connection", "close"),
        ]
    )
    return Response(http.HTTPStatus.OK.value, http.HTTPStatus.OK.phrase, headers, body)
