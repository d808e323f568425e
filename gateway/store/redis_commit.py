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

Each batch's round trip is ``gateway.store.redis_batch``'s (``BatchSender``).
It uses the lane's connection and its public
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
import time
from collections.abc import Callable, Sequence

from redis.exceptions import (
    RedisError,
)

from gateway.store.base import (
    Durability,
    LogEntry,
    StoreError,
    StoreUnavailable,
)
from gateway.store.redis_batch import (
    ERRORS,
    BatchSender,
    CommitStats,
    PendingAppend,
    fail,
)
from gateway.store.redis_fastpath import (
    bare_entry,
    bulk,
    pack_append_at,
    pack_xadd,
)
from gateway.store.redis_replicas import ReplicaWatch
from gateway.store.redis_seqmemo import SeqMemo
from gateway.store.redis_topology import Route, Topology

__all__ = ["CommitStats", "GroupCommit", "consecutive"]


class _Lane:
    """One master's appends: a queue, and at most one batch in flight."""

    __slots__ = ("busy", "queue", "route")

    def __init__(self, route: Route) -> None:
        self.route = route
        self.queue: list[PendingAppend] = []
        self.busy = False  # a task (or a caller, inline) is sending this lane's batches


class GroupCommit:
    """Queue appends, send them in batches per master; see the module docstring."""

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
        self._max_batch = max_batch
        self._socket_timeout = socket_timeout
        self._retry_window = retry_window
        self._error = error
        self.stats = stats
        self.replicas = ReplicaWatch(durability, replica_timeout_ms, topology.where)
        self.limits = bulk(b"%d" % ttl_ms) + bulk(b"%d" % max_log)
        """The append's TTL and log bound, packed once (``pack_append``)."""
        self.max_log = bulk(b"%d" % max_log)
        """The log bound alone, packed once (``pack_xadd``)."""
        self.memo = SeqMemo(ttl_ms)
        """Where this store's sessions' logs end: spares the script a read (``SeqMemo``)."""
        self.sender = BatchSender(
            socket_timeout=socket_timeout,
            replicas=self.replicas,
            memo=self.memo,
            limits=self.limits,
            error=error,
            stats=stats,
        )
        """Each batch's round trip to its master (``gateway.store.redis_batch``)."""
        self._intake: list[PendingAppend] = []  # queued, not yet given to a lane
        self._lanes: dict[str, _Lane] = {}
        self._dispatcher: asyncio.Task[None] | None = None
        self._lane_tasks: set[asyncio.Task[None]] = set()
        self._held: list[PendingAppend] = []  # not written; sent again after a backoff
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
        check = memo.flag(sid, node, first)
        bare = bare_entry(check, entries, history)
        if bare is not None:
            # A bare XADD, fenced in the log (``redis_rounds``): one command, not three.
            command, check_at = pack_xadd(key.encode(), self.max_log, first, bare), -1
        else:
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
            PendingAppend(
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
                bare=bare,
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
            with contextlib.suppress(*ERRORS):  # if the cluster is down, routing says so below
                async with asyncio.timeout(self._socket_timeout):
                    await self._topology.prepare()
                    self._prepared = True
        items, self._intake = self._intake, []
        ready: dict[str, _Lane] = {}
        unroutable: list[PendingAppend] = []
        reason: BaseException = RedisError()
        for item in items:
            try:
                route = self._topology.route(item.key)
            except ERRORS as exc:  # no node known for a slot (cluster still failing over)
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
                    fail(batch, StoreUnavailable(f"append not completed: {exc!r}; retry"))
                    raise
                if again and reason is None:
                    # Bare XADDs the log refused, packed again as the script, which
                    # says why (fenced, gone, out of order), or appends answered
                    # NOSCRIPT once, the script now loaded: a second send, not a
                    # retry of a failure, so no backoff and no retry window; first
                    # in line, ahead of anything queued behind them.
                    lane.queue[:0] = again
                elif again:
                    self._hold(again, reason or RedisError())
        finally:
            lane.busy = False
            if lane.queue:  # cancelled with work left: nobody else will send it
                pending, lane.queue = lane.queue, []
                fail(
                    pending,
                    StoreUnavailable("append not sent: the store was closed; open a new one"),
                )

    async def _send_batch(
        self, route: Route, batch: list[PendingAppend]
    ) -> tuple[list[PendingAppend], BaseException | None]:
        stats = self.stats
        stats.flushes += 1
        if len(batch) > stats.max_batch:
            stats.max_batch = len(batch)
        return await self.sender.send(route, batch)

    # --- redirects and failovers: held, then sent again -----------------------------

    def _hold(self, items: list[PendingAppend], reason: BaseException) -> None:
        """Appends that were not written: send them again after a backoff, or fail them."""
        self.memo.clear()  # a master unreachable or moved: its logs are read again
        now = time.monotonic()
        late: list[PendingAppend] = []
        for item in items:
            if not item.deadline:
                item.deadline = now + self._retry_window
            if now + item.delay > item.deadline:
                late.append(item)
            else:
                self._held.append(item)
        if late:
            fail(
                late,
                self._error(
                    reason,
                    "appending",
                    f"; nothing was stored (still failing after {self._retry_window:g}s)",
                ),
            )
        self.stats.redirects += len(items) - len(late)
        if self._retrier is None:
            self._retrier = asyncio.get_running_loop().create_task(self._retry())

    async def _retry(self) -> None:
        """Learn the topology again, then give the held appends back to their lanes.

        Also when the hold failed every append (a retry window of 0): the next appends
        must go to the master that took over, not again to the one that failed."""
        try:
            if not self._held:
                await self._relearn()
            while self._held:
                await asyncio.sleep(min(item.delay for item in self._held))
                await self._relearn()
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
                fail(held, StoreUnavailable("append not sent: the store was closed; retry"))

    async def _relearn(self) -> None:
        """Ask where each master is now (a failed ask: the next hold asks again)."""
        with contextlib.suppress(*ERRORS):  # TimeoutError is an OSError
            async with asyncio.timeout(self._socket_timeout):
                await self._topology.refresh()


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
