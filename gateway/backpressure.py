"""A slow client never grows the gateway's memory and never loses an event.

Three layers, from cheapest to last resort:

1. **Coalescing.** When a client's send queue holds more than
   ``coalesce_after`` frames, or it is catching up from the log after falling
   behind, consecutive ``think`` (or ``respond``) chunks are merged into one
   frame: ``content`` is their concatenation, ``seq`` the last chunk's,
   ``seq_from`` the first's. No text is lost and a client checks contiguity
   with ``seq_from``; a token frame is ~60 bytes of envelope around ~4
   characters, so a merged frame carries the same text in a fraction of the
   bytes and the client catches up faster.
2. **Catch-up from the log** (``gateway.connection``): past
   ``send_queue_frames`` the queue is dropped and the client is fed from the
   store's log. The socket's own buffer is bounded by ``write_limit``: a send
   waits for the client to drain it.
3. **Closing.** A client that takes nothing from its socket for
   ``slow_client_timeout`` s while frames wait is closed with 4008 "client too
   slow": its events stay in the log and it resumes with ``after``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

import msgspec
from websockets.protocol import State

from protocol.events import Respond, Think, encode

from .store.base import LogEntry

if TYPE_CHECKING:
    from .connection import ClientConnection
    from .metrics import Metrics
    from .node import Node

__all__ = [
    "SLOW_CLIENT_CLOSE",
    "SendPressure",
    "SlowClientReaper",
    "coalesce_entries",
    "merge_run",
]

log = logging.getLogger("gateway.backpressure")

SLOW_CLIENT_CLOSE: Final = 4008
SLOW_CLIENT_REASON: Final = "client too slow: reconnect with session_id and after=<last seq>"

MAX_MERGED_BYTES: Final = 32_768
"""A merged frame stops growing at this many bytes: browsers' and libraries'
default frame limits (1 MiB) stay far away, and one frame never delays the next
event for long."""

_decode_chunk: Final = msgspec.json.Decoder(Think | Respond)


def _chunk_kind(data: bytes) -> type[Think] | type[Respond] | None:
    # msgspec writes the tag first: a prefix check tells a chunk without decoding it.
    if data.startswith(b'{"type":"think",'):
        return Think
    if data.startswith(b'{"type":"respond",'):
        return Respond
    return None


def merge_run(run: Sequence[LogEntry]) -> LogEntry:
    """One frame for consecutive chunks of one kind: content joined, ``seq_from..seq``."""
    if len(run) == 1:
        return run[0]
    chunks = [_decode_chunk.decode(entry.data) for entry in run]
    last = chunks[-1]
    merged = type(last)(
        content="".join(c.content for c in chunks),
        seq=last.seq,
        timestamp=last.timestamp,
        seq_from=chunks[0].seq_from if chunks[0].seq_from is not msgspec.UNSET else chunks[0].seq,
    )
    return LogEntry(last.seq, encode(merged))


def _take_run(first: LogEntry, rest: deque[LogEntry]) -> list[LogEntry]:
    """``first`` and the entries at the head of ``rest`` that continue its run."""
    kind = _chunk_kind(first.data)
    run = [first]
    if kind is None:
        return run
    size = len(first.data)
    while rest:
        nxt = rest[0]
        if (
            nxt.seq != run[-1].seq + 1
            or _chunk_kind(nxt.data) is not kind
            or size + len(nxt.data) > MAX_MERGED_BYTES
        ):
            break
        run.append(rest.popleft())
        size += len(nxt.data)
    return run


def coalesce_entries(entries: Iterable[LogEntry]) -> tuple[list[LogEntry], int]:
    """``entries`` with every run of consecutive same-kind chunks merged (order
    kept), and how many chunks went into merged frames."""
    pending = deque(entries)
    out: list[LogEntry] = []
    merged = 0
    while pending:
        run = _take_run(pending.popleft(), pending)
        if len(run) > 1:
            merged += len(run)
        out.append(merge_run(run))
    return out, merged


class SendPressure:
    """One connection's coalescing state; the writer calls it on its hot path.

    When nothing is behind, each call is one comparison.
    """

    __slots__ = ("_metrics", "behind", "coalesce_after", "limit")

    def __init__(self, node: Node) -> None:
        config = node.config
        self.coalesce_after = config.coalesce_after
        self.limit = config.send_queue_frames
        self._metrics: Metrics = node.metrics
        # Set once the client fell out of live delivery (see ``page``).
        self.behind = False

    def fell_behind(self) -> None:
        self.behind = self.coalesce_after > 0

    def coalesce(self, entry: LogEntry, queue: deque[LogEntry]) -> LogEntry:
        """``entry`` (the next to send, ``seq`` = last sent + 1), merged with the
        chunks after it in ``queue`` when the queue is long."""
        if self.coalesce_after <= 0 or len(queue) < self.coalesce_after:
            return entry
        run = _take_run(entry, queue)
        if len(run) == 1:
            return entry
        self._metrics.coalesced.inc(len(run))
        return merge_run(run)

    def page(self, entries: list[LogEntry]) -> list[LogEntry]:
        """A catch-up page, coalesced once the client has fallen behind.

        It stays so for the connection's life: a client that was too slow once
        catches up faster every time after. A resume's first replay (before any
        fall) gives back exactly the logged frames.
        """
        if not self.behind:
            return entries
        out, merged = coalesce_entries(entries)
        if merged:
            self._metrics.coalesced.inc(merged)
        return out

    def may_queue_reply(self, queue: deque[LogEntry]) -> bool:
        """Unlogged replies cannot be caught up from the log; past the queue limit
        (a client sending frames without reading the answers) they are dropped."""
        if len(queue) < self.limit:
            return True
        self._metrics.replies_dropped.inc()
        return False


class SlowClientReaper:
    """Closes connections whose client stopped reading for ``timeout`` seconds.

    One task per node looks at every connection each ``timeout / 4`` s: a
    connection is stalled while its socket buffer stays above the low-water mark
    and neither shrinks (the client takes nothing) nor moves on to a new frame
    (``last_sent``). Per frame it costs nothing.
    """

    def __init__(
        self, connections: set[ClientConnection], timeout: float, metrics: Metrics
    ) -> None:
        self.connections = connections
        self.timeout = timeout
        self.metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        if self.timeout > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="slow-client-reaper")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # conn → (last_sent, unsent bytes, stalled since) when last looked at.
        stalled: dict[ClientConnection, tuple[int, int, float]] = {}
        interval = max(0.02, self.timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for conn in list(stalled):
                if conn not in self.connections:
                    del stalled[conn]
            for conn in list(self.connections):
                unsent = _backed_up(conn)
                if unsent is None:
                    stalled.pop(conn, None)
                    continue
                seen = stalled.get(conn)
                # Progress: a frame went out, or the client took some bytes (one
                # big frame on a slow link drains for a while).
                if seen is None or seen[0] != conn.last_sent or unsent < seen[1]:
                    stalled[conn] = (conn.last_sent, unsent, now)
                elif now - seen[2] >= self.timeout:
                    del stalled[conn]
                    self._close(conn)

    def _close(self, conn: ClientConnection) -> None:
        if conn.ws.state is not State.OPEN:
            # Already closing (a drain's close frame stuck behind unread data):
            # nothing more can reach this client; free the connection.
            conn.ws.transport.abort()
            return
        self.metrics.slow_client_closes.inc()
        log.warning(
            "closing a client that read nothing for %.0f s (session %s, last sent seq %d); "
            "its events stay in the log",
            self.timeout,
            conn.sid,
            conn.last_sent,
            extra={"sid": conn.sid},
        )
        task = asyncio.create_task(_close_or_abort(conn), name=f"slow-close:{conn.sid}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for closing in list(self._closing):
            closing.cancel()


async def _close_or_abort(conn: ClientConnection) -> None:
    """Close with 4008; abort the TCP connection if the client still reads nothing.

    The close frame queues behind the unread data, and websockets' ``close()``
    (like its keepalive ping) first waits for the socket buffer to drain, with
    no deadline: a client that never reads again would hold the connection
    forever. A client that resumes reading within ``close_timeout`` gets the
    buffered events and then the close frame with its reason.
    """
    ws = conn.ws
    grace = ws.close_timeout if ws.close_timeout is not None else 10.0
    try:
        async with asyncio.timeout(grace):
            await ws.close(SLOW_CLIENT_CLOSE, SLOW_CLIENT_REASON)
    except TimeoutError:
        ws.transport.abort()


def _backed_up(conn: ClientConnection) -> int | None:
    """Unsent bytes while the socket holds more than its low-water mark, else None."""
    transport = conn.ws.transport
    if transport is None or transport.is_closing():
        return None
    low, _high = transport.get_write_buffer_limits()
    unsent = transport.get_write_buffer_size()
    return unsent if unsent > max(low, 0) else None
