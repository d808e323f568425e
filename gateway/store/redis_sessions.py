"""``RedisSessions``: the session log in Redis, shared by many gateway nodes.

Meta, log, history and lease of each session, under the hash tag ``{SID}`` so a
Cluster keeps a session on one slot. Appends go through the group commit
(``gateway.store.redis_commit``): one pipelined round trip per master carries
every append queued meanwhile. Blocking reads (``XREAD BLOCK`` in ``wait_log``)
use a separate pool, so followers never take connections from the command
pool that appends need.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from redis.exceptions import NoScriptError

from gateway.store.base import (
    AppendBatch,
    Durability,
    LogEntry,
    StoreUnavailable,
    Unreplicated,
    submit_in_task,
)
from gateway.store.redis_commit import GroupCommit
from gateway.store.redis_core import ERRORS, MAX_SUB_ID, RedisCore, ms, seq_of
from gateway.store.redis_pipe import AppendPipe
from gateway.store.redis_rounds import PipeRounds
from gateway.store.redis_scripts import (
    ACQUIRE,
    CONFIRM,
    CREATE,
    DELETE,
    KEEP,
    READ_PAGE,
    RELEASE,
    RENEW,
    SET_META,
)

__all__ = ["WAIT_LIMIT", "RedisSessions"]

WAIT_LIMIT: Final = 1000
"""The most entries one ``wait_log`` call returns (a follower simply calls again)."""


class RedisSessions:
    """The session log (``Sessions``) in Redis; any node can serve any session.

    ``max_log`` bounds the log (``MAXLEN ~``: at least that many are kept).
    ``max_batch`` caps the appends one flush carries. ``durability`` says when
    an append counts as stored (``gateway.store.redis_commit``): "local" once the
    primary has it; "replicated" once a replica confirmed it too (``WAIT 1``,
    up to ``replica_timeout`` s); "replicated-or-local" as replicated while a
    replica confirms, else as local.
    """

    def __init__(
        self,
        core: RedisCore,
        *,
        max_log: int = 10_000,
        max_batch: int = 2000,
        durability: Durability = "local",
        replica_timeout: float = 1.0,
    ) -> None:
        if max_log < 1:
            raise ValueError(f"max_log must be >= 1, got {max_log!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        self._core = core
        self.max_log = max_log
        self.durability = durability
        self._replica_timeout_ms = ms(replica_timeout, "replica_timeout")
        self._commit = GroupCommit(
            core.topology,
            prefix=core.prefix,
            ttl_ms=core.ttl_ms,
            max_log=max_log,
            max_batch=max_batch,
            socket_timeout=core.socket_timeout,
            retry_window=core.retry_window,
            durability=durability,
            replica_timeout_ms=self._replica_timeout_ms,
            error=core.error,
            stats=core.stats,
        )
        self._rounds = self._pipe_rounds()

    def _pipe_rounds(self) -> PipeRounds | None:
        """The log writer's callback path: one server, no ``WAIT`` (``redis_rounds``)."""
        make = self._core.topology.single_server_connection()
        if make is None or self.durability != "local":
            return None
        core = self._core
        pipe = AppendPipe(
            make, connect_timeout=core.connect_timeout, budget=core.socket_timeout, where=core.where
        )
        return PipeRounds(
            pipe, self._commit, prefix=core.prefix, error=core.error, stats=core.stats
        )

    def _key(self, sid: str, kind: str) -> str:
        return self._core.key(sid, kind)

    # --- meta ------------------------------------------------------------------

    def _meta_args(self, sid: str, fields: Mapping[str, str]) -> tuple[list[str], list[Any]]:
        keys = [
            self._core.key(sid, "meta"),
            self._core.key(sid, "log"),
            self._core.key(sid, "history"),
        ]
        args: list[Any] = [self._core.ttl_ms]
        for name, value in fields.items():
            args += (name, value)
        return keys, args

    async def create_session(
        self, sid: str, meta: Mapping[str, str], ttl: float | None = None
    ) -> bool:
        if not meta:
            raise ValueError("create_session needs at least one meta field")
        keys, args = self._meta_args(sid, meta)
        if ttl is not None:
            args[0] = ms(ttl, "ttl")
        return bool(await self._core.eval(CREATE, keys, *args, again=False))

    async def get_meta(self, sid: str) -> dict[str, str] | None:
        raw = await self._core.run("reading meta", "HGETALL", self._core.key(sid, "meta"))
        if not raw:
            return None
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def set_meta(self, sid: str, fields: Mapping[str, str]) -> None:
        """Update fields and restart the idle TTL; a no-op if the session is gone.

        Writing into an expired session would resurrect a partial one.
        """
        if not fields:
            return
        keys, args = self._meta_args(sid, fields)
        await self._core.eval(SET_META, keys, *args)

    async def delete_session(self, sid: str) -> bool:
        self._commit.memo.forget(sid)
        keys = [
            self._core.key(sid, "meta"),
            self._core.key(sid, "log"),
            self._core.key(sid, "history"),
            self._core.key(sid, "lease"),
            self._core.key(sid, "gone"),
            self._core.key(sid, "rec"),
        ]
        return bool(await self._core.eval(DELETE, keys, self._core.ttl_ms, again=False))

    async def were_deleted(self, sids: Sequence[str]) -> list[bool]:
        """``EXISTS`` of each ``gone`` key, pipelined 500 at a time (one slot each)."""
        found: list[bool] = []
        for start in range(0, len(sids), 500):
            chunk = sids[start : start + 500]
            try:
                async with self._core.client.pipeline(transaction=False) as pipe:
                    for sid in chunk:
                        pipe.exists(self._core.key(sid, "gone"))
                    replies = await pipe.execute()
            except ERRORS as exc:
                raise self._core.error(exc, "reading deleted sessions") from exc
            found.extend(bool(r) for r in replies)
        return found

    # --- log + history -----------------------------------------------------

    async def append(
        self,
        sid: str,
        node: str,
        entries: Sequence[LogEntry],
        history: Sequence[bytes] = (),
    ) -> None:
        """Queue the append for the next group commit and wait for its own result.

        Cancelling the caller does not withdraw a queued append (later appends of
        the session depend on it); it may still be stored. After
        ``StoreUnavailable`` the append may or may not be stored: read
        ``last_seq`` before writing again.
        """
        await self._commit.enqueue(sid, node, entries, history)

    def submit_appends(
        self,
        batches: Sequence[AppendBatch],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> None:
        """On the append pipe when it is connected, else ``append_many`` in a task."""
        if self._rounds is None or not self._rounds.send(batches, on_done):
            submit_in_task(self.append_many, batches, on_done)

    async def append_many(self, batches: Sequence[AppendBatch]) -> list[BaseException | None]:
        """All the appends go into the same group commit, sent from this task.

        No flusher task and no gather when the flush settles them all here
        (the usual case): see ``GroupCommit.flush_queued``.
        """
        futures: list[asyncio.Future[None]] = []
        early: dict[int, BaseException] = {}
        for i, (sid, node, entries, history) in enumerate(batches):
            try:
                futures.append(self._commit.enqueue(sid, node, entries, history, start=False))
            except ValueError as exc:
                early[i] = exc
        await self._commit.flush_queued()
        results: list[BaseException | None]
        if all(f.done() for f in futures):
            results = [
                asyncio.CancelledError() if f.cancelled() else f.exception() for f in futures
            ]
        else:  # another flush holds some of them
            results = list(await asyncio.gather(*futures, return_exceptions=True))
        for i in sorted(early):
            results.insert(i, early[i])
        return results

    async def read_log(
        self, sid: str, after: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[LogEntry]:
        if limit <= 0:
            return []
        if max_bytes is not None:
            key = self._core.key(sid, "log")
            raw = await self._core.eval(READ_PAGE, [key], max(after, 0) + 1, limit, max_bytes)
            return [LogEntry(seq_of(entry_id), fields[1]) for entry_id, fields in raw]
        raw = await self._core.run(
            "reading the log",
            "XRANGE",
            self._core.key(sid, "log"),
            f"{max(after, 0) + 1}-0",
            "+",
            "COUNT",
            limit,
        )
        return [LogEntry(seq_of(entry_id), fields[b"d"]) for entry_id, fields in raw]

    async def wait_log(
        self,
        sid: str,
        after: int,
        timeout: float,
        limit: int = WAIT_LIMIT,
    ) -> list[LogEntry]:
        """Entries after ``after`` (at most ``limit``), blocking up to ``timeout`` s.

        ``XREAD BLOCK`` on the blocking pool; the call is bounded by ``timeout``
        plus the socket timeout, so a Redis that vanishes mid-wait is reported
        rather than waited on forever.
        """
        if timeout <= 0 or limit <= 0:
            return await self.read_log(sid, after, limit)
        block_ms = max(1, math.ceil(timeout * 1000))
        key = self._core.key(sid, "log")
        try:
            async with asyncio.timeout(timeout + self._core.socket_timeout):
                raw = await self._core.topology.blocking(
                    key,
                    "XREAD",
                    "COUNT",
                    limit,
                    "BLOCK",
                    block_ms,
                    "STREAMS",
                    key,
                    # Past every ID of seq ``after`` (``<seq>-0`` or ``<seq>-1``).
                    f"{max(after, 0)}-{MAX_SUB_ID}",
                )
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"Redis at {self._core.where} did not answer a blocking read in "
                f"{timeout + self._core.socket_timeout:.1f}s; the gateway retries; "
                "check --store (GATEWAY_STORE, REDIS_URL) and that Redis is running"
            ) from exc
        except ERRORS as exc:
            raise self._core.error(exc, "waiting for the log") from exc
        if not raw:
            return []
        return [LogEntry(seq_of(entry_id), fields[b"d"]) for entry_id, fields in raw[0][1]]

    async def first_seq(self, sid: str) -> int:
        raw = await self._core.run(
            "reading the log", "XRANGE", self._core.key(sid, "log"), "-", "+", "COUNT", 1
        )
        return seq_of(raw[0][0]) if raw else 0

    async def last_seq(self, sid: str) -> int:
        raw = await self._core.run(
            "reading the log", "XREVRANGE", self._core.key(sid, "log"), "+", "-", "COUNT", 1
        )
        return seq_of(raw[0][0]) if raw else 0

    async def read_history(self, sid: str, start: int = 0, count: int = 0) -> list[bytes]:
        stop = start + count - 1 if count > 0 else -1
        raw = await self._core.run(
            "reading history", "LRANGE", self._core.key(sid, "history"), start, stop
        )
        return list(raw)

    # --- lease ---------------------------------------------------------------

    async def acquire_lease(self, sid: str, node: str, ttl: float) -> bool:
        lease_ms = ms(ttl, "lease ttl")
        core = self._core
        keys = [core.key(sid, "lease"), core.key(sid, "gone"), core.key(sid, "log")]
        self._commit.memo.forget(sid)  # leased anew: the next append reads the log's end
        return bool(await self._core.eval(ACQUIRE, keys, node, lease_ms))

    async def keep_leases(self, sids: Sequence[str], node: str, ttl: float) -> list[bool]:
        """One pipelined round trip per 500 sessions instead of one per session.

        A node with thousands of sessions renews them all every lease_ttl/3:
        one call each would hold pool connections and stall the event loop
        for a millisecond per few sessions.
        """
        lease_ms = ms(ttl, "lease ttl")
        held: list[bool] = []
        one_server = self._core.topology.single_server_connection() is not None
        for start in range(0, len(sids), 500):
            chunk = sids[start : start + 500]
            if one_server:
                held += await self._keep_on_one_server(chunk, node, ttl, lease_ms)
                continue
            try:
                async with self._core.client.pipeline(transaction=False) as pipe:
                    for sid in chunk:
                        pipe.execute_command(
                            "EVALSHA",
                            ACQUIRE.sha,
                            3,
                            self._core.key(sid, "lease"),
                            self._core.key(sid, "gone"),
                            self._core.key(sid, "log"),
                            node,
                            lease_ms,
                        )
                    replies = await pipe.execute(raise_on_error=False)
            except ERRORS as exc:
                raise self._core.error(exc, "renewing leases") from exc
            if any(isinstance(r, NoScriptError) for r in replies):
                # A flushed script cache: the single-call path reloads it.
                replies = [await self.acquire_lease(sid, node, ttl) for sid in chunk]
            for reply in replies:
                if isinstance(reply, Exception):
                    raise self._core.error(reply, "renewing leases")
                held.append(bool(reply))
        return held

    async def _keep_on_one_server(
        self, sids: Sequence[str], node: str, ttl: float, lease_ms: int
    ) -> list[bool]:
        """One ``KEEP`` call for these leases; one ``ACQUIRE`` each for those nobody holds."""
        keys = [self._core.key(sid, "lease") for sid in sids]
        replies = await self._core.eval(KEEP, keys, node, lease_ms)
        held: list[bool] = []
        for sid, reply in zip(sids, replies, strict=True):
            if reply == -1:  # expired during an outage, nobody took it: ours again
                held.append(await self.acquire_lease(sid, node, ttl))
            else:
                held.append(reply == 1)
        return held

    async def renew_lease(self, sid: str, node: str, ttl: float) -> bool:
        lease_ms = ms(ttl, "lease ttl")
        return bool(await self._core.eval(RENEW, [self._core.key(sid, "lease")], node, lease_ms))

    async def release_lease(self, sid: str, node: str) -> None:
        self._commit.memo.forget(sid)
        await self._core.eval(RELEASE, [self._core.key(sid, "lease")], node)

    async def lease_owner(self, sid: str) -> str | None:
        raw = await self._core.run("reading the lease", "GET", self._core.key(sid, "lease"))
        return raw.decode() if raw is not None else None

    async def lease_expires_in(self, sid: str) -> float:
        left_ms = await self._core.run("reading the lease", "PTTL", self._core.key(sid, "lease"))
        return max(int(left_ms), 0) / 1000  # -2: no lease; -1 (no expiry) is never set

    async def confirmed_seq(self, sid: str) -> int:
        """The log's last seq, once a replica confirms it (``CONFIRM`` then ``WAIT``).

        ``CONFIRM`` reads the last seq and writes (the idle TTL), so the
        ``WAIT`` after it on the same connection covers every earlier write of
        the session: a replica that acknowledges it has the log up to that seq.
        "local" durability asks nothing of replicas: the last seq it is.
        """
        if self.durability == "local":
            return await self.last_seq(sid)
        core = self._core
        keys = [core.key(sid, "meta"), core.key(sid, "log"), core.key(sid, "history")]
        confirm = ("EVALSHA", CONFIRM.sha, 3, *keys, core.ttl_ms)
        wait = ("WAIT", 1, self._replica_timeout_ms)
        budget = core.socket_timeout + self._replica_timeout_ms / 1000
        try:
            async with asyncio.timeout(budget):
                try:
                    last, acked = await core.topology.exchange(keys[1], [confirm, wait])
                except NoScriptError:
                    load = ("SCRIPT", "LOAD", CONFIRM.src)
                    _, last, acked = await core.topology.exchange(keys[1], [load, confirm, wait])
        except ERRORS as exc:  # also the deadline: TimeoutError is an OSError
            raise core.error(exc, "confirming the log with a replica") from exc
        name = core.topology.route(keys[1]).name
        if int(last) and int(acked) < 1:
            self._commit.replicas.confirmed(name, False)
            if self.durability == "replicated":
                raise Unreplicated(
                    f"Redis at {core.where}: no replica confirmed session {sid}'s log within "
                    f"{self._replica_timeout_ms} ms (durability replicated); its events are "
                    "held until one does; check that the replicas are up and in sync"
                )
        else:
            self._commit.replicas.confirmed(name, True)
        return int(last)
