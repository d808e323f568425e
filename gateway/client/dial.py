"""One connection to the gateway: the URL, the handshake, and what a failure means.

Every client program dials the same way (``Client``, ``gateway chat``,
``gateway loadtest``), so the decisions live here once: which URLs are
corrected (``http://`` → ``ws://``, a bare host gets ``/v1/realtime``), which
handshake statuses are final (400/401/403/404: retrying cannot help, the
server's text says what to do) or worth retrying (429/503), and which close
codes mean "reconnect with ``session_id`` and ``after``".
"""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import Any, Final
from urllib.parse import urlencode, urlsplit, urlunsplit

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from protocol.events import Session, decode_event

__all__ = [
    "DEFAULT_PATH",
    "FINAL_CLOSE_CODES",
    "FINAL_STATUSES",
    "NO_PROXY",
    "TOKEN_ENV",
    "BadUrl",
    "ClientError",
    "ConnectionLost",
    "Refused",
    "Unreachable",
    "normalize_url",
    "open_connection",
    "token_from_env",
    "with_query",
]

DEFAULT_PATH: Final = "/v1/realtime"

TOKEN_ENV: Final = "GATEWAY_TOKEN"
"""The environment variable the command-line clients read an API key (or client
token) from when ``--token`` is not given: a command line is visible to every
process on the machine (``ps``), a process's environment only to its user."""

FINAL_STATUSES: Final = frozenset({400, 401, 403, 404})
"""Handshake statuses a retry cannot fix (bad ``after``, key, origin, unknown session)."""

FINAL_CLOSE_CODES: Final = frozenset({1002, 1003, 1007, 1008, 1009, 1010, 4401, 4404})
"""Close codes that say the client itself is wrong: reconnecting would repeat it.

4401 (the key was revoked) and 4404 (the session was deleted) say reconnecting
is refused. Everything else — 1006 (connection lost), 1011, 1012 (node draining, session
moved), 1013 (store unavailable: retry later), 4008 (client too slow) — is
answered by reconnecting with ``session_id`` and ``after``.
"""

# websockets >= 15 reads proxy settings from the environment; a client of a
# loopback gateway must never go through a proxy.
NO_PROXY: Final[dict[str, Any]] = (
    {"proxy": None} if "proxy" in inspect.signature(connect.__init__).parameters else {}
)


class ClientError(Exception):
    """A gateway client cannot go on; the message says why and what to do."""


class BadUrl(ClientError):
    """The URL cannot name a gateway endpoint."""


class Refused(ClientError):
    """The gateway refused the handshake with ``status``; ``message`` is its text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"the gateway refused the connection: HTTP {status} {message}".strip())
        self.status = status
        self.message = message

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


class Unreachable(ClientError):
    """Nothing answered at the URL (refused, unresolvable, timed out, not a WebSocket)."""


class ConnectionLost(ClientError):
    """The connection dropped and reconnecting failed for longer than the client allows."""


def normalize_url(url: str) -> tuple[str, str | None]:
    """The WebSocket URL to dial for what a user typed, and a note if it was changed.

    ``http(s)://`` becomes ``ws(s)://``, a missing scheme is ``ws://``, and an
    empty path is ``/v1/realtime``. Raises ``BadUrl`` for other schemes or no host.
    """
    text = url.strip()
    if "://" not in text:
        text = "ws://" + text
    parts = urlsplit(text)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise BadUrl(f"{url!r} is not a gateway URL: use ws://HOST:PORT{DEFAULT_PATH} (or wss://)")
    if not parts.hostname:
        raise BadUrl(f"{url!r} has no host: use ws://HOST:PORT{DEFAULT_PATH}")
    path = parts.path if parts.path not in ("", "/") else DEFAULT_PATH
    fixed = urlunsplit((scheme, parts.netloc, path, parts.query, ""))
    return fixed, (None if fixed == url else f"using {fixed}")


def token_from_env() -> str | None:
    """The key in ``TOKEN_ENV`` (None: unset or empty)."""
    return os.environ.get(TOKEN_ENV) or None


def with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` added to its query (existing parameters kept)."""
    parts = urlsplit(url)
    query = "&".join(p for p in (parts.query, urlencode(params)) if p)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


async def open_connection(
    url: str,
    *,
    token: str | None = None,
    session_id: str | None = None,
    after: int | None = None,
    open_timeout: float = 10.0,
    max_size: int | None = 16 * 2**20,
    user_agent: str | None = "realtime-gateway-client",
) -> tuple[ClientConnection, Session]:
    """Dial ``url`` (resuming ``session_id`` after seq ``after``) and read its ``session`` frame.

    Raises ``Refused`` (an HTTP status; check ``.final``), ``Unreachable``, or
    ``ConnectionClosed`` if the connection drops before the session frame.
    """
    params: dict[str, str] = {}
    if session_id is not None:
        params["session_id"] = session_id
        if after is not None:
            params["after"] = str(after)
    target = with_query(url, **params) if params else url
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        ws = await connect(
            target,
            additional_headers=headers,
            user_agent_header=user_agent,
            open_timeout=open_timeout,
            max_size=max_size,
            **NO_PROXY,
        )
    except InvalidStatus as exc:
        response = exc.response
        body = response.body.decode("utf-8", "replace").strip() if response.body else ""
        raise Refused(response.status_code, body or response.reason_phrase) from None
    except InvalidURI as exc:
        raise BadUrl(str(exc)) from None
    except TimeoutError:
        raise Unreachable(f"no WebSocket handshake from {url} within {open_timeout:g}s") from None
    except ConnectionRefusedError:
        raise Unreachable(
            f"nothing is listening at {url}: is the gateway running? (start it: gateway serve)"
        ) from None
    except InvalidHandshake as exc:
        raise Unreachable(f"{url} did not answer as a WebSocket server ({exc})") from None
    except OSError as exc:
        raise Unreachable(f"cannot reach {url}: {exc.strerror or exc}") from None
    try:
        async with asyncio.timeout(open_timeout):
            first = decode_event(await ws.recv(decode=False))
    except (msgspec.DecodeError, msgspec.ValidationError):
        ws.transport.abort()
        raise Unreachable(f"{url} is not a gateway: its first frame is not an event") from None
    except TimeoutError:
        ws.transport.abort()
        raise Unreachable(f"{url} sent no session frame within {open_timeout:g}s") from None
    except BaseException:
        ws.transport.abort()
        raise
    if not isinstance(first, Session):
        ws.transport.abort()
        raise Unreachable(f"{url} is not a gateway: its first frame was {first.__class__.__name__}")
    return ws, first
