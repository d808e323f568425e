"""The last resort of backpressure: close a client that stopped reading.

A client that takes nothing from its socket for ``slow_client_timeout`` s while
frames wait is closed with 4008 "client too slow": its events stay in the log
and it resumes with ``after`` (see ``gateway.edge.backpressure`` for the
cheaper layers before this one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from typing import Final, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from gateway.edge.closes import CloseCode, close_reason
from gateway.metrics import Metrics

__all__ = ["SLOW_CLIENT_CLOSE", "Reapable", "SlowClientReaper"]

log = logging.getLogger("gateway.edge.reaper")

SLOW_CLIENT_CLOSE: Final = CloseCode.SLOW_CLIENT
SLOW_CLIENT_REASON: Final = close_reason(
    "client too slow: reconnect with session_id and after=<last seq>"
)


class Reapable(Protocol):
    """A client connection as the reaper sees it (``gateway.edge.connection``)."""

    @property
    def ws(self) -> ServerConnection: ...

    @property
    def sid(self) -> str: ...

    @property
    def last_sent(self) -> int:
        """The seq of the last frame handed to the socket."""


class SlowClientReaper:
    """Closes connections whose client stopped reading for ``timeout`` seconds.

    One task per node looks at every connection each ``timeout / 4`` s: a
    connection is stalled while its socket buffer stays above the low-water mark
    and neither shrinks (the client takes nothing) nor moves on to a new frame
    (``last_sent``). Per frame it costs nothing.
    """

    def __init__(self, connections: Collection[Reapable], timeout: float, metrics: Metrics) -> None:
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
        stalled: dict[Reapable, tuple[int, int, float]] = {}
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

    def _close(self, conn: Reapable) -> None:
        if conn.ws.state is not State.OPEN:
            # Already closing (a drain's close frame stuck behind unread data):
            # nothing more can reach this client; free the connection.
            conn.ws.transport.abort()
            return
        self.metrics.clients.slow_client_closes.inc()
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


async def _close_or_abort(conn: Reapable) -> None:
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


def _backed_up(conn: Reapable) -> int | None:
    """Unsent bytes while the socket holds more than its low-water mark, else None."""
    transport = conn.ws.transport
    if transport is None or transport.is_closing():
        return None
    low, _high = transport.get_write_buffer_limits()
    unsent = transport.get_write_buffer_size()
    return unsent if unsent > max(low, 0) else None
