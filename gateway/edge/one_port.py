"""One port for the WebSocket endpoint and the HTTP API: the request head decides who serves it.

websockets serves ``GET`` handshakes only (its parser refuses any other
method), and aiohttp serves the API (``POST``/``DELETE``/``OPTIONS`` and the
API's ``GET`` routes). ``Sniffer`` is the listening socket's asyncio protocol:
it reads the first request's head, at most ``max_head`` bytes within
``timeout`` seconds (a client that sends less in that time is cut: a
slow-loris holds a descriptor no longer than a stalled handshake would), then
hands the transport to the protocol that serves it, replaying the bytes read.

What goes where (``route``): a ``GET`` is websockets' (handshakes, ``/healthz``,
``/readyz``, ``/metrics``, the console's pages) unless it is no WebSocket
handshake and its path is one of the API's (``/v1/sessions/…``,
``/openai/v1/…``); every other method is aiohttp's. An HTTP connection kept alive
by aiohttp is closed after each answer (``Connection: close``), so a
browser never sends a later ``GET`` of a page down a connection aiohttp holds.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Final, Literal, cast

import msgspec
from websockets.asyncio.server import ServerConnection

from gateway.edge.http_requests import ApiError, ErrorBody

__all__ = ["MAX_HEAD", "MAX_HEADERS", "MAX_LINE", "Route", "Sniffer", "route"]

MAX_HEAD: Final = 64 * 1024
"""Bytes a request head may take on the shared port (websockets allows 128 headers of 8 KiB
lines, aiohttp 32 KiB of headers; a browser with large cookies sends ~16 KiB)."""

MAX_LINE: Final = 8190
"""Bytes a request line or header may take (aiohttp's limit; websockets' is 8192)."""
MAX_HEADERS: Final = 128
"""Header lines a request head may have (websockets' limit; aiohttp's is larger)."""


def _answer(status: bytes, code: str, message: str) -> bytes:
    """A refusal answered by the port itself, in the API's error body: past websockets'
    limits it closed the connection with no answer (and logged a traceback each time),
    and aiohttp's own 400 echoed the line's first 100 bytes (a credential) as text."""
    body = msgspec.json.encode(ErrorBody(ApiError(code, message)))
    return (
        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (status, len(body))
    ) + body


def _too_large(code: str, message: str) -> bytes:
    return _answer(b"431 Request Header Fields Too Large", code, message)


_REQUEST_LINE: Final = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) \S+ HTTP/1\.[01]")
"""RFC 9112's request line: a method (a token), the target, the version."""
_METHODS: Final = frozenset(
    (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH")
)
"""RFC 9110's methods; any other is answered 501 here (aiohttp's parser answered it with a
plain-text 400 that quoted the request line)."""
_BAD_LINE: Final = _answer(
    b"400 Bad Request",
    "bad_request_line",
    "the request line is not `METHOD /path HTTP/1.1`: send an HTTP/1.1 request",
)
_UNKNOWN_METHOD: Final = _answer(
    b"501 Not Implemented",
    "method_not_implemented",
    "this method is not served: the API takes GET, POST, DELETE and OPTIONS, "
    "and a WebSocket connects with GET",
)

_LONG_LINE: Final = _too_large(
    "header_too_large",
    f"a request header is longer than {MAX_LINE} bytes: send a shorter one (an API key or "
    "client token is a few hundred bytes at most)",
)
_LARGE_HEAD: Final = _too_large(
    "header_too_large",
    f"a request's head (its line and headers) is over {MAX_HEAD} bytes: send shorter headers",
)
_MANY_HEADERS: Final = _too_large(
    "too_many_headers", f"a request has more than {MAX_HEADERS} headers: send fewer"
)

Route = Literal["ws", "http"]

_API_GET_PREFIXES: Final = (b"/v1/sessions", b"/openai/v1/")
_UPGRADE: Final = re.compile(rb"\r\nupgrade:[ \t]*websocket[ \t]*\r\n", re.IGNORECASE)


def route(head: bytes) -> Route:
    """Who serves a request whose head (request line and headers) is ``head``."""
    method, _, rest = head.partition(b" ")
    if method != b"GET":
        return "http"
    if _UPGRADE.search(head) is not None:
        return "ws"
    target = rest.partition(b" ")[0].partition(b"?")[0]
    return "http" if target.startswith(_API_GET_PREFIXES) else "ws"


class Sniffer(asyncio.Protocol):
    """The shared port's protocol until the first request's head has arrived.

    ``websocket`` is the connection a WebSocket's request is handed to (made
    by websockets' server, not yet connected: its handler starts when it is);
    ``make_http()`` makes the protocol an HTTP request is handed to;
    ``on_open(transport)`` / ``on_close(transport)`` count the connection
    while it is read here (the pending, unauthenticated connections).
    """

    __slots__ = (
        "_buffer",
        "_dropping",
        "_make_http",
        "_max_head",
        "_on_close",
        "_on_open",
        "_timeout",
        "_timer",
        "_transport",
        "protocol",
        "websocket",
    )

    def __init__(
        self,
        websocket: ServerConnection,
        make_http: Callable[[], asyncio.Protocol],
        *,
        timeout: float,
        max_head: int = MAX_HEAD,
        on_open: Callable[[asyncio.BaseTransport], object] | None = None,
        on_close: Callable[[asyncio.BaseTransport], object] | None = None,
    ) -> None:
        self.websocket = websocket
        # websockets' server checks that its subprotocol hook runs for this connection's
        # protocol (``connection.protocol``): the Sniffer is the connection it knows.
        self.protocol = websocket.protocol
        self._make_http = make_http
        self._timeout = timeout
        self._max_head = max_head
        self._on_open = on_open
        self._on_close = on_close
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._dropping: int | None = None  # bytes of a refused client's still dropped

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast("asyncio.Transport", transport)
        if self._on_open is not None:
            self._on_open(transport)
        self._timer = asyncio.get_running_loop().call_later(self._timeout, self._cut)

    def data_received(self, data: bytes) -> None:
        if self._dropping is not None:  # refused while it was sending
            self._dropping -= len(data)
            if self._dropping < 0:
                self._cut()
            return
        buffer = self._buffer
        start = max(0, len(buffer) - 3)
        buffer += data
        end = buffer.find(b"\r\n\r\n", start)
        if end < 0:
            if len(buffer) > self._max_head:
                self._refuse(_LARGE_HEAD, still_sending=True)
            return
        head = bytes(buffer[: end + 4])
        lines = head.split(b"\r\n")  # the request line, the headers, two empty ones
        if max(map(len, lines)) > MAX_LINE:
            self._refuse(_LONG_LINE)
        elif len(lines) - 3 > MAX_HEADERS:
            self._refuse(_MANY_HEADERS)
        elif (line := _REQUEST_LINE.fullmatch(lines[0])) is None:
            self._refuse(_BAD_LINE)
        elif line[1] not in _METHODS:
            self._refuse(_UNKNOWN_METHOD)
        else:
            self._hand_over(route(head))

    def _refuse(self, answer: bytes, *, still_sending: bool = False) -> None:
        """A head the servers would refuse in their own words: answered here, in ours.

        A client ``still_sending`` its head gets the answer and the end of the
        stream, then what it sends is dropped until it closes (or, after 2 s or
        1 MiB, it is cut off). Closed at once with its bytes unread, the socket was
        reset and the client never read why.
        """
        self._stop_timer()
        transport = self._transport
        assert transport is not None
        transport.write(answer)
        if not still_sending:
            transport.close()
            return
        if transport.can_write_eof():
            transport.write_eof()
        self._buffer = bytearray()
        self._dropping = 2**20
        self._timer = asyncio.get_running_loop().call_later(2.0, self._cut)

    def eof_received(self) -> bool | None:
        self._cut()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._on_close is not None and self._transport is not None:
            self._on_close(self._transport)

    def _hand_over(self, to: Route) -> None:
        transport = self._transport
        assert transport is not None
        self._stop_timer()
        if self._on_close is not None:
            self._on_close(transport)  # the new protocol counts it from here
        data = bytes(self._buffer)
        self._buffer = bytearray()
        if to == "ws" and not self.websocket.server.is_serving():
            # The node is closing: websockets would start a handshake it no longer
            # serves and log its failure as an error; the client reconnects elsewhere.
            transport.abort()
            return
        protocol = self.websocket if to == "ws" else self._make_http()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        # The head always follows: a protocol that closed the transport in
        # ``connection_made`` reads a request it cannot answer, not an empty stream
        # (websockets logs an empty one as a failed handshake, with its traceback).
        protocol.data_received(data)

    def _cut(self) -> None:
        self._stop_timer()
        if self._transport is not None:
            self._transport.abort()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
