"""What an HTTP request brings to the API, read within limits, and the refusals that
say what to do.

A body is read only after its caller is known (``HttpApi._key_id`` first), its
size is checked on the bytes as sent (``Content-Length`` before any is read),
and a compressed one is inflated off the loop, to at most ``MAX_BODY``: a
971 KB gzip body that inflates to 1 GB once held a node for seconds. Every
refusal is ``{"error": {"code", "message", "type", "param"}}`` with a 4xx status, raised as
``Refusal`` in a handler and answered by the API's middleware.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from websockets.http11 import Request, Response

from protocol.configuration import MAX_SCHEMA_DEPTH
from protocol.json_outline import too_many_values

__all__ = [
    "HTTP_LOG",
    "MAX_BODY",
    "ApiError",
    "Caller",
    "ErrorBody",
    "Owns",
    "Refusal",
    "body_encoding",
    "error_response",
    "given_twice",
    "inflate",
    "json_response",
    "query_int",
    "read_body",
    "split_target",
    "too_large",
]


def split_target(target: str) -> tuple[str, str]:
    """A request line's target as its path and its query.

    The target is a path (origin form); ``urlsplit`` reads ``//etc/passwd`` as the host
    ``etc`` and the path ``/passwd``, which routed and named a path nobody asked for."""
    path, _, query = target.partition("?")
    return path, query


def given_twice(query: dict[str, list[str]], names: tuple[str, ...]) -> str | None:
    """The refusal of a query that gives one of ``names`` more than once, differently.

    The last one silently won: which session a client joined and which position it
    resumed from were the query's order, not what it meant."""
    twice = next((n for n in names if len(set(query.get(n, ()))) > 1), None)
    return (
        f"{twice} is given more than once, with different values: give it once" if twice else None
    )


MAX_BODY: Final = 1 << 20  # bytes; a configuration is at most ~300 KB (64 tools of 4 KB)
_ENCODINGS: Final = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": 0}
_encode: Final = msgspec.json.Encoder().encode


class ApiError(msgspec.Struct, frozen=True):
    """``code`` and ``message`` are the gateway's; ``type`` and ``param`` complete OpenAI's
    error shape, so the OpenAI door's HTTP answers (``client_secrets``, calls) read as
    its SDK expects them (``openai.APIError``'s ``type``, ``param``)."""

    code: str
    message: str
    type: str = "invalid_request_error"
    param: str | None = None


class ErrorBody(msgspec.Struct, frozen=True):
    error: ApiError


_CODES: Final = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    413: "too_large",
    415: "unsupported_media_type",
    429: "quota_exceeded",
    503: "unavailable",
}


# Checks that a request's API key owns a session (None: that it is a valid key), or
# raises ``Refusal`` saying why (``HttpApi.owns``; a WebRTC call's hangup uses it).
Owns = Callable[[web.Request, str | None], Awaitable[None]]

# The refusal of a request whose credentials are no valid key or client token (None:
# they are; ``Edges.caller``): a WebRTC offer asks it before it holds a call slot.
Caller = Callable[[Request], Awaitable[Response | None]]


class Refusal(Exception):
    """A 4xx/5xx answer; raised inside a handler, turned into JSON by the middleware."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_response(status: int, body: msgspec.Struct | bytes) -> web.Response:
    data = body if isinstance(body, bytes) else _encode(body)
    return web.Response(status=status, body=data, content_type="application/json")


def error_response(status: int, message: str) -> web.Response:
    code = _CODES.get(status, "error")
    kind = "server_error" if status >= 500 else "invalid_request_error"
    response = json_response(status, ErrorBody(ApiError(code, message, kind)))
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="realtime-gateway"'
    elif status == 503:
        response.headers["Retry-After"] = "5"
    return response


async def read_body(request: web.Request, decode: Callable[[bytes], Any], timeout: float) -> Any:
    """The request's JSON body, decoded, or ``Refusal``: read within ``timeout``. Size is checked on the bytes as sent (Content-Length
    first), then a compressed body is inflated off the loop to at most ``MAX_BODY``."""
    encoding = body_encoding(request)
    content_type = request.headers.get("Content-Type", "application/json").lower()
    if request.content_length != 0 and "json" not in content_type:
        raise Refusal(415, "send the body as JSON (Content-Type: application/json)")
    try:
        async with asyncio.timeout(timeout):
            data = await request.read()
    except TimeoutError:
        raise Refusal(
            408,
            f"the body did not arrive within {timeout:g} s; send the whole request at once",
        ) from None
    if encoding and data:
        data = await asyncio.to_thread(inflate, data, encoding)
    if not data.strip():
        data = b"{}"  # no body: every field's default
    if (crowded := too_many_values(data, "")) is not None:
        raise Refusal(400, f"invalid body: {crowded[0]}")
    try:
        return decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Refusal(400, f"invalid body: {exc}; see docs/http-api.md") from exc
    except RecursionError as exc:  # msgspec recurses per level: ~1,000 is its end
        raise Refusal(
            400,
            f"invalid body: it nests too deeply to read; a tool schema may nest at most "
            f"{MAX_SCHEMA_DEPTH} levels",
        ) from exc
    except ValueError as exc:
        raise Refusal(400, f"invalid body: {exc}") from exc


def too_large(request: web.Request) -> None:
    """413 at once for a body announced larger than ``MAX_BODY`` (none is read)."""
    length = request.content_length
    if length is not None and length > MAX_BODY:
        raise Refusal(413, f"the body is larger than {MAX_BODY} bytes; send a smaller one")


def body_encoding(request: web.Request) -> str:
    """The body's Content-Encoding (``""``: none), refused (415) unless gzip or deflate;
    and a body announced past ``MAX_BODY`` refused (413) before it is read."""
    too_large(request)
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return ""
    if encoding not in _ENCODINGS:
        raise Refusal(
            415,
            f"Content-Encoding {encoding[:40]!r} is not accepted: send the body as is, or "
            "gzip or deflate it (one encoding)",
        )
    return encoding


def inflate(data: bytes, encoding: str) -> bytes:
    """``data`` inflated, at most to ``MAX_BODY`` bytes (the work stops there): run off
    the loop. ``Refusal`` 413 past it, 400 for a body that is not what it says."""
    wbits = _ENCODINGS[encoding]
    attempts = (wbits,) if wbits else (zlib.MAX_WBITS, -zlib.MAX_WBITS)  # deflate: zlib or raw
    for attempt in attempts:
        inflater = zlib.decompressobj(attempt)
        try:
            out = inflater.decompress(data, MAX_BODY + 1)
        except zlib.error:
            continue
        if len(out) > MAX_BODY:
            raise Refusal(
                413,
                f"the body inflates to more than {MAX_BODY} bytes; send a smaller one",
            )
        if not inflater.eof:
            raise Refusal(400, f"the {encoding} body ends early: send the whole stream")
        return out
    raise Refusal(400, f"the body is not valid {encoding}: compress it as its header says")


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw.isascii() and raw.isdecimal() and len(raw) <= 19 and low <= int(raw) <= high:
        return int(raw)
    raise Refusal(
        400, f"{name}={raw[:40]!r} is not valid: give a whole number from {low} to {high}"
    )


class _MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (``Transfer-Encoding`` beside
    ``Content-Length``, a header line past 8 KiB…) as an ERROR with its traceback,
    and anyone may send one: the log says so in one line instead (the client has
    its 400 with aiohttp's reason)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            reason = " ".join(str(exc.message).split())[:200]
            record.msg = "HTTP API: a malformed request refused (%s): %s"
            record.args = (exc.code, reason)
            record.exc_info = record.exc_text = None
        return True


HTTP_LOG: Final = logging.getLogger("gateway.edge.http")
"""aiohttp's server logger for the API (``AppRunner(logger=…)``): its own errors."""
HTTP_LOG.addFilter(_MalformedRequests())
