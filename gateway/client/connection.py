"""``ResumingConnection``: one session's connection to the gateway, kept across drops.

Why it is apart from ``Client``: the client's surface (a turn, speech,
configuration, tools, approvals) changes with the protocol's commands; keeping
a session's events whole across dropped connections changes with the network
and the gateway's nodes. This is the second job: it dials (failing over
between URLs, backing off with jitter, raising what a retry cannot fix),
reads every connection, drops what the client already holds, resumes over a
gap with ``session_id`` and ``after``, and hands each new event (and each
unlogged reply to the client's own frames) to its owner's ``receive``. What
a turn's iterator waits on comes through ``queue``: the events its owner
queues, a ``Reconnected`` marker for each new connection, and a ``Failed``
for something final.

- **Final vs. retried.** Handshake 400/401/403/404 raise ``Refused`` with the
  server's text; 429/503, lost connections and close codes 1006/1011/1012/
  1013/4008 are retried until ``reconnect_timeout`` seconds pass without a
  connection (``ConnectionLost``). The first connection fails fast with
  ``Unreachable`` when nothing listens: a mistyped URL should say so at once.
- **Several nodes.** A client given several URLs (``Client([url1, url2])``)
  dials the next one whenever one cannot be reached or refuses for now
  (429/503), on the first connection and on every reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.client.dial import (
    FINAL_CLOSE_CODES,
    ClientError,
    ConnectionLost,
    Refused,
    Unreachable,
    open_connection,
)
from gateway.client.hooks import Hooks, call_hook
from gateway.client.stream import METRIC_GRACE, SeqVerdict, classify_seq
from protocol.audio import split_audio_frame
from protocol.events import Event, Session, decode_event

__all__ = ["Failed", "Item", "Reconnected", "ResumingConnection", "Timing", "event_kind"]

log = logging.getLogger(__name__)

_KIND: dict[type, str] = {cls: str(cls.__struct_config__.tag) for cls in Event.__args__}


def event_kind(event: Event) -> str:
    """The wire ``type`` of an event (``"respond"`` for a ``Respond``)."""
    return _KIND[type(event)]


@dataclass(frozen=True, slots=True)
class Timing:
    """How long a ``Client`` waits: for the metric after a turn's closing event, for a
    reconnect in all, between attempts (doubled per attempt, with jitter), per handshake."""

    metric_grace: float = METRIC_GRACE
    reconnect_timeout: float = 60.0
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    open_timeout: float = 10.0


class Reconnected(msgspec.Struct, frozen=True):
    """Queued when a new connection starts: its session frame and the ``after`` it asked for."""

    session: Session
    after: int
    generation: int


class Failed(msgspec.Struct, frozen=True):
    error: BaseException


Item = Event | Reconnected | Failed

Receive = Callable[[Event, bool], None]
"""The owner's reader: each event to deliver, and whether it is logged (new) or an
unlogged reply to the client's own frame (an ``error`` repeating the last seq)."""


class ResumingConnection:
    """A session's connection across drops (see the module docstring).

    ``urls``: the nodes to fail over between; ``session_id``/``after``: a session
    to resume; ``hooks``: the owner's (connections, disconnects, retries, audio).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        token: str | None,
        timing: Timing,
        session_id: str | None,
        after: int | None,
        hooks: Hooks,
        receive: Receive,
    ) -> None:
        self.urls = list(urls)
        self._url_index = 0
        self.token = token
        self.timing = timing
        self.hooks = hooks
        self._receive = receive
        self.session_id = session_id
        self.last = after if after is not None else -1
        self._ws: ClientConnection | None = None
        self._generation = 0
        self._connected = asyncio.Event()
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._failure: BaseException | None = None
        self.session: Session | None = None
        """The last ``session`` frame (provider, node, resumed)."""
        self.reconnects = 0
        """Connections opened after the first one."""

    @property
    def url(self) -> str:
        """The URL dialled last (one of ``urls``)."""
        return self.urls[self._url_index]

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def open(self) -> None:
        """Open the first connection (``Refused``/``Unreachable`` if that fails)."""
        if self._supervisor is not None:
            return
        await self._dial(first=True)
        self._supervisor = asyncio.create_task(self._run(), name="gateway-client")

    async def close(self, tasks: Iterable[asyncio.Task[None]] = ()) -> None:
        """Close the connection and stop reconnecting; ``tasks`` (the owner's) are cancelled."""
        self._closing = True
        stopping = [t for t in (self._supervisor, *tasks) if t is not None]
        for task in stopping:
            task.cancel()
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        for task in stopping:
            with contextlib.suppress(BaseException):
                await task
        self._connected.clear()

    async def send(self, payload: bytes, *, binary: bool = False) -> int:
        """Send one frame on a live connection (waiting for one); its generation."""
        while True:
            self.raise_if_failed()
            await self._wait_connected()
            ws, generation = self._ws, self._generation
            if ws is None:
                continue
            try:
                if binary:
                    await ws.send(payload, text=False)
                else:
                    await ws.send(payload.decode())
                return generation
            except ConnectionClosed:
                # The supervisor sees the same close and reconnects.
                await asyncio.sleep(0)
                if self._connected.is_set() and self._generation == generation:
                    self._connected.clear()

    def raise_if_failed(self) -> None:
        """Raise what ended the connection for good (or that the client is closed)."""
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise ClientError("the client is closed")

    async def _wait_connected(self) -> None:
        if self._connected.is_set():
            return
        waiter = asyncio.ensure_future(self._connected.wait())
        supervisor = self._supervisor
        try:
            if supervisor is None:
                await waiter
            else:
                await asyncio.wait({waiter, supervisor}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        self.raise_if_failed()

    async def _dial(self, *, first: bool, close_code: int | None = None) -> None:
        """Open a connection, retrying what a retry can fix; queue the reconnect marker.

        With several URLs, every failure a retry can fix moves on to the next
        URL; a first connection raises ``Unreachable`` only when none answered.
        """
        deadline = time.monotonic() + self.timing.reconnect_timeout
        attempt = 0
        unreachable = 0
        while True:
            resume = self.session_id is not None and self.last >= 0
            after = self.last
            try:
                ws, session = await open_connection(
                    self.url,
                    token=self.token,
                    session_id=self.session_id,
                    after=after if resume else None,
                    open_timeout=self.timing.open_timeout,
                    max_size=None,
                )
                break
            except Refused as exc:
                if exc.final:
                    raise
                problem: ClientError = exc
            except Unreachable as exc:
                unreachable += 1
                if first and unreachable >= len(self.urls):
                    raise
                problem = exc
            except ConnectionClosed as exc:
                problem = ConnectionLost(f"connection closed during the handshake ({exc})")
            if time.monotonic() >= deadline:
                raise ConnectionLost(
                    f"could not reconnect for {self.timing.reconnect_timeout:g}s: {problem}"
                ) from problem
            call_hook(self.hooks.on_retry, problem)
            self._url_index = (self._url_index + 1) % len(self.urls)
            if self._url_index == 0:  # every URL tried once: back off
                await asyncio.sleep(self._backoff(attempt, close_code))
                attempt += 1
        if self.session_id is None or self.last < 0:
            self.last = session.seq  # a new session: nothing before it is ours
        self.session_id = session.session_id
        self.session = session
        self._ws = ws
        self._generation += 1
        if not first:
            self.reconnects += 1
        self.queue.put_nowait(Reconnected(session, after, self._generation))
        self._connected.set()
        call_hook(self.hooks.on_connect, session)

    def _backoff(self, attempt: int, close_code: int | None) -> float:
        floor = 1.0 if close_code == 1013 and attempt == 0 else 0.0  # store down: give it time
        delay = min(self.timing.backoff_max, self.timing.backoff_initial * 2.0**attempt)
        return max(floor, delay * random.uniform(0.5, 1.0))

    async def _run(self) -> None:
        """Read every connection; reconnect until closed or something final happens."""
        try:
            while True:
                ws = self._ws
                assert ws is not None
                reason = await self._read(ws)
                self._connected.clear()
                close = ws.protocol.close_rcvd
                code = close.code if close is not None else None
                if self._closing:
                    return
                if close is not None and code in FINAL_CLOSE_CODES:
                    reason_text = close.reason or "no reason given"
                    raise ConnectionLost(
                        f"the gateway closed the connection ({code} {reason_text})"
                    )
                call_hook(self.hooks.on_disconnect, reason)
                # A close the server asked for (1012 drain, 4008 slow) reconnects at
                # once; a lost connection or a busy server waits a little first.
                if code not in (1012, 4008):
                    await asyncio.sleep(self._backoff(0, code))
                await self._dial(first=False, close_code=code)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._failure = exc
            self.queue.put_nowait(Failed(exc))

    async def _read(self, ws: ClientConnection) -> str:
        """Hand this connection's new frames to ``receive`` until it ends; why it ended."""
        try:
            while True:
                data = await ws.recv()
                if isinstance(data, bytes):  # the model's speech (protocol.audio)
                    if self.hooks.on_audio is not None:
                        call_hook(self.hooks.on_audio, *split_audio_frame(data))
                    continue
                try:
                    event = decode_event(data)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.warning("gateway client: skipping a frame that is not an event (%s)", exc)
                    continue
                kind = event_kind(event)
                seq_from = getattr(event, "seq_from", msgspec.UNSET)
                verdict = classify_seq(
                    kind, event.seq, self.last, -1 if seq_from is msgspec.UNSET else seq_from
                )
                if verdict is SeqVerdict.DUPLICATE:
                    continue
                if verdict is SeqVerdict.GAP:
                    ws.transport.abort()  # resume from the log with after=last
                    return f"events after seq {self.last} missing; resuming"
                logged = verdict is SeqVerdict.NEW
                if logged:
                    self.last = event.seq
                self._receive(event, logged)
        except ConnectionClosed as exc:
            close = exc.rcvd
            return "connection lost" if close is None else f"closed {close.code} {close.reason}"
