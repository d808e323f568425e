"""The node's appends on a connection read by callbacks: no task, future or await per round.

At low load the log writer's round carries one event, and the awaited group
commit (``gateway.store.redis_commit``) spent most of that event's Redis cost
in asyncio machinery rather than in the round trip: a coroutine chain per
round, a timeout handle, a ``StreamReader`` whose reply wakes a future that
wakes the task (measured in docs/performance.md). The pipe writes a round's
packed ``EVALSHA`` commands with one ``transport.write`` and hands the reply
lines to the round's callback from ``data_received``, in the same loop pass
that read them.

The connection is made by redis-py (so ``AUTH``, ``SELECT``, TLS, a Sentinel's
primary and the scripts loaded on connect are all as for every other
connection), then its transport is given this protocol
(``redis_fastpath.take_transport``). The append script answers one line, so a
reply is a line; a bare ``XADD``'s bulk reply (``$N``, then the ID) is handed
on as one line too, ``$`` and the ID (``$-1``: nil).

The pipe serves only what needs no more than that: one server, no ``WAIT``.
While it is connecting, after it lost its connection, and for a Cluster or
``durability=replicated``, appends take the awaited group commit, which owns
redirects, retries and reconnect backoff. A round the pipe cannot finish is
reported, not retried: lost connection or deadline = "maybe stored" (the
caller reads ``last_seq``), exactly as the awaited path reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.store.redis_fastpath import join_bulk, take_transport

__all__ = ["AppendPipe", "Replies"]

log = logging.getLogger("gateway.store.redis_pipe")

# A round's reply lines, or why there are none.
Replies = list[bytes] | BaseException

# After a failed connect, rounds take the awaited path this long before the pipe tries again.
RECONNECT_AFTER: Final = 1.0


@dataclass(slots=True)
class _Round:
    count: int
    done: Callable[[Replies], None]
    sent_at: float
    lines: list[bytes]


class AppendPipe(asyncio.Protocol):
    """One Redis connection for the log writer's rounds; see the module docstring."""

    def __init__(
        self,
        make: Callable[[], AbstractConnection],
        *,
        connect_timeout: float,
        budget: float,
        where: str,
    ) -> None:
        self._make = make
        self._connect_timeout = connect_timeout
        self._budget = budget  # seconds a round may take before the connection is dropped
        self._where = where
        self._conn: AbstractConnection | None = None
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the transport's
        self._connecting: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self._closed = False
        self._rounds: deque[_Round] = deque()
        self._rest = b""
        self._watchdog: asyncio.TimerHandle | None = None
        self._idle: asyncio.Event | None = None  # set when no round is in flight (close)
        self.connects = 0
        """Connections the pipe made (for tests and stats)."""

    @property
    def ready(self) -> bool:
        """Connected: ``send`` may be called."""
        return self._transport is not None

    def warm(self) -> None:
        """Start connecting, unless connected, connecting, closed or resting after a failure."""
        if self._transport is not None or self._connecting is not None or self._closed:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at:
            return
        self._connecting = loop.create_task(self._connect(), name="redis-append-pipe")

    def send(self, data: bytes, count: int, done: Callable[[Replies], None]) -> None:
        """Write one round of ``count`` commands; ``done`` gets its ``count`` reply lines.

        ``done`` is called once, from ``data_received`` (or with the error that
        ended the connection, or a ``TimeoutError`` past the budget).
        """
        transport = self._transport
        assert transport is not None, "send() before ready"
        loop = self._loop
        assert loop is not None, "a transport comes with its loop"
        self._rounds.append(_Round(count, done, loop.time(), []))
        transport.write(data)
        if self._watchdog is None:
            self._watchdog = loop.call_later(self._budget, self._check_deadline)

    async def close(self) -> None:
        """Let the rounds in flight finish (within the budget), then drop the connection."""
        self._closed = True
        if self._rounds and self._transport is not None:
            idle = self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._budget):
                    await idle.wait()
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
        self._drop(RedisConnectionError("the store was closed"))

    def reset(self) -> None:
        """Reconnect before the next round (a ``READONLY`` reply: the primary moved)."""
        self._drop(RedisConnectionError(f"Redis at {self._where} is no longer the primary"))

    # --- asyncio.Protocol ------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buffer = self._rest + data
        *lines, self._rest = buffer.split(b"\r\n")
        if b"$" in buffer:
            lines, header = join_bulk(lines)
            self._rest = header + self._rest
        rounds = self._rounds
        while lines:
            if not rounds:
                self._drop(RedisConnectionError("more replies than commands: protocol out of sync"))
                return
            head = rounds[0]
            need = head.count - len(head.lines)
            if len(lines) < need:
                head.lines += lines
                return
            if head.lines:
                head.lines += lines[:need]
            else:
                head.lines = lines[:need]
            lines = lines[need:]
            rounds.popleft()
            head.done(head.lines)  # may send the next round: it queues behind the rest
        if not rounds and self._idle is not None:
            self._idle.set()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost reports the rounds

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is None:
            return
        self._drop(
            RedisConnectionError(f"lost the connection to Redis at {self._where}: {exc!r}")
            if exc is not None
            else RedisConnectionError(f"Redis at {self._where} closed the connection")
        )

    # --- internals ---------------------------------------------------------------

    async def _connect(self) -> None:
        conn = self._make()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
            transport = take_transport(conn)
            if transport is None:  # a connection class the pipe cannot read: never again
                log.info("Redis connection has no stream transport: appends stay awaited")
                self._closed = True
                await conn.disconnect()
                return
            if self._closed:
                await conn.disconnect()
                return
            transport.set_protocol(self)
            # The transport's loop, kept for send(): get_running_loop() costs
            # a getpid() syscall per call on Python 3.11.
            self._loop = asyncio.get_running_loop()
            self._conn, self._transport, self._rest = conn, transport, b""
            self.connects += 1
        except (RedisError, OSError) as exc:  # also the deadline: TimeoutError is an OSError
            log.debug("append pipe to %s: connect failed: %r", self._where, exc)
            self._retry_at = asyncio.get_running_loop().time() + RECONNECT_AFTER
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
        finally:
            self._connecting = None

    def _check_deadline(self) -> None:
        self._watchdog = None
        if not self._rounds:
            return
        loop = asyncio.get_running_loop()
        late = self._rounds[0].sent_at + self._budget - loop.time()
        if late > 0:
            self._watchdog = loop.call_later(late, self._check_deadline)
            return
        self._drop(TimeoutError(f"Redis at {self._where} did not answer within {self._budget:g}s"))

    def _drop(self, why: BaseException) -> None:
        """Close the connection and report every round in flight with ``why``."""
        transport, self._transport = self._transport, None
        self._conn = None  # redis-py's object for it: not used again (a new one per connect)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if transport is not None:
            transport.abort()
        rounds, self._rounds = self._rounds, deque()
        self._rest = b""
        for waiting in rounds:
            waiting.done(why)
        if self._idle is not None:
            self._idle.set()
