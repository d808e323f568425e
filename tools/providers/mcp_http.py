"""The streamable HTTP transport for MCP servers, with answers of bounded size.

The SDK's ``streamable_http_client`` reads a server's answer in one of two
ways. An ``text/event-stream`` answer goes through httpx2's ``EventSource``,
which the SDK bounds per event (``max_sse_event_size``, counted after
decompression); it is given the gateway's limit. An ``application/json``
answer is read whole with ``response.aread()``, with no bound at all. The SDK
takes an ``httpx2.AsyncClient`` of ours, so ours caps those bodies: a response
hook wraps every body that is not an event stream in ``_Capped``, which stops
after ``max_message`` bytes. It asks for no compression (``Accept-Encoding:
identity``) and refuses a compressed body outright, since the bytes it counts
are the ones on the wire and a compressed body could expand past them.

``_Capped`` fails with ``MessageTooLarge``, an ``httpx2.StreamError``: that is
the exception the SDK's JSON path catches and turns into an error for the
one request (``Failed to parse JSON response: …``), keeping the connection;
another exception would end it. ``tests/tools/test_mcp_bounds.py`` holds the
canary for that. The SDK logs that with a traceback; for this exception a
filter on its logger makes it one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import httpx2
import msgspec
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client

from protocol.json_outline import LARGE_FRAME
from tools.providers.lines import DroppedNotes, ServerPace, too_wide
from tools.providers.mcp_stdio import MESSAGE_UNREADABLE, SERVER_RATE

__all__ = [
    "TOO_LARGE_NOTE",
    "TOO_WIDE_NOTE",
    "MessageTooLarge",
    "MessageTooWide",
    "streamable_http",
]

TOO_LARGE_NOTE: Final = "the most the gateway reads of one MCP message"
"""In the message of every refusal, so the call's error can be recognised in the SDK's wrapping."""
TOO_WIDE_NOTE: Final = "too wide an array for the gateway to read"
"""In the message of a JSON answer refused for an array of over 1,024 values."""

_TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)
"""The SDK's own client's timeouts: a server may hold an event stream open for minutes."""


class MessageTooLarge(httpx2.StreamError):
    """An MCP server's answer was over the limit (or compressed, so it could be)."""


class MessageTooWide(MessageTooLarge):
    """An MCP server's JSON answer holds an array too wide to validate on the loop
    (``protocol.json_outline``): 35,000 content blocks held it 0.5-0.7 s."""


class _OneLine(logging.Filter):
    """A refused answer is logged by the SDK as an error with a traceback; one line says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, MessageTooLarge):
            record.msg, record.args = f"{record.getMessage()}: {exc}", ()
            record.exc_info = record.exc_text = None
        return True


logging.getLogger("mcp.client.streamable_http").addFilter(_OneLine())
log = logging.getLogger("tools.providers.mcp")


def streamable_http(url: str, *, max_message: int) -> Transport:
    """The SDK's streamable HTTP transport to ``url`` over a client that caps answers."""
    return _streamable_http(url, max_message)


@contextlib.asynccontextmanager
async def _streamable_http(url: str, max_message: int) -> AsyncIterator[Any]:
    # Any: the SDK's stream pair (its alias, TransportStreams, is in a private module).
    pace = ServerPace(SERVER_RATE, time.monotonic())  # the connection's, all streams
    notes = DroppedNotes(log, url)

    async def cap(response: httpx2.Response) -> None:
        kind = response.headers.get("Content-Type", "").lower()
        if not kind.startswith("text/event-stream"):
            response.stream = _Capped(response, max_message)
        else:
            response.stream = _EventsChecked(response, max_message, pace, notes)

    # Made in a thread: a client loads its TLS trust store when made (20-45 ms), and a
    # server reconnects while the node serves.
    made = await asyncio.to_thread(
        httpx2.AsyncClient,
        timeout=_TIMEOUT,
        headers={"Accept-Encoding": "identity"},
        event_hooks={"response": [cap]},
    )
    async with (
        made as client,
        streamable_http_client(url, http_client=client, max_sse_event_size=max_message) as streams,
    ):
        yield streams


class _Capped(httpx2.AsyncByteStream):
    """A response body that raises ``MessageTooLarge`` past ``limit`` bytes."""

    def __init__(self, response: httpx2.Response, limit: int) -> None:
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        self._stream = stream
        self._limit = limit
        self._encoding = response.headers.get("Content-Encoding", "").strip().lower()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._encoding not in ("", "identity"):
            raise MessageTooLarge(
                f"the server sent a {self._encoding}-compressed answer, though the gateway "
                f"asked for none; it is refused unread, since it could expand past "
                f"{self._limit:,} bytes, {TOO_LARGE_NOTE}"
            )
        size = 0
        held: list[bytes] = []  # the SDK reads a JSON answer whole anyway (aread)
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._limit:
                raise MessageTooLarge(
                    f"the answer was larger than {self._limit:,} bytes, {TOO_LARGE_NOTE}"
                )
            held.append(chunk)
        body = b"".join(held)
        problem = too_wide(body)
        if problem is not None:
            raise MessageTooWide(f"{problem}, {TOO_WIDE_NOTE}")
        yield body

    async def aclose(self) -> None:
        await self._stream.aclose()


_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_FLOOD_READ: Final = 2 * 1024 * 1024
"""Bytes a second an event stream is read at while events are dropped for ``ServerPace``:
dropped unvalidated, a flood still took a core to read and split (14.7 s of CPU in 15 s;
8.3 s at this pace, another client's 3.4 included). An answer behind 50,000
notifications (5.5 MB) comes 4.5 s later."""


class _EventsChecked(httpx2.AsyncByteStream):
    """An event stream whose large events are outlined before the SDK validates them.

    The SDK validates each event's JSON-RPC message on the loop: one event of 35,000
    content blocks (945 KB, under the size limit) held it 0.9 s a call. An event of
    ``LARGE_FRAME`` bytes or more is held whole (the SDK's ``EventSource`` holds it
    too, up to ``max_message``) and checked like a stdio line: one holding an array of
    over 1,024 values becomes a JSON-RPC error answering the same request
    (``MESSAGE_UNREADABLE``), or is dropped when it answers none. Other bytes pass
    unchanged; an event past ``limit`` passes too, for the SDK's own limit to refuse.
    Lines end with LF or CRLF (a bare CR, which no server library writes, is not split).
    """

    def __init__(
        self, response: httpx2.Response, limit: int, pace: ServerPace, notes: DroppedNotes
    ) -> None:
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        self._stream = stream
        self._limit = limit
        self._pace = pace
        self._notes = notes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        dropped = self._pace.dropped
        event = bytearray()  # the current event's lines, while it may still be checked
        passing = False  # the current event went past the limit: its bytes pass as they come
        rest = b""
        async for chunk in self._stream:
            if self._pace.dropped > dropped:  # a flood: read it slower (TCP pushes back)
                dropped = self._pace.dropped
                await asyncio.sleep(len(chunk) / _FLOOD_READ)
            data = rest + chunk
            end = data.rfind(b"\n") + 1
            rest = data[end:]
            for line in data[:end].splitlines(keepends=True):
                blank = line in (b"\n", b"\r\n")
                if passing:
                    yield line
                    passing = not blank
                    continue
                event += line
                if blank:
                    yield _checked(bytes(event), self._pace, self._notes)
                    event.clear()
                elif len(event) > self._limit:
                    yield bytes(event)
                    event.clear()
                    passing = True
        if event or rest:
            yield bytes(event) + rest

    async def aclose(self) -> None:
        await self._stream.aclose()


def _checked(event: bytes, pace: ServerPace, notes: DroppedNotes) -> bytes:
    """One whole event (its blank line included): as it came, or its message refused,
    or nothing when it is one more request or notification than ``pace`` lets through
    (a flood of them on the GET stream took a core, the SDK validating each)."""
    lines = event.splitlines()
    data = b"\n".join(
        line[6:] if line.startswith(b"data: ") else line[5:]
        for line in lines
        if line.startswith(b"data:")
    )
    if data and not pace.admit_message(data, time.monotonic()):
        notes.note(f"sent more than {pace.rate:g} messages a second of its own", data)
        return b""
    if len(event) < LARGE_FRAME:
        return event
    problem = too_wide(data)
    if problem is None:
        return event
    try:
        answers = _fields.decode(data).get("id")
    except msgspec.DecodeError:
        answers = None
    if answers is None:
        notes.note(f"sent an event that was dropped: {problem}", data)
        return b""
    error = {"code": MESSAGE_UNREADABLE, "message": problem}
    message = (
        b'{"jsonrpc":"2.0","id":'
        + bytes(answers)
        + b',"error":'
        + msgspec.json.encode(error)
        + b"}"
    )
    kept = [line for line in lines if line.startswith((b"event:", b"id:"))]
    return b"\n".join([*kept, b"data: " + message]) + b"\n\n"
