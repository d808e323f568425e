"""One WebSocket to a provider: the socket shell every adapter shares.

An adapter is its provider's codec plus the state of its conversation; what
it does with the socket is the same for every provider, and lives here once:

- **dial** (``gateway.upstream.dial``: no compression, a frame limit, every
  failure an ``UpstreamClosed``) with a refusal text that names the API and
  the variable of its key;
- **frames in**: ``recv`` returns a frame's bytes (or ``None``: the read
  callback took a frame the session must act on), and a closed connection
  becomes ``UpstreamClosed`` whose reason says who closed it, with what code
  and reason, and what to do (``hint``);
- **the read callback**: ``intercept`` lets an adapter take frames in the
  connection's read callback while ``recv`` waits (the session's text fast
  path, ``Upstream.stream_text_to``);
- **frames out**: ``send`` writes a frame without awaiting when the socket
  takes it at once (``gateway.wsfast``) and awaits ``ws.send``
  otherwise; ``write_now`` only ever writes at once, after ``can_send_now``
  (the audio relay's path);
- **the tap**: with a ``FrameTap`` set (a session that records), every frame
  both ways is handed to it as it goes over the wire (the flight recorder,
  ``gateway.sessions.recorder``); without one, a frame costs one test.

``Inbox`` is the receive loop on top, the same for every adapter: frames
decoded by the wire's codec, handed to the adapter's pure conversation core
(``handle``: a message → the session's events, queued in order), an
unreadable frame reported as ``UpstreamError("upstream_protocol")``; and the
read callback's fast path (``take``: the text the core takes from a message
now goes to the session's sink; a message it leaves is kept decoded, so
``recv`` does not decode it again).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Close

from gateway.upstream.base import FrameTap, UpstreamClosed, UpstreamError, UpstreamEvent, Woken
from gateway.upstream.dial import dial
from gateway.wsfast import MessageQueue, can_write_now, write_text_now, write_texts_now

__all__ = ["CloseHint", "Inbox", "Intercept", "ProviderSocket"]

CloseHint = Callable[[int, str], str]
"""``(close code, reason)`` → what to do about it (``""``: nothing to add)."""

Intercept = Callable[[bytes, bool], bool]
"""``(frame, is_text)`` → True when the read callback took the frame (see ``intercept``)."""


def _no_hint(code: int, reason: str) -> str:
    return ""


def _tapped(take: Intercept, tap: FrameTap) -> Intercept:
    """``take``, and a frame it took goes to ``tap`` (``recv`` does not see it)."""

    def taking(data: bytes, text: bool) -> bool:
        if take(data, text):
            tap.received(data)
            return True
        return False

    return taking


class ProviderSocket:
    """The WebSocket of one upstream connection (see the module docstring).

    ``label`` names the API in messages ("OpenAI Realtime"); ``key_variable``
    is the variable of the key it was given, named when the key is refused;
    ``hint`` adds what to do about a close the provider is known to send.
    """

    __slots__ = ("_queue", "_ws", "hint", "key_variable", "label", "suffix", "tap")

    def __init__(self, label: str, key_variable: str, *, hint: CloseHint = _no_hint) -> None:
        self.label = label
        self.key_variable = key_variable
        self.hint = hint
        self.suffix = ""  # appended to every close description (e.g. "after goAway")
        self.tap: FrameTap | None = None  # set before ``connect``
        self._ws: ClientConnection | None = None
        self._queue: MessageQueue | None = None

    @property
    def open(self) -> bool:
        return self._ws is not None

    async def connect(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        connect_timeout: float,
        not_found: str = "check its base URL and the model",
    ) -> None:
        """Dial ``url``; ``not_found`` is what to check when the handshake gets HTTP 404."""

        def refused(exc: InvalidStatus) -> str:
            return self._refusal(exc, not_found)

        ws = await dial(
            url, headers, label=self.label, connect_timeout=connect_timeout, rejection=refused
        )
        self._ws = ws
        queue = ws.recv_messages
        self._queue = queue if isinstance(queue, MessageQueue) else None

    def intercept(self, take: Intercept | None) -> bool:
        """Offer frames to ``take`` in the read callback while ``recv`` waits; False: this
        connection cannot (every frame comes from ``recv``)."""
        queue = self._queue
        if queue is None:
            return False
        tap = self.tap
        queue.intercept = take if take is None or tap is None else _tapped(take, tap)
        return True

    def nudge(self) -> None:
        """Make the waiting ``recv`` return ``None`` (a taken frame asks the session to act)."""
        if self._queue is not None:
            self._queue.nudge()

    async def recv(self) -> bytes | None:
        """The next frame's bytes; ``None`` after a ``nudge``. Raises ``UpstreamClosed``."""
        ws = self._ws
        if ws is None:
            raise UpstreamClosed(f"the {self.label} connection is closed")
        try:
            data = await ws.recv(decode=False)
        except ConnectionClosed as exc:
            raise UpstreamClosed(self.describe_close(exc)) from exc
        except OSError as exc:  # pragma: no cover - websockets wraps these
            raise UpstreamClosed(f"{self.label} connection failed: {exc}") from exc
        if data is not None and self.tap is not None:
            self.tap.received(data)
        return data

    def take_ready(self) -> list[bytes]:
        """The frames received and not read yet (none if this connection cannot tell)."""
        queue = self._queue
        taken = queue.take_ready() if queue is not None else []
        if self.tap is not None:
            for data in taken:
                self.tap.received(data)
        return taken

    def can_send_now(self) -> bool:
        """Open, and the socket takes a frame at once: ``write_now`` may be called."""
        ws = self._ws
        return ws is not None and can_write_now(ws)

    async def send(self, data: bytes) -> None:
        """Write one text frame (UTF-8 ``data``). Raises ``UpstreamClosed``."""
        ws = self._ws
        if ws is None:
            raise UpstreamClosed(f"the {self.label} connection is closed")
        if self.tap is not None:
            self.tap.sent(data, False)
        if can_write_now(ws):  # nothing to wait for: no await, no send context (gateway.wsfast)
            try:
                write_text_now(ws, data)
            except Exception as exc:  # the socket broke under the write
                raise UpstreamClosed(f"{self.label} connection failed: {exc!r}") from exc
            return
        try:
            await ws.send(data, text=True)
        except ConnectionClosed as exc:
            raise UpstreamClosed(self.describe_close(exc)) from exc

    def write_all_now(self, frames: Sequence[bytes]) -> None:
        """Write ``frames`` (text, in order) now, in one socket write, for a caller that
        found ``can_send_now`` with nothing awaited since. Raises ``UpstreamClosed``."""
        ws = self._ws
        if ws is None:
            raise UpstreamClosed(f"the {self.label} connection is closed")
        if self.tap is not None:
            for data in frames:
                self.tap.sent(data, False)
        try:
            write_texts_now(ws, frames)
        except Exception as exc:  # the socket broke under the write
            raise UpstreamClosed(f"{self.label} connection failed: {exc!r}") from exc

    def write_now(self, data: bytes) -> None:
        """Write ``data`` (one text frame) now, for a caller that found ``can_send_now``
        with nothing awaited since: the audio relay checks the socket once per frame,
        before it encodes. A connection that broke under the write counts as written:
        ``recv`` reports the loss."""
        ws = self._ws
        if ws is None:
            return
        if self.tap is not None:
            self.tap.sent(data, True)
        try:  # not contextlib.suppress: an object and two calls per 20 ms frame
            write_text_now(ws, data)
        except Exception:  # the socket broke under the write: recv reports the loss
            return

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        self._queue = None
        if ws is not None:
            await ws.close()

    def detach(self) -> ClientConnection | None:
        """Hand over the WebSocket (to be closed by the caller) and forget it."""
        ws, self._ws = self._ws, None
        self._queue = None
        return ws

    # --- words --------------------------------------------------------------------------

    def describe_close(self, exc: ConnectionClosed) -> str:
        close: Close | None = exc.rcvd
        if close is None and exc.sent is not None and exc.sent.code != 1000:
            # The gateway failed the connection: what the provider sent broke the protocol
            # (gateway.wsfast: invalid UTF-8, a message in too many fragments, a ping flood).
            sent = exc.sent
            return (
                f"the gateway closed the {self.label} connection (code {sent.code}: "
                f"{sent.reason}){self.suffix}"
            )
        if close is None:
            return f"{self.label} connection lost without a close frame (code 1006){self.suffix}"
        reason = f": {close.reason}" if close.reason else ""
        hint = self.hint(close.code, close.reason)
        return f"{self.label} closed the connection (code {close.code}{reason}){self.suffix}{hint}"

    def _refusal(self, exc: InvalidStatus, not_found: str) -> str:
        status = exc.response.status_code
        body = exc.response.body.decode("utf-8", "replace").strip() if exc.response.body else ""
        detail = f": {body[:300]}" if body else ""
        label = self.label
        if status == 401:
            return f"{label} rejected the API key (HTTP 401): set {self.key_variable}{detail}"
        if status == 403:
            return (
                f"{label} refused access (HTTP 403): check that the key ({self.key_variable}) "
                f"may use this model{detail}"
            )
        if status == 404:
            return f"{label} endpoint or model not found (HTTP 404): {not_found}{detail}"
        if status == 429:
            return f"{label} rate-limited the connection (HTTP 429): retry later{detail}"
        return f"{label} rejected the WebSocket handshake (HTTP {status}){detail}"


M = TypeVar("M")


class Inbox(Generic[M]):
    """The receive loop of one adapter (see the module docstring).

    ``decode``: a frame → its wire's message (None: nothing to do with it; a
    msgspec error: unreadable); ``take``: the text of a message the core takes
    now for the sink (None: ``recv`` handles the message), called in the read
    callback only while a sink is set and no event is queued.
    """

    __slots__ = ("_decode", "_decoded", "_intercepting", "_sink", "_socket", "_take", "queued")

    def __init__(
        self,
        socket: ProviderSocket,
        decode: Callable[[bytes], M | None],
        take: Callable[[M], str | None] | None = None,
    ) -> None:
        self._socket = socket
        self._decode = decode
        self._take = take
        self.queued: collections.deque[UpstreamEvent] = collections.deque()
        self._sink: Callable[[str], bool] | None = None
        # A frame the read callback decoded but did not take: recv() uses it.
        self._decoded: tuple[bytes, M | None] | None = None
        self._intercepting = False

    def attach(self) -> bool:
        """Offer frames to ``take`` in the read callback (after each connect); False: the
        connection cannot, every frame comes from ``recv``."""
        self._intercepting = self._take is not None and self._socket.intercept(self._intercept)
        return self._intercepting

    def stream_text_to(self, sink: Callable[[str], bool] | None) -> bool:
        """``Upstream.stream_text_to``: where taken text goes while ``recv`` waits."""
        if not self._intercepting:
            return False
        self._sink = sink
        return True

    def _intercept(self, data: bytes, text: bool) -> bool:
        sink = self._sink
        take = self._take
        if sink is None or take is None or self.queued:
            return False
        try:
            message = self._decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False  # recv() reports it
        taken = None if message is None else take(message)
        if taken is None:
            self._decoded = (data, message)
            return False
        if sink(taken):
            self._socket.nudge()
        return True

    def _message(self, data: bytes) -> M | UpstreamError | None:
        decoded, self._decoded = self._decoded, None
        if decoded is not None and decoded[0] is data:
            return decoded[1]
        try:
            return self._decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return UpstreamError(
                code="upstream_protocol",
                message=f"unreadable {self._socket.label} frame ({exc}): {bytes(data[:200])!r}",
            )

    async def next(
        self, handle: Callable[[M], Sequence[UpstreamEvent]], *, deadline: float | None = None
    ) -> UpstreamEvent | None:
        """A queued event, or one frame read and handled: its first event (the rest are
        queued), ``None`` if it meant none, ``Woken`` after the sink asked the session to
        act. ``TimeoutError`` at loop time ``deadline``; ``UpstreamClosed`` as ``recv``."""
        if self.queued:
            return self.queued.popleft()
        if deadline is None:
            data = await self._socket.recv()
        else:
            async with asyncio.timeout_at(deadline):
                data = await self._socket.recv()
        if data is None:
            return Woken()
        message = self._message(data)
        if message is None or isinstance(message, UpstreamError):
            return message
        events = handle(message)
        if not events:
            return None
        self.queued.extend(events[1:])
        return events[0]

    async def until(self, opened: Callable[[M], bool]) -> None:
        """Read frames until ``opened(message)`` is True (the session's start; it raises
        to refuse). Frames that do not decode, and those it is False for, are skipped."""
        while True:
            data = await self._socket.recv()
            if data is None:
                continue
            try:
                message = self._decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if message is not None and opened(message):
                return

    async def recv(self, handle: Callable[[M], Sequence[UpstreamEvent]]) -> UpstreamEvent:
        """The next event (``next`` until a frame means one)."""
        while True:
            event = await self.next(handle)
            if event is not None:
                return event
