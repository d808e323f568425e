"""The group commit of ``RedisStore.append``: many sessions' appends in one round trip.

The gateway logs every small batch of token events before sending it ("log,
then send"), for many sessions at once. ``enqueue`` only records the append's
``EVALSHA`` and returns a future; the appends queued in the same event-loop
tick go to their master's *lane*, and each lane sends what it holds as one
pipeline, one batch in flight at a time, on one connection (one lane on a
single Redis; one per master on a Cluster). Throughput grows with load while
latency stays about one round trip, and each caller still gets its own result
or error. A session's appends land in call order: they go to one lane, whose
pipeline runs in order.

**Lanes fail alone.** A master that dies holds only its own lane: its batch
in flight waits out its deadline while every other master's lane goes on
sending (one batch in flight per node across shards stalled every session for
seconds during a failover; tests/bench/failover_bench.py measures it).

Each round trip uses the lane's connection and its public
``send_packed_command``; the append is packed as RESP once in ``enqueue`` and
replies are read in bulk: the two measured shortcuts of
``gateway.store.redis_fastpath`` (2.8x less client CPU per append than
redis-py's generic packer and parser). ``bulk_replies = False`` reads through
redis-py's parser instead.

**Redirects and failovers.** ``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``,
``READONLY`` and ``LOADING`` replies, and a node that refuses connections,
mean nothing was written: those appends are held, the slots learnt again, and
sent again to their (new) master's lane with backoff (50 ms doubling to
500 ms) for up to ``retry_window`` seconds; only then do they fail with
``StoreUnavailable``. A connection lost after the batch was sent means "maybe
stored": those fail at once with ``StoreUnavailable`` (the caller reads
``confirmed_seq`` to learn which), as a retry could write them twice.

**Replicated durability.** Under "replicated" each lane's pipeline ends with
``WAIT 1 timeout``: an append is reported stored only once a replica has it,
so a failover (the replica promoted) cannot lose an event a client was sent.
If no replica confirms in time, the appends of that pipeline fail with
``Unreplicated``: they are on the primary, and are not to be sent until
``confirmed_seq`` finds a replica has them. Under "replicated-or-local" they
are reported stored anyway (counted in ``stats.unreplicated``), and while no
replica confirms, that master's pipelines wait only briefly
(``gateway.store.redis_replicas``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
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

from gateway.store.base import (
    Durability,
    LeaseLost,
    LogEntry,
    SeqConflict,
    StoreError,
    StoreUnavailable,
    Unreplicated,
)
from gateway.store.redis_fastpath import (
    bulk,
    closed_by_server,
    fast_replies,
    pack_append_at,
    reply_lines,
    with_check,
)
from gateway.store.redis_replicas import ReplicaWatch
from gateway.store.redis_scripts import APPEND
from gateway.store.redis_seqmemo import CHECK, TRUST, SeqMemo
from gateway.store.redis_topology import Route, Topology

__all__ = ["REDIRECT_REPLIES", "CommitStats", "GroupCommit", "consecutive"]

_ERRORS: Final = (RedisError, RedisClusterException, OSError)
# Replies that mean "not written, not here or not now": send again after a refresh.
REDIRECT_REPLIES: Final = (
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
    """Appends no replica confirmed in time (held, or under replicated-or-local sent anyway)."""
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
    last: int  # its last seq (0: no entries)
    check: bytes  # the script's ``check`` flag it was packed with (``SeqMemo``)
    check_at: int  # where that flag is in ``command``
    generation: int  # the memo's generation it was packed under
    deadline: float = 0.0  # until when it is sent again (set at its first redirect)
    delay: float = 0.05  # its next backoff


class _Lane:
    """One master's appends: a queue, and at most one batch in flight."""

    __slots__ = ("busy", "queue", "route")

    def __init__(self, route: Route) -> None:
        self.route = route
        self.queue: list[_Pending] = []
        self.busy = False  # a task (or a caller, inline) is sending this lane's batches


class GroupCommit:
    """Queue appends, send them in batches per master; see the module docstring."""

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
        durability: Durability,
        replica_timeout_ms: int,
        error: Callable[[BaseException, str, str], StoreError],
        stats: CommitStats,
    ) -> None:
        self._topology = topology
        self._prefix = prefix
        self._ttl_ms = ttl_ms
        self._max_log = max_log
        self._max_batch = max_batch
        self._socket_timeout = socket_timeout
        self._retry_window = retry_window
        self._wait = durability != "local"
        self._error = error
        self.stats = stats
        self.replicas = ReplicaWatch(durability, replica_timeout_ms, topology.where)
        self.limits = bulk(b"%d" % ttl_ms) + bulk(b"%d" % max_log)
        """The append's TTL and log bound, packed once (``pack_append``)."""
        self.memo = SeqMemo(ttl_ms)
        """Where this store's sessions' logs end: spares the script a read (``SeqMemo``)."""
        # One deadline covers a whole round trip (and the replicas' wait).
        self._budget = socket_timeout + (replica_timeout_ms / 1000 if self._wait else 0.0)
        self._intake: list[_Pending] = []  # queued, not yet given to a lane
        self._lanes: dict[str, _Lane] = {}
        self._dispatcher: asyncio.Task[None] | None = None
        self._lane_tasks: set[asyncio.Task[None]] = set()
        self._held: list[_Pending] = []  # not written; sent again after a backoff
        self._retrier: asyncio.Task[None] | None = None
        self._prepared = False  # the topology was learnt once (``prepare``)

    def enqueue(
        self,
        sid: str,
        node: str,
        entries: Sequence[LogEntry],
        history: Sequence[bytes],
        *,
        start: bool = True,
    ) -> asyncio.Future[None]:
        """Queue one append for the next batch of its master; its future settles with it.

        ``start=False``: the caller flushes it with ``flush_queued`` (no task).
        """
        first = consecutive(sid, entries)
        # Packed here, once, as RESP bytes (see gateway.store.redis_fastpath).
        key = f"{self._prefix}:{{{sid}}}:"
        memo = self.memo
        check = memo.flag(sid, first)
        command, check_at = pack_append_at(
            key.encode(),
            node.encode(),
            self.limits,
            first,
            [data for _, data in entries],
            history,
            check,
        )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        last = first + len(entries) - 1 if entries else 0
        self._intake.append(
            _Pending(
                command,
                future,
                sid,
                node,
                first,
                key + "log",
                last,
                check,
                check_at,
                memo.generation,
            )
        )
        self.stats.appends += 1
        if start and self._dispatcher is None:
            # Started, not run: it first runs after every task that is ready in
            # this tick has had its turn to queue, which is the coalescing.
            self._dispatcher = loop.create_task(self._dispatch_soon())
        return future

    async def flush_queued(self) -> None:
        """Send what is queued from the calling task, where its lane is free.

        The node's log writer queues every dirty session's append at once and
        then waits for them: sending from its own task saves a task, its
        wake-up and the hand-over of results per round (docs/performance.md).
        A lane already sending takes what was queued for it; the caller then
        waits for its futures as before.
        """
        lanes = await self._dispatch()
        if len(lanes) == 1:
            await self._run_lane(lanes[0])
        elif lanes:
            await asyncio.gather(*(self._run_lane(lane) for lane in lanes))

    async def close(self) -> None:
        """Let the in-flight, queued and held appends finish (or fail)."""
        while True:
            busy = {
                t for t in (*self._lane_tasks, self._dispatcher, self._retrier) if t is not None
            }
            if not busy:
                return
            # asyncio.wait does not cancel them if close() itself is cancelled.
            await asyncio.wait(busy)

    # --- dispatch: each append to its master's lane ------------------------------

    async def _dispatch_soon(self) -> None:
        try:
            for lane in await self._dispatch():
                self._start_lane(lane)
        finally:
            self._dispatcher = None
            if self._intake:  # queued while this one awaited the topology
                loop = asyncio.get_running_loop()
                self._dispatcher = loop.create_task(self._dispatch_soon())

    async def _dispatch(self) -> list[_Lane]:
        """Move the intake into the lanes; the idle lanes that now have work."""
        if not self._intake:
            return []
        if not self._prepared:  # once; after that a failed route refreshes (``_retry``)
            with contextlib.suppress(*_ERRORS):  # if the cluster is down, routing says so below
                async with asyncio.timeout(self._socket_timeout):
                    await self._topology.prepare()
                    self._prepared = True
        items, self._intake = self._intake, []
        ready: dict[str, _Lane] = {}
        unroutable: list[_Pending] = []
        reason: BaseException = RedisError()
        for item in items:
            try:
                route = self._topology.route(item.key)
            except _ERRORS as exc:  # no node known for a slot (cluster still failing over)
                unroutable.append(item)
                reason = exc
                continue
            lane = self._lanes.get(route.name)
            if lane is None:
                lane = self._lanes[route.name] = _Lane(route)
            lane.route = route  # the newest route object of that master
            lane.queue.append(item)
            if not lane.busy:
                ready[route.name] = lane
        if unroutable:
            self._hold(unroutable, reason)
        for lane in ready.values():
            lane.busy = True
        return list(ready.values())

    def _start_lane(self, lane: _Lane) -> None:
        task = asyncio.get_running_loop().create_task(self._run_lane(lane))
        self._lane_tasks.add(task)
        task.add_done_callback(self._lane_tasks.discard)

    async def _run_lane(self, lane: _Lane) -> None:
        """Send ``lane``'s queue, one batch in flight, until it is empty (``lane.busy`` set)."""
        try:
            while lane.queue:
                batch = lane.queue
                if len(batch) > self._max_batch:
                    lane.queue = batch[self._max_batch :]
                    batch = batch[: self._max_batch]
                else:
                    lane.queue = []
                try:
                    again, reason = await self._send_batch(lane.route, batch)
                except BaseException as exc:
                    # Cancelled (the loop is closing) or a bug: no caller may hang.
                    _fail(batch, StoreUnavailable(f"append not completed: {exc!r}; retry"))
                    raise
                if again:
                    self._hold(again, reason or RedisError())
        finally:
            lane.busy = False
            if lane.queue:  # cancelled with work left: nobody else will send it
                pending, lane.queue = lane.queue, []
                _fail(
                    pending,
                    StoreUnavailable("append not sent: the store was closed; open a new one"),
                )

    async def _send_batch(
        self, route: Route, batch: list[_Pending]
    ) -> tuple[list[_Pending], BaseException | None]:
        stats = self.stats
        stats.flushes += 1
        if len(batch) > stats.max_batch:
            stats.max_batch = len(batch)
        return await self._send(route, batch)

    # --- redirects and failovers: held, then sent again -----------------------------

    def _hold(self, items: list[_Pending], reason: BaseException) -> None:
        """Appends that were not written: send them again after a backoff, or fail them."""
        self.memo.clear()  # a master unreachable or moved: its logs are read again
        now = time.monotonic()
        late: list[_Pending] = []
        for item in items:
            if not item.deadline:
                item.deadline = now + self._retry_window
            if now + item.delay > item.deadline:
                late.append(item)
            else:
                self._held.append(item)
        if late:
            _fail(
                late,
                self._error(
                    reason,
                    "appending",
                    f"; nothing was stored (still failing after {self._retry_window:g}s)",
                ),
            )
        self.stats.redirects += len(items) - len(late)
        if self._held and self._retrier is None:
            self._retrier = asyncio.get_running_loop().create_task(self._retry())

    async def _retry(self) -> None:
        """Learn the topology again, then give the held appends back to their lanes."""
        try:
            while self._held:
                await asyncio.sleep(min(item.delay for item in self._held))
                with contextlib.suppress(*_ERRORS):  # TimeoutError is an OSError
                    async with asyncio.timeout(self._socket_timeout):
                        await self._topology.refresh()
                held, self._held = self._held, []
                for item in held:
                    item.delay = min(item.delay * 2, 0.5)
                self._intake += held
                for lane in await self._dispatch():
                    self._start_lane(lane)
        finally:
            self._retrier = None
            if self._held:  # cancelled (closing): nobody will send them again
                held, self._held = self._held, []
                _fail(held, StoreUnavailable("append not sent: the store was closed; retry"))

    async def _send(
        self, route: Route, items: list[_Pending]
    ) -> tuple[list[_Pending], BaseException | None]:
        """One pipelined round trip to one master; settles what it can.

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
            return await self._round_trip(route.name, conn, items)
        self.memo.clear()  # a new connection: maybe a new primary (``SeqMemo``)
        try:
            async with asyncio.timeout(self._socket_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
        except _ERRORS as exc:  # also the deadline: TimeoutError is an OSError
            return items, exc  # refused or unreachable: nothing was sent
        return await self._round_trip(route.name, conn, items)

    async def _round_trip(
        self, master: str, conn: AbstractConnection, items: list[_Pending]
    ) -> tuple[list[_Pending], BaseException | None]:
        again: list[_Pending] = []
        reason: BaseException | None = None
        stored: list[_Pending] = []
        noscript = False
        settled = 0
        wait = self._wait
        count = len(items) + wait
        generation = self.memo.generation
        for item in items:
            if item.generation != generation and item.check is TRUST:
                # Packed before the memo was cleared (a reconnect, a redirect):
                # what it knew may be stale, so this one reads the log's end.
                item.command = with_check(item.command, item.check_at, CHECK)
                item.check, item.generation = CHECK, generation
        packed = [item.command for item in items]
        if wait:
            packed.append(_wait_command(self.replicas.wait_ms(master)))
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
                                self.memo.stored(item.sid, item.last, item.check)
                                item.future.set_result(None)
                        elif line.startswith(b"-NOSCRIPT"):
                            noscript = True
                            again.append(item)
                        elif line.startswith(REDIRECT_REPLIES):
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
            self.memo.clear()
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
        if wait and stored:
            self._replicated(master, stored, acked)
        if again:  # a redirect, READONLY, NOSCRIPT: maybe another primary now
            self.memo.clear()
        return again, reason

    def _replicated(self, master: str, stored: list[_Pending], acked: int) -> None:
        """Settle appends the primary took, by what its replicas said (the WAIT reply)."""
        confirmed = acked >= 1
        self.replicas.confirmed(master, confirmed)
        if not confirmed:
            self.stats.unreplicated += len(stored)
        if confirmed or self.replicas.durability == "replicated-or-local":
            for item in stored:
                if not item.future.done():
                    if confirmed:  # what no replica has may be lost: not remembered
                        self.memo.stored(item.sid, item.last, item.check)
                    else:
                        self.memo.forget(item.sid)
                    item.future.set_result(None)
            return
        _fail(
            stored,
            Unreplicated(
                f"Redis at {master}: no replica confirmed the append within "
                f"{self.replicas.replica_timeout_ms} ms (durability replicated); it is "
                "held, not sent, until one does (confirmed_seq); check that the "
                "replicas are up and in sync"
            ),
        )

    def _reject(self, item: _Pending, message: str) -> None:
        """Turn the append script's error (``LEASELOST owner``, …) into an exception."""
        error = self.rejection(item.sid, item.node, item.first, message)
        if not item.future.done():
            item.future.set_exception(error)

    def rejection(self, sid: str, node: str, first: int, message: str) -> StoreError:
        """The exception for the append script's error reply ``message``."""
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


def consecutive(sid: str, entries: Sequence[LogEntry]) -> int:
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


def _wait_command(timeout_ms: int) -> bytes:
    """``WAIT 1 timeout_ms``, packed."""
    return b"*3\r\n" + bulk(b"WAIT") + bulk(b"1") + bulk(b"%d" % timeout_ms)


def _fail(items: Sequence[_Pending], error: StoreError) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(error)
