"""Opening an upstream WebSocket, with failures turned into ``UpstreamClosed``.

Every provider adapter connects the same way (no compression: deflate costs
CPU on every token; a generous frame limit; a short close timeout so closing
a dead upstream does not block), and every way a connect can fail becomes one
``UpstreamClosed`` whose reason says what happened. Only the message for an
HTTP refusal is the provider's: it knows which key or setting to name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from gateway.upstream.base import UpstreamClosed
from gateway.wsfast import FastReadClientConnection

__all__ = ["CLOSE_TIMEOUT", "MAX_FRAME", "dial", "websocket_url"]

# Provider frames are small; this only guards against a runaway peer.
MAX_FRAME: Final = 64 * 2**20
# Seconds to wait for a close handshake before dropping the TCP connection.
CLOSE_TIMEOUT: Final = 2.0
# Handshake refusals that connecting again will not fix: key, access, model or
# endpoint, quota (a provider's 429 at the handshake is its quota or its limit
# on connections; a fallback provider serves better than a retry 0.2 s later).
_REFUSALS: Final = frozenset({401, 403, 404, 429})


def websocket_url(url: str) -> str:
    """``url`` with an ``http``/``https`` scheme made ``ws``/``wss``.

    Provider documentation and SDKs give base URLs as ``https://…/v1`` (the
    official ``openai`` SDK swaps the scheme itself), so an operator pasting
    one must not get a gateway that cannot dial."""
    scheme, sep, rest = url.partition("://")
    lowered = scheme.lower()
    if sep and lowered in ("http", "https"):
        return ("ws" if lowered == "http" else "wss") + "://" + rest
    return url


async def dial(
    url: str,
    headers: Mapping[str, str],
    *,
    label: str,
    connect_timeout: float,
    rejection: Callable[[InvalidStatus], str],
) -> ClientConnection:
    """Connect to ``url`` (``http(s)`` taken as ``ws(s)``); ``label`` names the
    API in error messages."""
    url = websocket_url(url)
    try:
        return await connect(
            url,
            additional_headers=dict(headers),
            compression=None,
            max_size=MAX_FRAME,
            open_timeout=connect_timeout,
            close_timeout=CLOSE_TIMEOUT,
            create_connection=FastReadClientConnection,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        raise UpstreamClosed(rejection(exc), retryable=status not in _REFUSALS) from exc
    except InvalidURI as exc:
        # Connecting again cannot fix a malformed URL: fail over or fail the turn.
        raise UpstreamClosed(
            f"bad {label} URL {url!r}: {exc}; give a ws://, wss://, http:// or https:// URL",
            retryable=False,
        ) from exc
    except InvalidHandshake as exc:
        raise UpstreamClosed(f"WebSocket handshake with {url} failed: {exc}") from exc
    except TimeoutError as exc:
        raise UpstreamClosed(f"connecting to {url} timed out after {connect_timeout:g}s") from exc
    except OSError as exc:
        raise UpstreamClosed(f"cannot connect to {url}: {exc}") from exc
