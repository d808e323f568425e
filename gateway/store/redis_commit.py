"""The group commit of ``RedisStore.append``: many sessions' appends in one round trip.

The gateway logs every small batch of token events before sending it ("log,
then send"), for many sessions at once. ``enqueue`` only records the append's
``EVALSHA`` and returns a future; one flusher task sends everything queued in
the same event-loop tick, and everything queued while a flush is in flight,
as one pipeline per node (one on a single Redis; one per master that holds a
slot of the batch on a Cluster, all in flight at once). Throughput grows with
load while latency stays about one round trip, and each caller still gets its
own result or error. One batch is in flight at a time and a node's pipeline
runs on one connection in order, so one session's appends land in call order.

Each round trip borrows a connection from the pool (or the cluster node) and
uses its public ``send_packed_command``; the append is packed as RESP once in
``enqueue`` and replies are read in bulk: the two measured shortcuts of
``gateway.store.redis_fastpath`` (2.8x less client CPU per append than
redis-py's generic packer and parser). ``bulk_replies = False`` reads through
redis-py's parser instead.

**Redirects and failovers.** ``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``,
``READONLY`` and ``LOADING`` replies, and a node that refuses connections,
mean nothing was written: those appends are sent again, after learning the
slots again, with backoff (50 ms doubling to 500 ms) for up to
``retry_window`` seconds; only then do they fail with ``StoreUnavailable``.
A connection lost after the batch was sent means "maybe stored": those fail
at once with ``StoreUnavailable`` (the caller reads ``last_seq`` to learn
which), as a retry could write them twice.

**Replicated durability.** With ``replicas`` > 0 each node's pipeline ends with
``WAIT replicas timeout``: an append is reported stored only once that many
replicas have it, so a failover (the replica promoted) cannot lose an event a
client was sent. If fewer replicas confirm in time the appends of that
pipeline fail with ``StoreUnavailable`` ("maybe stored"): they are on the
primary and may or may not survive a failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

from gateway.store.base import LeaseLost, LogEntry, SeqConflict, StoreError, StoreUnavailable
from gateway.store.redis_fastpath import (
    bulk,
    closed_by_server,
    fast_replies,
    pack_append,
    reply_lines,
)
from gateway.store.redis_pipe import AppendPipe, Replies
from gateway.store.redis_scripts import APPEND
from gateway.store.redis_topology import Route, Topology

__all__ = ["CommitStats", "GroupCommit"]

_ERRORS: Final = (RedisError, RedisClusterException, OSError)
# Replies that mean "not written, not here or not now": send again after a refresh.
_REDIRECT_REPLIES: Final = (
    b"-MOVED",
    b"-ASK",
    b"-TRYAGAIN",
    b"-CLUSTERDOWN",
    b"-MASTERDOWN",
    b"-READONLY",
    b"-LOADING",
)


@dataclass(slots=True)
class CommitStats:
    """Counters for the group commit and reconnects (for tests, metrics and benches)."""

    appends: int = 0
    """``append`` calls queued."""
    flushes: int = 0
    """Batches sent (``appends / flushes`` = batch size)."""
    max_batch: int = 0
    """The most appends one flush carried."""
    connects: int = 0
    """Command connections opened on a single Redis (each loads the scripts)."""
    noscript_reloads: int = 0
    """Times a ``NOSCRIPT`` reply made the store load its scripts and retry."""
    redirects: int = 0
    """Appends sent again after a redirect or a refused connection (failover, resharding)."""
    unreplicated: int = 0
    """Appends reported "maybe stored" because no replica confirmed them in time."""
    pipe_rounds: int = 0
    """Log writer rounds sent on the append pipe (``gateway.store.redis_pipe``)."""


@dataclass(slots=True)
class _Pending:
    command: bytes
    future: asyncio.Future[None]
    sid: str
    node: str
    first: int
    key: str


class GroupCommit:
    """Queue appends, send them in batches per node; see the module docstring."""

    bulk_replies: bool = True
    """Read replies in bulk (``gateway.store.redis_fastpath``); False: redis-py's parser."""

    def __init__(
        self,
        topology: Topology,
        *,
        prefix: str,
        ttl_ms: int,
        max_log: int,
        max_batch: int,
        socket_timeout: float,
        retry_window: float,
        replicas: int,
        replica_timeout_ms: int,
        error: Callable[[BaseException, str, str], StoreError],
        stats: CommitStats,
        pipe: AppendPipe | None = None,
    ) -> None:
        self._topology = topology
        self._prefix = prefix
        self._ttl_ms = ttl_ms
        self._max_log = max_log
        self._max_batch = max_batch
        self._socket_timeout = socket_timeout
        self._retry_window = retry_window
        self._replicas = replicas
        self._replica_timeout_ms = replica_timeout_ms
        self._error = error
        self.stats = stats
        self._limits = bulk(b"%d" % ttl_ms) + bulk(b"%d" % max_log)
        self._wait_command = (
            b"*3\r\n" + bulk(b"WAIT") + bulk(b"%d" % replicas) + bulk(b"%d" % replica_timeout_ms)
        )
        # One deadline covers a whole round trip (and the replicas' wait).
        self._budget = socket_timeout + (replica_timeout_ms / 1000 if replicas else 0.0)
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._inline = False  # a caller is flushing in its own task (``flush_queued``)
        self._prepared = False  # the topology was learnt once (``prepare``)
        # Rounds answered by callback, where the topology allows (``send_on_pipe``).
        self._pipe = pipe if replicas == 0 else None
        self._again: set[asyncio.Task[None]] = set()  # rounds resent the awaited way

    def enqueue(
        self,
        sid: str,
        node: str,
        entries: Sequence[LogEntry],
        history: Sequence[bytes],
        *,
        start: bool = True,
    ) -> asyncio.Future[None]:
        """Queue one append for the next batch; its future settles with it.

        ``start=False``: the caller flushes it with ``flush_queued`` (no task).
        """
        first = _consecutive(sid, entries)
        # Packed here, once, as RESP bytes (see gateway.store.redis_fastpath).
        key = f"{self._prefix}:{{{sid}}}:"
        command = pack_append(
            key.encode(),
            node.encode(),
            self._limits,
            first,
            [data for _, data in entries],
            history,
        )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.append(_Pending(command, future, sid, node, first, key + "log"))
        self.stats.appends += 1
        if start and self._flusher is None and not self._inline:
            # Started, not run: it first runs after every task that is ready in
            # this tick has had its turn to queue, which is the coalescing.
            self._flusher = loop.create_task(self._flush_loop())
        return future

    async def flush_queued(self) -> None:
        """Send what is queued from the calling task, unless a flush is already running.

        The node's log writer queues every dirty session's append at once and
        then waits for them: flushing in its own task saves a task, its wake-up
        and the hand-over of results per round, which at low load (a round per
        event) is a measured share of the CPU per event (docs/performance.md).
        A flush already running (a flusher task, or another caller's) takes
        what was queued; the caller then waits for its futures as before.
        """
        if self._flusher is not None or self._inline:
            return
        self._inline = True
        try:
            await self._flush_loop()
        finally:
            self._inline = False

    async def close(self) -> None:
        """Let the in-flight and queued appends finish."""
        if self._pipe is not None:
            await self._pipe.close()
        if self._again:
            await asyncio.wait(set(self._again))
        flusher = self._flusher
        if flusher is not None:
            # asyncio.wait does not cancel the flusher if close() itself is cancelled.
            await asyncio.wait({flusher})

    async def _flush_loop(self) -> None:
        """Send queued appends, one batch in flight at a time, until the queue is empty."""
        try:
            while self._queue:
                batch = self._queue
                if len(batch) > self._max_batch:
                    self._queue = batch[self._max_batch :]
                    batch = batch[: self._max_batch]
                else:
                    self._queue = []
                try:
                    await self._flush(batch)
                except BaseException as exc:
                    # Cancelled (the loop is closing) or a bug: no caller may hang.
                    _fail(batch, StoreUnavailable(f"append not completed: {exc!r}; retry"))
                    raise
        finally:
            # Normally empty; non-empty only if this task was cancelled (close).
            pending, self._queue = self._queue, []
            if not self._inline:
                self._flusher = None
            for item in pending:
                if not item.future.done():
                    item.future.set_exception(
                        StoreUnavailable(
                            f"append to {item.sid} not sent: the store was closed; "
                            "open a new store and retry"
                        )
                    )

    async def _flush(self, batch: list[_Pending]) -> None:
        stats = self.stats
        stats.flushes += 1
        if len(batch) > stats.max_batch:
            stats.max_batch = len(batch)
        pending = batch
        if not self._prepared:  # once; after that a failed route refreshes (below)
            with contextlib.suppress(*_ERRORS):  # if the cluster is down, routing says so below
                async with asyncio.timeout(self._socket_timeout):
                    await self._topology.prepare()
                    self._prepared = True
        deadline = time.monotonic() + self._retry_window
        delay = 0.05
        while True:
            groups: dict[str, tuple[Route, list[_Pending]]] = {}
            try:
                for item in pending:
                    route = self._topology.route(item.key)
                    groups.setdefault(route.name, (route, []))[1].append(item)
            except _ERRORS as exc:  # no node known for a slot (cluster still failing over)
                again: list[_Pending] = list(pending)
                reason: BaseException = exc
            else:
                if len(groups) == 1:
                    route, items = next(iter(groups.values()))
                    outcomes = [await self._send(route, items)]
                else:
                    outcomes = await asyncio.gather(
                        *(self._send(route, items) for route, items in groups.values())
                    )
                again = [item for retry, _ in outcomes for item in retry]
                reason = next((exc for retry, exc in outcomes if exc is not None), RedisError())
            if not again:
                return
            if time.monotonic() + delay > deadline:
                _fail(
                    again,
                    self._error(
                        reason,
                        "appending",
                        f"; nothing was stored (still failing after {self._retry_window:g}s)",
                    ),
                )
                return
            stats.redirects += len(again)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            with contextlib.suppress(*_ERRORS):  # TimeoutError is an OSError
                async with asyncio.timeout(self._socket_timeout):
                    await self._topology.refresh()
            pending = again

    async def _send(
        self, route: Route, items: list[_Pending]
    ) -> tuple[list[_Pending], BaseException | None]:
        """One pipelined round trip to one node; settles what it can.

        Returns the appends to send again (nothing of them was written) and why.
        """
        try:
            conn = await route.connection()
        except MaxConnectionsError as exc:
            _fail(items, self._error(exc, "appending", "; nothing was stored"))
            return [], None
        except _ERRORS as exc:
            return items, exc
        if closed_by_server(conn):
            # Redis closed it while idle (a restart): reconnect, as the pool
            # would on checkout, rather than fail a flush on a dead socket.
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
        elif conn.is_connected:
            return await self._round_trip(conn, items)
        try:
            async with asyncio.timeout(self._socket_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
        except _ERRORS as exc:  # also the deadline: TimeoutError is an OSError
            return items, exc  # refused or unreachable: nothing was sent
        return await self._round_trip(conn, items)

    async def _round_trip(
        self, conn: AbstractConnection, items: list[_Pending]
    ) -> tuple[list[_Pending], BaseException | None]:
        again: list[_Pending] = []
        reason: BaseException | None = None
        stored: list[_Pending] = []
        noscript = False
        settled = 0
        wait = bool(self._replicas)
        count = len(items) + wait
        packed = [item.command for item in items]
        if self._replicas:
            packed.append(self._wait_command)
        acked = -1
        try:
            async with asyncio.timeout(self._budget):
                await conn.send_packed_command(packed, check_health=False)
                if self.bulk_replies and fast_replies(conn):
                    replies = reply_lines(conn, count)
                else:
                    replies = _parsed_lines(conn, count)
                async for lines in replies:
                    for line in lines:
                        if settled == len(items):  # the WAIT reply
                            acked = int(line[1:])
                            continue
                        item = items[settled]
                        settled += 1
                        if line == b":1":
                            if wait:
                                stored.append(item)  # stored once the replicas confirm
                            elif not item.future.done():
                                # Settled as its reply arrives: its session queues
                                # the next append while the rest are still read.
                                item.future.set_result(None)
                        elif line.startswith(b"-NOSCRIPT"):
                            noscript = True
                            again.append(item)
                        elif line.startswith(_REDIRECT_REPLIES):
                            again.append(item)
                            reason = ResponseError(line[1:].decode(errors="replace"))
                        else:
                            self._reject(item, line[1:].decode(errors="replace"))
                if noscript:
                    self.stats.noscript_reloads += 1
                    reason = NoScriptError("NOSCRIPT the append script was not loaded")
                    await conn.send_command("SCRIPT", "LOAD", APPEND.src)
                    await conn.read_response()
        except _ERRORS as exc:  # also the deadline: TimeoutError is an OSError
            _fail(
                stored + items[settled:] + again,
                self._error(
                    exc,
                    "appending",
                    "; the append may or may not be stored: read last_seq before writing again",
                ),
            )
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            return [], None
        except BaseException:
            _fail(
                stored + items[settled:] + again,
                StoreUnavailable("append interrupted (the store is closing); retry"),
            )
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            raise
        if self._replicas and acked < self._replicas and stored:
            self.stats.unreplicated += len(stored)
            _fail(
                stored,
                StoreUnavailable(
                    f"Redis at {self._topology.where}: {max(acked, 0)} of "
                    f"{self._replicas} replica(s) confirmed the append within "
                    f"{self._replica_timeout_ms} ms (durability=replicated); it may or "
                    "may not survive a failover: read last_seq before writing again; "
                    "check that the replicas are up and in sync"
                ),
            )
            return again, reason
        for item in stored:
            if not item.future.done():
                item.future.set_result(None)
        return again, reason

    def _reject(self, item: _Pending, message: str) -> None:
        """Turn the append script's error (``LEASELOST owner``, …) into an exception."""
        error = self._rejection(item.sid, item.node, item.first, message)
        if not item.future.done():
            item.future.set_exception(error)

    def _rejection(self, sid: str, node: str, first: int, message: str) -> StoreError:
        if message.startswith("LEASELOST"):
            holder = message[10:] or None
            return LeaseLost(
                f"session {sid}: node {node!r} does not hold the lease "
                f"(held by {holder or 'nobody'}); stop driving this session",
                holder,
            )
        if message.startswith("SEQCONFLICT"):
            return SeqConflict(
                f"session {sid}: append starts at seq {first} but the log ends "
                f"at {message[12:]}; another writer raced: reload last_seq before writing"
            )
        return self._error(ResponseError(message), "appending", "")

    # --- the pipe: rounds answered by callback (gateway.store.redis_pipe) ------

    def send_on_pipe(
        self,
        batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> bool:
        """Send a round on the pipe if it is connected; False: take the awaited path.

        ``on_done(results)`` is called once, from the pipe's ``data_received``
        (or when the connection ends or the round overruns its budget).
        """
        pipe = self._pipe
        if pipe is None:
            return False
        if not pipe.ready:
            pipe.warm()
            return False
        commands: list[bytes] = []
        sent: list[tuple[int, str, str, int]] = []  # (index, sid, node, first) per command
        results: list[BaseException | None] = [None] * len(batches)
        limits = self._limits
        prefix = self._prefix
        for i, (sid, node, entries, history) in enumerate(batches):
            try:
                first = _consecutive(sid, entries)
            except ValueError as exc:
                results[i] = exc
                continue
            commands.append(
                pack_append(
                    f"{prefix}:{{{sid}}}:".encode(),
                    node.encode(),
                    limits,
                    first,
                    [data for _, data in entries],
                    history,
                )
            )
            sent.append((i, sid, node, first))
        if not commands:
            asyncio.get_running_loop().call_soon(on_done, results)
            return True
        stats = self.stats
        stats.appends += len(commands)
        stats.flushes += 1
        stats.pipe_rounds += 1
        if len(commands) > stats.max_batch:
            stats.max_batch = len(commands)
        pipe.send(
            b"".join(commands),
            len(commands),
            partial(self._pipe_replies, batches, sent, results, on_done),
        )
        return True

    def _pipe_replies(
        self,
        batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]],
        sent: list[tuple[int, str, str, int]],
        results: list[BaseException | None],
        on_done: Callable[[list[BaseException | None]], None],
        replies: Replies,
    ) -> None:
        if isinstance(replies, BaseException):
            error = self._error(
                replies,
                "appending",
                "; the append may or may not be stored: read last_seq before writing again",
            )
            for i, *_ in sent:
                results[i] = error
            on_done(results)
            return
        again: list[int] = []
        for (i, sid, node, first), line in zip(sent, replies, strict=True):
            if line == b":1":
                continue
            if line.startswith(b"-NOSCRIPT") or line.startswith(_REDIRECT_REPLIES):
                again.append(i)  # not run: send it again the awaited way (loads, retries)
            else:
                results[i] = self._rejection(sid, node, first, line[1:].decode(errors="replace"))
        if not again:
            on_done(results)
            return
        if self._pipe is not None:
            self._pipe.reset()  # READONLY and the like: the next connect finds the primary
        task = asyncio.get_running_loop().create_task(
            self._append_again(batches, again, results, on_done)
        )
        self._again.add(task)
        task.add_done_callback(self._again.discard)

    async def _append_again(
        self,
        batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]],
        again: list[int],
        results: list[BaseException | None],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> None:
        futures = [self.enqueue(*batches[i], start=False) for i in again]
        try:
            await self.flush_queued()
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
        except BaseException as exc:
            outcomes = [exc] * len(again)
            raise
        finally:
            for i, outcome in zip(again, outcomes, strict=True):
                results[i] = outcome
            on_done(results)


def _consecutive(sid: str, entries: Sequence[LogEntry]) -> int:
    """The first seq of ``entries`` (0: none); ValueError unless they are consecutive."""
    first = entries[0].seq if entries else 0
    expect = first
    for seq, _ in entries:
        if seq != expect:
            raise ValueError(
                f"append to {sid}: entries must have consecutive seqs, got {seq} after {expect - 1}"
            )
        expect += 1
    return first


async def _parsed_lines(conn: AbstractConnection, count: int) -> AsyncIterator[list[bytes]]:
    """The reply lines ``reply_lines`` gives, through redis-py's parser (portable, slower)."""
    for _ in range(count):
        try:
            reply = await conn.read_response(timeout=math.inf)
        except NoScriptError:  # redis-py strips the error code of these
            yield [b"-NOSCRIPT"]
        except MovedError as exc:
            yield [b"-MOVED " + str(exc).encode()]
        except AskError as exc:
            yield [b"-ASK " + str(exc).encode()]
        except TryAgainError:
            yield [b"-TRYAGAIN"]
        except ClusterDownError as exc:
            yield [b"-CLUSTERDOWN " + str(exc).encode()]
        except ReadOnlyError:
            yield [b"-READONLY"]
        except ResponseError as exc:
            yield [b"-" + str(exc).encode()]
        else:
            yield [b":%d" % reply]


def _fail(items: Sequence[_Pending], error: StoreError) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(error)
