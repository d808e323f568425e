"""``RedisStore``: the session store shared by many gateway nodes.

Every write that needs a check (the lease fence, "create if absent", compare-and-
delete) is one Lua script (``gateway.store.redis_scripts``), so it is atomic on
the server with no WATCH/MULTI round trips. Scripts are called by SHA
(``EVALSHA``); each new connection to a single Redis loads them first (so a
restarted, empty Redis never answers ``NOSCRIPT`` to a fresh connection), and a
``NOSCRIPT`` that still happens (``SCRIPT FLUSH``, a new cluster node) is
handled by loading and retrying.

Appends go through the group commit (``gateway.store.redis_commit``): one
pipelined round trip per node carries every append queued meanwhile. Where the
servers are (one Redis, Sentinel, Cluster) is ``gateway.store.redis_topology``'s
job; this module only says which keys and commands each operation uses.

Blocking reads (``XREAD BLOCK`` in ``wait_log``) use a separate pool, so
followers never take connections from the command pool that appends need.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.base import LogEntry, Store, StoreError, StoreUnavailable
from gateway.store.redis_commit import CommitStats, GroupCommit
from gateway.store.redis_connect import (
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    SINGLE_SCHEMES,
    open_topology,
)
from gateway.store.redis_pipe import AppendPipe
from gateway.store.redis_scripts import (
    ACQUIRE,
    CREATE,
    DELETE,
    HOLD_BYTES,
    INCR_WINDOW,
    READ_PAGE,
    RELEASE,
    RELEASE_BYTES,
    RENEW,
    SCRIPTS,
    SET_META,
    SLOT_ACQUIRE,
    SLOT_RENEW,
    LuaScript,
)

log = logging.getLogger("gateway.store")

__all__ = ["REDIS_SCHEMES", "Durability", "RedisStore", "StoreStats"]

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
REDIS_SCHEMES: Final = SINGLE_SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES
WAIT_LIMIT: Final = 1000
"""The most entries one ``wait_log`` call returns (a follower simply calls again)."""

Durability = Literal["local", "replicated"]
StoreStats = CommitStats

# RedisClusterException (no slot known, no node answers) is not a RedisError.
_ERRORS: Final = (RedisError, RedisClusterException, OSError)
# Server replies that mean "not now" rather than "wrong": the store is unavailable.
_TRANSIENT_REPLIES: Final = (
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "READONLY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
    "OOM",
    "MOVED",
    "ASK",
)


def _ms(seconds: float, what: str) -> int:
    if not seconds > 0:
        raise ValueError(f"{what} must be > 0 seconds, got {seconds!r}")
    return max(1, round(seconds * 1000))


def _seq(entry_id: bytes) -> int:
    return int(entry_id.partition(b"-")[0])


class RedisStore(Store):
    """The store for many nodes: every session in Redis, any node can serve any session.

    Construction does not connect: pools connect on first use and reconnect by
    themselves after an outage (which callers see as ``StoreUnavailable``).

    ``url`` is ``redis://``, ``rediss://`` or ``unix://`` for one server,
    ``redis+sentinel://H:P[,H:P…]/MASTER`` for the primary Sentinel names, or
    ``redis+cluster://H:P[,H:P…]`` for a Redis Cluster (see
    ``gateway.store.redis_topology``).

    ``prefix`` starts every key (``{prefix}:{SID}:log``). ``ttl`` is the idle time
    (s) after which a session's keys expire; each append or meta write restarts
    it. ``max_log`` bounds the log (``MAXLEN ~``: at least that many are kept).
    ``socket_timeout`` / ``connect_timeout`` bound how long a dead Redis can hold
    a call; ``health_check_interval`` pings connections idle longer than that.
    ``max_connections`` caps the command pool (per node on a Cluster; a caller
    waits up to ``socket_timeout`` for a free connection);
    ``max_blocking_connections`` caps the pool of ``wait_log`` followers
    (None: one connection per follower). ``max_batch`` caps the appends one
    flush carries. ``retry_window`` is how long an append keeps being sent
    again while a Cluster redirects it or a node refuses connections (a
    failover) before it fails with ``StoreUnavailable``.
    ``durability="replicated"`` reports an append stored only once a replica
    has it too (``WAIT 1 replica_timeout``); see ``gateway.store.redis_commit``.
    """

    kind = "redis"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        prefix: str = "rtgw",
        ttl: float = 86400.0,
        max_log: int = 10_000,
        socket_timeout: float = 5.0,
        connect_timeout: float = 2.0,
        health_check_interval: float = 10.0,
        max_connections: int = 64,
        max_blocking_connections: int | None = None,
        max_batch: int = 2000,
        retry_window: float = 2.0,
        durability: Durability = "local",
        replica_timeout: float = 1.0,
    ) -> None:
        if max_log < 1:
            raise ValueError(f"max_log must be >= 1, got {max_log!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        if durability not in ("local", "replicated"):
            raise ValueError(f"durability must be 'local' or 'replicated', got {durability!r}")
        if retry_window < 0:
            raise ValueError(f"retry_window must be >= 0 seconds, got {retry_window!r}")
        self.prefix = prefix
        self.ttl = ttl
        self.max_log = max_log
        self.durability = durability
        self.stats = StoreStats()
        self._ttl_ms = _ms(ttl, "ttl")
        self._socket_timeout = socket_timeout
        self._topology = open_topology(
            url,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            health_check_interval=health_check_interval,
            max_connections=max_connections,
            max_blocking_connections=max_blocking_connections,
            retry_window=retry_window,
            on_connect=self._on_connect,
        )
        self.kind = self._topology.kind
        self._where = self._topology.where
        self._r = self._topology.client
        # redis-py leaves execute_command untyped; this gives it a type once.
        self._cmd: Callable[..., Awaitable[Any]] = self._r.execute_command
        self._commit = GroupCommit(
            self._topology,
            prefix=prefix,
            ttl_ms=self._ttl_ms,
            max_log=max_log,
            max_batch=max_batch,
            socket_timeout=socket_timeout,
            retry_window=retry_window,
            replicas=1 if durability == "replicated" else 0,
            replica_timeout_ms=_ms(replica_timeout, "replica_timeout"),
            error=self._error,
            stats=self.stats,
            pipe=self._append_pipe(connect_timeout),
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "rtgw",
        ttl: float = 86400.0,
        max_log: int = 10_000,
        **options: Any,
    ) -> RedisStore:
        """A store for a Redis ``url`` of any scheme in ``REDIS_SCHEMES`` (see the class)."""
        return cls(url, prefix=prefix, ttl=ttl, max_log=max_log, **options)

    # --- internals -----------------------------------------------------------

    def _append_pipe(self, connect_timeout: float) -> AppendPipe | None:
        """The log writer's callback path, on one server (``gateway.store.redis_pipe``)."""
        make = self._topology.single_server_connection()
        if make is None:
            return None
        return AppendPipe(
            make,
            connect_timeout=connect_timeout,
            budget=self._socket_timeout,
            where=self._where,
        )

    def _key(self, sid: str, kind: str) -> str:
        return f"{self.prefix}:{{{sid}}}:{kind}"

    def _error(self, exc: BaseException, doing: str, after: str = "") -> StoreError:
        """The store error for a redis-py exception, saying what to do about it."""
        transient = isinstance(
            exc, RedisConnectionError | RedisTimeoutError | OSError | RedisClusterException
        ) or (isinstance(exc, ResponseError) and str(exc).startswith(_TRANSIENT_REPLIES))
        detail = str(exc).rstrip(".") or (
            f"no reply in {self._socket_timeout:g}s"
            if isinstance(exc, TimeoutError)
            else type(exc).__name__
        )
        if transient:
            return StoreUnavailable(
                f"Redis at {self._where} is unreachable while {doing}: {detail}{after}; "
                "the gateway retries; check REDIS_URL and that Redis is running"
            )
        return StoreError(f"Redis at {self._where} refused {doing}: {detail}")

    async def _on_connect(self, conn: AbstractConnection) -> None:
        """Handshake, then load every script, so EVALSHA works on this connection.

        A Redis that restarted has an empty script cache; loading on connect
        means appends after the restart never see NOSCRIPT, so a batch never
        half-fails with appends of one session running out of order.

        The handshake runs without health checks, as redis-py's own does: a
        health-check PING that fails mid-handshake reconnects, which would run
        this hook again inside itself and turn one timeout into a long hang.
        """
        handshake = getattr(conn, "on_connect_check_health", None)
        if handshake is not None:
            await handshake(check_health=False)
        else:  # redis-py < 6
            await conn.on_connect()
        await conn.send_packed_command(
            conn.pack_commands([("SCRIPT", "LOAD", s.src) for s in SCRIPTS]),
            check_health=False,
        )
        for _ in SCRIPTS:
            await conn.read_response()
        self.stats.connects += 1

    async def _eval(self, script: LuaScript, keys: Sequence[str], *args: Any) -> Any:
        """EVALSHA for the calls outside the group commit, loading on NOSCRIPT."""
        try:
            try:
                return await self._cmd("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                self.stats.noscript_reloads += 1
                await self._r.script_load(script.src)  # on every primary of a Cluster
                return await self._cmd("EVALSHA", script.sha, len(keys), *keys, *args)
        except _ERRORS as exc:
            raise self._error(exc, "running a script") from exc

    # --- meta ------------------------------------------------------------------

    def _meta_args(self, sid: str, fields: Mapping[str, str]) -> tuple[list[str], list[Any]]:
        keys = [self._key(sid, "meta"), self._key(sid, "log"), self._key(sid, "history")]
        args: list[Any] = [self._ttl_ms]
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
            args[0] = _ms(ttl, "ttl")
        return bool(await self._eval(CREATE, keys, *args))

    async def get_meta(self, sid: str) -> dict[str, str] | None:
        try:
            raw = await self._cmd("HGETALL", self._key(sid, "meta"))
        except _ERRORS as exc:
            raise self._error(exc, "reading meta") from exc
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
        await self._eval(SET_META, keys, *args)

    async def delete_session(self, sid: str) -> bool:
        keys = [
            self._key(sid, "meta"),
            self._key(sid, "log"),
            self._key(sid, "history"),
            self._key(sid, "lease"),
            self._key(sid, "gone"),
        ]
        return bool(await self._eval(DELETE, keys, self._ttl_ms))

    async def were_deleted(self, sids: Sequence[str]) -> list[bool]:
        """``EXISTS`` of each ``gone`` key, pipelined 500 at a time (one slot each)."""
        found: list[bool] = []
        for start in range(0, len(sids), 500):
            chunk = sids[start : start + 500]
            try:
                async with self._r.pipeline(transaction=False) as pipe:
                    for sid in chunk:
                        pipe.exists(self._key(sid, "gone"))
                    replies = await pipe.execute()
            except _ERRORS as exc:
                raise self._error(exc, "reading deleted sessions") from exc
            found.extend(bool(r) for r in replies)
        return found

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        """``SET NX`` then ``GET``: the first node's candidate wins, every node reads it."""
        key = f"{self.prefix}:secret:{name}"
        try:
            await self._cmd("SET", key, candidate, "NX")
            stored = await self._cmd("GET", key)
        except _ERRORS as exc:
            raise self._error(exc, "reading a shared secret") from exc
        return bytes(stored) if stored is not None else candidate

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
        batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> None:
        """On the append pipe when it is connected, else ``append_many`` in a task."""
        if not self._commit.send_on_pipe(batches, on_done):
            super().submit_appends(batches, on_done)

    async def append_many(
        self, batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]]
    ) -> list[BaseException | None]:
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
            key = self._key(sid, "log")
            raw = await self._eval(READ_PAGE, [key], max(after, 0) + 1, limit, max_bytes)
            return [LogEntry(_seq(entry_id), fields[1]) for entry_id, fields in raw]
        try:
            raw = await self._cmd(
                "XRANGE", self._key(sid, "log"), f"{max(after, 0) + 1}-0", "+", "COUNT", limit
            )
        except _ERRORS as exc:
            raise self._error(exc, "reading the log") from exc
        return [LogEntry(_seq(entry_id), fields[b"d"]) for entry_id, fields in raw]

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
        key = self._key(sid, "log")
        try:
            async with asyncio.timeout(timeout + self._socket_timeout):
                raw = await self._topology.blocking(
                    key,
                    "XREAD",
                    "COUNT",
                    limit,
                    "BLOCK",
                    block_ms,
                    "STREAMS",
                    key,
                    f"{max(after, 0)}-0",
                )
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"Redis at {self._where} did not answer a blocking read in "
                f"{timeout + self._socket_timeout:.1f}s; the gateway retries; "
                "check REDIS_URL and that Redis is running"
            ) from exc
        except _ERRORS as exc:
            raise self._error(exc, "waiting for the log") from exc
        if not raw:
            return []
        return [LogEntry(_seq(entry_id), fields[b"d"]) for entry_id, fields in raw[0][1]]

    async def first_seq(self, sid: str) -> int:
        try:
            raw = await self._cmd("XRANGE", self._key(sid, "log"), "-", "+", "COUNT", 1)
        except _ERRORS as exc:
            raise self._error(exc, "reading the log") from exc
        return _seq(raw[0][0]) if raw else 0

    async def last_seq(self, sid: str) -> int:
        try:
            raw = await self._cmd("XREVRANGE", self._key(sid, "log"), "+", "-", "COUNT", 1)
        except _ERRORS as exc:
            raise self._error(exc, "reading the log") from exc
        return _seq(raw[0][0]) if raw else 0

    async def read_history(self, sid: str) -> list[bytes]:
        try:
            raw = await self._cmd("LRANGE", self._key(sid, "history"), 0, -1)
        except _ERRORS as exc:
            raise self._error(exc, "reading history") from exc
        return list(raw)

    # --- lease ---------------------------------------------------------------

    async def acquire_lease(self, sid: str, node: str, ttl: float) -> bool:
        ms = _ms(ttl, "lease ttl")
        keys = [self._key(sid, "lease"), self._key(sid, "gone")]
        return bool(await self._eval(ACQUIRE, keys, node, ms))

    async def keep_leases(self, sids: Sequence[str], node: str, ttl: float) -> list[bool]:
        """One pipelined round trip per 500 sessions instead of one per session.

        A node with thousands of sessions renews them all every lease_ttl/3:
        one call each would hold pool connections and stall the event loop
        for a millisecond per few sessions.
        """
        ms = _ms(ttl, "lease ttl")
        held: list[bool] = []
        for start in range(0, len(sids), 500):
            chunk = sids[start : start + 500]
            try:
                async with self._r.pipeline(transaction=False) as pipe:
                    for sid in chunk:
                        pipe.execute_command(
                            "EVALSHA",
                            ACQUIRE.sha,
                            2,
                            self._key(sid, "lease"),
                            self._key(sid, "gone"),
                            node,
                            ms,
                        )
                    replies = await pipe.execute(raise_on_error=False)
            except _ERRORS as exc:
                raise self._error(exc, "renewing leases") from exc
            if any(isinstance(r, NoScriptError) for r in replies):
                # A flushed script cache: the single-call path reloads it.
                replies = [await self.acquire_lease(sid, node, ttl) for sid in chunk]
            for reply in replies:
                if isinstance(reply, Exception):
                    raise self._error(reply, "renewing leases")
                held.append(bool(reply))
        return held

    async def renew_lease(self, sid: str, node: str, ttl: float) -> bool:
        ms = _ms(ttl, "lease ttl")
        return bool(await self._eval(RENEW, [self._key(sid, "lease")], node, ms))

    async def release_lease(self, sid: str, node: str) -> None:
        await self._eval(RELEASE, [self._key(sid, "lease")], node)

    async def lease_owner(self, sid: str) -> str | None:
        try:
            raw = await self._cmd("GET", self._key(sid, "lease"))
        except _ERRORS as exc:
            raise self._error(exc, "reading the lease") from exc
        return raw.decode() if raw is not None else None

    # --- counters and slots (per-key limits) ----------------------------------

    async def incr_window(self, key: str, amount: int, ttl: float) -> int:
        ms = _ms(ttl, "counter ttl")
        return int(await self._eval(INCR_WINDOW, [f"{self.prefix}:limit:{key}"], amount, ms))

    async def acquire_slot(self, key: str, member: str, limit: int, ttl: float) -> bool:
        ms = _ms(ttl, "slot ttl")
        keys = [f"{self.prefix}:slots:{key}"]
        return bool(await self._eval(SLOT_ACQUIRE, keys, member, limit, ms))

    async def renew_slots(self, key: str, members: Sequence[str], ttl: float) -> None:
        if members:
            ms = _ms(ttl, "slot ttl")
            await self._eval(SLOT_RENEW, [f"{self.prefix}:slots:{key}"], ms, *members)

    async def release_slot(self, key: str, member: str) -> None:
        try:
            await self._cmd("ZREM", f"{self.prefix}:slots:{key}", member)
        except _ERRORS as exc:
            raise self._error(exc, "releasing a slot") from exc

    def _quota_keys(self, key: str) -> list[str]:
        # One hash tag: the three keys of a quota are one slot on a Cluster.
        return [f"{self.prefix}:quota:{{{key}}}:{part}" for part in ("at", "size", "total")]

    async def hold_bytes(
        self, key: str, member: str, size: int, limit: int, ttl: float
    ) -> tuple[bool, int]:
        if size < 0:
            raise ValueError(f"a quota holds sizes >= 0, got {size!r}")
        ms = _ms(ttl, "quota ttl")
        held, total = await self._eval(HOLD_BYTES, self._quota_keys(key), member, size, limit, ms)
        return bool(held), int(total)

    async def release_bytes(self, key: str, member: str) -> None:
        await self._eval(RELEASE_BYTES, self._quota_keys(key), member)

    # --- control messages -------------------------------------------------------

    def _channel(self, channel: str) -> str:
        return f"{self.prefix}:ctl:{channel}"

    async def publish(self, channel: str, data: bytes) -> int:
        """``PUBLISH``; on a Cluster ``SPUBLISH``, which only the channel's shard carries."""
        try:
            return await self._topology.publish(self._channel(channel), data)
        except _ERRORS as exc:
            raise self._error(exc, "publishing a control message") from exc

    async def listen(self, channel: str, handler: Callable[[bytes], None]) -> None:
        """Subscribe on a connection of its own; after an outage or a failover, again."""
        name = self._channel(channel)
        while True:
            try:
                async with self._topology.messages(name) as messages:
                    async for data in messages:
                        handler(data)
            except _ERRORS as exc:
                log.warning("%s; listening again in 1s", self._error(exc, "listening"))
                await asyncio.sleep(1.0)

    # --- lifecycle -------------------------------------------------------------

    async def ping(self) -> bool:
        """True when Redis answers; False (not an exception) when it does not."""
        try:
            await self._topology.prepare()
            return bool(await self._cmd("PING"))
        except _ERRORS:
            return False

    async def close(self) -> None:
        """Let the in-flight and queued appends finish, then close every connection."""
        await self._commit.close()
        await self._topology.close()
