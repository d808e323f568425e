"""``RedisStore``: the session store shared by many gateway nodes.

Every write that needs a check (the lease fence, "create if absent", compare-and-
delete) is one Lua script, so it is atomic on the server with no WATCH/MULTI
round trips. Scripts are called by SHA (``EVALSHA``); each new connection loads
them first (so a restarted, empty Redis never answers ``NOSCRIPT`` to a fresh
connection), and a ``NOSCRIPT`` that still happens (``SCRIPT FLUSH``) is handled
by loading and retrying.

**Group commit.** The gateway logs every small batch of token events before
sending it ("log, then send"), for many sessions at once. ``append`` only queues
its ``EVALSHA`` and awaits a future; one flusher task sends everything queued in
the same event-loop tick, and everything queued while a flush is in flight, as
one pipelined write and one read of the replies. Throughput grows with load
while latency stays about one round trip, and each caller still gets its own
result or error. The queue is FIFO and one connection runs the scripts in order,
so one session's appends land in call order. The flusher keeps that connection
(a pool checkout per flush costs more CPU than a small flush), packs each
command once in ``append`` and reads the one-line replies in bulk.

Blocking reads (``XREAD BLOCK`` in ``wait_log``) use a separate pool, so
followers never take connections from the command pool that appends need.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.base import (
    LeaseLost,
    LogEntry,
    SeqConflict,
    Store,
    StoreError,
    StoreUnavailable,
)

log = logging.getLogger("gateway.store")

__all__ = ["RedisStore", "StoreStats"]

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
WAIT_LIMIT: Final = 1000
"""The most entries one ``wait_log`` call returns (a follower simply calls again)."""

_ERRORS: Final = (RedisError, OSError)
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
)


class _Script:
    """A Lua script and its SHA1, computed locally: no round trip to learn it."""

    __slots__ = ("sha", "src")

    def __init__(self, src: str) -> None:
        self.src = src
        self.sha = hashlib.sha1(src.encode()).hexdigest()


# KEYS: meta, log, history, lease.
# ARGV: node, ttl_ms, max_log, first_seq, n_entries, data_1..data_n, history...
# Seqs are first_seq + i: the caller checked they are consecutive, so only the
# bytes travel. The log's last seq comes from XREVRANGE COUNT 1 (O(log N), no
# extra write); a meta ``last_seq`` field would cost an HSET per append and
# could disagree with the stream. Only the last XADD trims: once per call.
_APPEND = _Script(
    """
local owner = redis.call('GET', KEYS[4])
if owner ~= ARGV[1] then
  return redis.error_reply('LEASELOST ' .. (owner or ''))
end
local n = tonumber(ARGV[5])
if n > 0 then
  local first = tonumber(ARGV[4])
  local last = 0
  local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if top[1] then
    last = tonumber(string.match(top[1][1], '^%d+'))
  end
  if first ~= last + 1 then
    return redis.error_reply('SEQCONFLICT ' .. string.format('%d', last))
  end
  for i = 1, n - 1 do
    redis.call('XADD', KEYS[2], string.format('%d-0', first + i - 1), 'd', ARGV[5 + i])
  end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3],
    string.format('%d-0', first + n - 1), 'd', ARGV[5 + n])
end
local h = 6 + n
while h <= #ARGV do
  local stop = math.min(h + 999, #ARGV)
  redis.call('RPUSH', KEYS[3], unpack(ARGV, h, stop))
  h = stop + 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1
"""
)

# KEYS: meta, log, history. ARGV: ttl_ms, field, value, ...
_CREATE = _Script(
    """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return 1
"""
)

# Same keys and args as _CREATE; only touches a session that exists, so a late
# write cannot resurrect an expired session as a partial meta hash.
_SET_META = _Script(
    """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return 1
"""
)

# KEYS: lease. ARGV: node, ttl_ms.
_ACQUIRE = _Script(
    """
local owner = redis.call('GET', KEYS[1])
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
)

_RENEW = _Script(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
)

# KEYS: lease. ARGV: node.
_RELEASE = _Script(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""
)

# Limits (gateway.sessions.limits). KEYS: counter. ARGV: amount, ttl_ms. The TTL is set
# once, when the window's counter is created: adding never extends a window.
_INCR_WINDOW = _Script(
    """
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return v
"""
)

# KEYS: slots (sorted set member → deadline in ms of the server's clock, so
# nodes with skewed clocks agree). ARGV: member, limit, ttl_ms. Expired members
# (a dead node's connections) are dropped before counting.
_SLOT_ACQUIRE = _Script(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[2])
if limit > 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1])
    and redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# KEYS: slots. ARGV: ttl_ms, member... Only members still live are extended.
_SLOT_RENEW = _Script(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i])
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 1
"""
)

_SCRIPTS: Final = (
    _APPEND,
    _CREATE,
    _SET_META,
    _ACQUIRE,
    _RENEW,
    _RELEASE,
    _INCR_WINDOW,
    _SLOT_ACQUIRE,
    _SLOT_RENEW,
)


@dataclass(slots=True)
class StoreStats:
    """Counters for the group commit and reconnects (for tests, metrics and benches)."""

    appends: int = 0
    """``append`` calls queued."""
    flushes: int = 0
    """Pipelined round trips that carried appends (``appends / flushes`` = batch size)."""
    max_batch: int = 0
    """The most appends one flush carried."""
    connects: int = 0
    """Command connections opened (each loads the scripts)."""
    noscript_reloads: int = 0
    """Times a ``NOSCRIPT`` reply made the store load its scripts and retry."""


# One queued append: (packed EVALSHA command, caller's future, sid, node, first seq).
_Pending = tuple[bytes, "asyncio.Future[None]", str, str, int]


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


# EVALSHA <sha> 4: the constant start of every packed append.
_APPEND_HEAD: Final = _bulk(b"EVALSHA") + _bulk(_APPEND.sha.encode()) + _bulk(b"4")


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

    ``prefix`` starts every key (``{prefix}:{SID}:log``). ``ttl`` is the idle time
    (s) after which a session's keys expire; each append or meta write restarts
    it. ``max_log`` bounds the log (``MAXLEN ~``: at least that many are kept).
    ``socket_timeout`` / ``connect_timeout`` bound how long a dead Redis can hold
    a call; ``health_check_interval`` pings connections idle longer than that.
    ``max_connections`` caps the command pool (a caller waits up to
    ``socket_timeout`` for a free connection; the group commit keeps one of
    them); ``max_blocking_connections`` caps the pool of ``wait_log`` followers
    (None: one connection per follower).
    ``max_batch`` caps the appends one flush carries.
    """

    kind = "redis"
    bulk_replies: bool = True
    """Read append replies straight from the connection's stream (see ``_replies``).

    False uses redis-py's reply parser: slower, but touches no redis-py internals.
    """

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
    ) -> None:
        if max_log < 1:
            raise ValueError(f"max_log must be >= 1, got {max_log!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        self.prefix = prefix
        self.ttl = ttl
        self.max_log = max_log
        self.stats = StoreStats()
        self._ttl_ms = _ms(ttl, "ttl")
        self._append_limits = _bulk(b"%d" % self._ttl_ms) + _bulk(b"%d" % max_log)
        self._socket_timeout = socket_timeout
        self._max_batch = max_batch
        common: dict[str, Any] = {
            "protocol": 2,  # replies are parsed in their RESP2 shapes
            "socket_connect_timeout": connect_timeout,
            "health_check_interval": health_check_interval,
        }
        # Fail fast and let the caller decide: one immediate retry covers a
        # pooled connection that died idle; anything longer is an outage to
        # report, not to wait out inside a call.
        self._pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=socket_timeout,
            socket_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 1),
            redis_connect_func=self._on_connect,
            **common,
        )
        # No socket timeout: a blocking read legitimately waits, and wait_log
        # bounds it with its own deadline. No retry: a retried XREAD BLOCK would
        # wait its full time again, past that deadline; the follower retries.
        self._blocking_pool = ConnectionPool.from_url(
            url,
            max_connections=max_blocking_connections,
            socket_timeout=None,
            retry=Retry(NoBackoff(), 0),
            **common,
        )
        if str(self._pool.connection_kwargs.get("protocol")) != "2":
            raise ValueError(
                f"RedisStore speaks RESP2; remove protocol= from the Redis URL {url!r}"
            )
        self._r = Redis.from_pool(self._pool)
        self._blocking = Redis.from_pool(self._blocking_pool)
        # redis-py leaves execute_command untyped; these give it a type once.
        self._cmd: Callable[..., Awaitable[Any]] = self._r.execute_command
        self._blocking_cmd: Callable[..., Awaitable[Any]] = self._blocking.execute_command
        self._get_connection: Callable[[], Awaitable[AbstractConnection]] = (
            self._pool.get_connection
        )
        self._where = self._describe(self._pool)
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._conn: AbstractConnection | None = None  # the group commit's own connection

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
        """A store for ``redis://``, ``rediss://`` or ``unix://`` ``url`` (see the class)."""
        return cls(url, prefix=prefix, ttl=ttl, max_log=max_log, **options)

    # --- internals -----------------------------------------------------------

    @staticmethod
    def _describe(pool: ConnectionPool) -> str:
        kw = pool.connection_kwargs
        if "path" in kw:
            return f"unix:{kw['path']}"
        return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"

    def _key(self, sid: str, kind: str) -> str:
        return f"{self.prefix}:{{{sid}}}:{kind}"

    def _error(self, exc: BaseException, doing: str, after: str = "") -> StoreError:
        """The store error for a redis-py exception, saying what to do about it."""
        transient = isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError) or (
            isinstance(exc, ResponseError) and str(exc).startswith(_TRANSIENT_REPLIES)
        )
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
            conn.pack_commands([("SCRIPT", "LOAD", s.src) for s in _SCRIPTS]),
            check_health=False,
        )
        for _ in _SCRIPTS:
            await conn.read_response()
        self.stats.connects += 1

    async def _eval(self, script: _Script, keys: Sequence[str], *args: Any) -> Any:
        """EVALSHA for the calls outside the group commit, loading on NOSCRIPT."""
        try:
            try:
                return await self._cmd("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                self.stats.noscript_reloads += 1
                await self._cmd("SCRIPT", "LOAD", script.src)
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

    async def create_session(self, sid: str, meta: Mapping[str, str]) -> bool:
        if not meta:
            raise ValueError("create_session needs at least one meta field")
        keys, args = self._meta_args(sid, meta)
        return bool(await self._eval(_CREATE, keys, *args))

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
        await self._eval(_SET_META, keys, *args)

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
        await self._enqueue(sid, node, entries, history)

    async def append_many(
        self, batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]]
    ) -> list[BaseException | None]:
        """All the appends go into the same group commit; one wait for all of them."""
        futures: list[asyncio.Future[None]] = []
        early: dict[int, BaseException] = {}
        for i, (sid, node, entries, history) in enumerate(batches):
            try:
                futures.append(self._enqueue(sid, node, entries, history))
            except ValueError as exc:
                early[i] = exc
        results: list[BaseException | None] = list(
            await asyncio.gather(*futures, return_exceptions=True)
        )
        for i in sorted(early):
            results.insert(i, early[i])
        return results

    def _enqueue(
        self,
        sid: str,
        node: str,
        entries: Sequence[LogEntry],
        history: Sequence[bytes],
    ) -> asyncio.Future[None]:
        """Pack one append, queue it for the group commit; its future settles with it."""
        # The command is packed here, as RESP bytes, once: redis-py's generic
        # packer costs several times more per command than the whole script
        # takes to run on the server, and the flush just concatenates.
        n = len(entries)
        first = entries[0].seq if n else 0
        key = f"{self.prefix}:{{{sid}}}:".encode()
        node_b = node.encode()
        first_b = b"%d" % first
        n_b = b"%d" % n
        parts = [
            b"*%d\r\n" % (12 + n + len(history)),
            _APPEND_HEAD,
            b"$%d\r\n%bmeta\r\n" % (len(key) + 4, key),
            b"$%d\r\n%blog\r\n" % (len(key) + 3, key),
            b"$%d\r\n%bhistory\r\n" % (len(key) + 7, key),
            b"$%d\r\n%blease\r\n" % (len(key) + 5, key),
            b"$%d\r\n%b\r\n" % (len(node_b), node_b),
            self._append_limits,
            b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(first_b), first_b, len(n_b), n_b),
        ]
        expect = first
        for seq, data in entries:
            if seq != expect:
                raise ValueError(
                    f"append to {sid}: entries must have consecutive seqs, "
                    f"got {seq} after {expect - 1}"
                )
            parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
            expect += 1
        for item in history:
            parts.append(b"$%d\r\n%b\r\n" % (len(item), item))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.append((b"".join(parts), future, sid, node, first))
        self.stats.appends += 1
        if self._flusher is None:
            # Started, not run: it first runs after every task that is ready in
            # this tick has had its turn to queue, which is the coalescing.
            self._flusher = loop.create_task(self._flush_loop())
        return future

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
                    self._fail(batch, StoreUnavailable(f"append not completed: {exc!r}; retry"))
                    raise
        finally:
            # Normally empty; non-empty only if this task was cancelled (close).
            pending, self._queue = self._queue, []
            self._flusher = None
            for _, future, sid, *_ in pending:
                if not future.done():
                    future.set_exception(
                        StoreUnavailable(
                            f"append to {sid} not sent: the store was closed; "
                            "open a new store and retry"
                        )
                    )

    async def _flush(self, batch: list[_Pending]) -> None:
        stats = self.stats
        stats.flushes += 1
        if len(batch) > stats.max_batch:
            stats.max_batch = len(batch)
        conn = self._conn
        if conn is None:
            # Taken once and kept: checking a connection out of the pool and back
            # costs more CPU than a small flush itself.
            try:
                conn = self._conn = await self._get_connection()
            except _ERRORS as exc:
                self._fail(batch, self._error(exc, "appending", "; nothing was stored"))
                return
        else:
            reader = getattr(conn, "_reader", None)
            if isinstance(reader, asyncio.StreamReader) and reader.at_eof():
                # Redis closed it while idle (a restart): reconnect, as the pool
                # would on checkout, rather than fail a flush on a dead socket.
                await self._drop(conn)
        retry = await self._send(conn, batch)
        if retry:
            # The script cache was flushed under us: load once, resend those.
            stats.noscript_reloads += 1
            try:
                await conn.send_command("SCRIPT", "LOAD", _APPEND.src)
                await conn.read_response()
            except _ERRORS as exc:
                self._fail(retry, self._error(exc, "loading the append script"))
                return
            for item in await self._send(conn, retry):
                self._fail([item], StoreError("NOSCRIPT right after SCRIPT LOAD; retry"))

    async def _send(self, conn: AbstractConnection, batch: list[_Pending]) -> list[_Pending]:
        """One pipelined round trip; settles each future; returns the NOSCRIPT ones.

        One deadline covers the whole batch, not one per reply. On any failure
        the connection is dropped (replies may be half read) and every append
        not yet answered fails with ``StoreUnavailable``.
        """
        noscript: list[_Pending] = []
        settled = 0
        try:
            async with asyncio.timeout(self._socket_timeout):
                await conn.send_packed_command([item[0] for item in batch])
                reader = getattr(conn, "_reader", None)
                if self.bulk_replies and isinstance(reader, asyncio.StreamReader):
                    replies = self._replies(reader, len(batch))
                else:  # no asyncio stream to read from: redis-py's parser
                    replies = self._parsed_replies(conn, len(batch))
                async for lines in replies:
                    for line in lines:
                        item = batch[settled]
                        settled += 1
                        if line == b":1":
                            future = item[1]
                            if not future.done():
                                future.set_result(None)
                        elif line.startswith(b"-NOSCRIPT"):
                            noscript.append(item)
                        else:
                            self._reject(item, line)
        except _ERRORS as exc:  # also the deadline: TimeoutError is an OSError
            self._fail(
                noscript + batch[settled:],
                self._error(
                    exc,
                    "appending",
                    "; the append may or may not be stored: read last_seq before writing again",
                ),
            )
            await self._drop(conn)
            return []
        except BaseException:
            self._fail(
                noscript + batch[settled:],
                StoreUnavailable("append interrupted (the store is closing); retry"),
            )
            await self._drop(conn)
            raise
        return noscript

    @staticmethod
    async def _drop(conn: AbstractConnection) -> None:
        """Close a connection whose replies may be half read; it reconnects on next use."""
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)

    @staticmethod
    async def _replies(reader: asyncio.StreamReader, count: int) -> AsyncIterator[list[bytes]]:
        """The next ``count`` reply lines, read in bulk from the connection's stream.

        The append script only answers ``:1`` or one error line, so a reply is
        a line. Parsing each through redis-py's parser instead costs about half
        again the client CPU of an append (measured at 1,000 sessions: ~6-9 µs
        per append this way, ~9-11 µs through the parser). Safe because the
        connection is ours for the round trip and idle before it (RESP2, no
        push messages): the stream holds nothing but these replies.
        """
        rest = b""
        while count > 0:
            chunk = await reader.read(65536)
            if not chunk:
                raise RedisConnectionError("Redis closed the connection")
            *lines, rest = (rest + chunk).split(b"\r\n")
            count -= len(lines)
            if count < 0:
                raise RedisConnectionError("more replies than appends: protocol out of sync")
            if lines:
                yield lines

    @staticmethod
    async def _parsed_replies(conn: AbstractConnection, count: int) -> AsyncIterator[list[bytes]]:
        """The same lines, through redis-py's parser (the portable, slower way)."""
        for _ in range(count):
            try:
                reply = await conn.read_response(timeout=math.inf)
            except NoScriptError:  # redis-py strips the error code of this one
                yield [b"-NOSCRIPT"]
            except ResponseError as exc:
                yield [b"-" + str(exc).encode()]
            else:
                yield [b":%d" % reply]

    def _reject(self, item: _Pending, reply: bytes) -> None:
        """Turn the append script's reply line (``-LEASELOST owner``, …) into an exception."""
        _, future, sid, node, first = item
        message = reply[1:].decode(errors="replace")
        error: StoreError
        if message.startswith("LEASELOST"):
            holder = message[10:] or "nobody"
            error = LeaseLost(
                f"session {sid}: node {node!r} does not hold the lease "
                f"(held by {holder}); stop driving this session"
            )
        elif message.startswith("SEQCONFLICT"):
            error = SeqConflict(
                f"session {sid}: append starts at seq {first} but the log ends "
                f"at {message[12:]}; another writer raced: reload last_seq before writing"
            )
        else:
            error = self._error(ResponseError(message), "appending")
        if not future.done():
            future.set_exception(error)

    @staticmethod
    def _fail(items: Sequence[_Pending], error: StoreError) -> None:
        for _, future, *_ in items:
            if not future.done():
                future.set_exception(error)

    async def read_log(self, sid: str, after: int, limit: int = 1000) -> list[LogEntry]:
        if limit <= 0:
            return []
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
                raw = await self._blocking_cmd(
                    "XREAD", "COUNT", limit, "BLOCK", block_ms, "STREAMS", key, f"{max(after, 0)}-0"
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
        return bool(await self._eval(_ACQUIRE, [self._key(sid, "lease")], node, ms))

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
                        pipe.evalsha(_ACQUIRE.sha, 1, self._key(sid, "lease"), node, ms)
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
        return bool(await self._eval(_RENEW, [self._key(sid, "lease")], node, ms))

    async def release_lease(self, sid: str, node: str) -> None:
        await self._eval(_RELEASE, [self._key(sid, "lease")], node)

    async def lease_owner(self, sid: str) -> str | None:
        try:
            raw = await self._cmd("GET", self._key(sid, "lease"))
        except _ERRORS as exc:
            raise self._error(exc, "reading the lease") from exc
        return raw.decode() if raw is not None else None

    # --- counters and slots (per-key limits) ----------------------------------

    async def incr_window(self, key: str, amount: int, ttl: float) -> int:
        ms = _ms(ttl, "counter ttl")
        return int(await self._eval(_INCR_WINDOW, [f"{self.prefix}:limit:{key}"], amount, ms))

    async def acquire_slot(self, key: str, member: str, limit: int, ttl: float) -> bool:
        ms = _ms(ttl, "slot ttl")
        keys = [f"{self.prefix}:slots:{key}"]
        return bool(await self._eval(_SLOT_ACQUIRE, keys, member, limit, ms))

    async def renew_slots(self, key: str, members: Sequence[str], ttl: float) -> None:
        if members:
            ms = _ms(ttl, "slot ttl")
            await self._eval(_SLOT_RENEW, [f"{self.prefix}:slots:{key}"], ms, *members)

    async def release_slot(self, key: str, member: str) -> None:
        try:
            await self._cmd("ZREM", f"{self.prefix}:slots:{key}", member)
        except _ERRORS as exc:
            raise self._error(exc, "releasing a slot") from exc

    # --- control messages -------------------------------------------------------

    def _channel(self, channel: str) -> str:
        return f"{self.prefix}:ctl:{channel}"

    async def publish(self, channel: str, data: bytes) -> None:
        try:
            await self._cmd("PUBLISH", self._channel(channel), data)
        except _ERRORS as exc:
            raise self._error(exc, "publishing a control message") from exc

    async def listen(self, channel: str, handler: Callable[[bytes], None]) -> None:
        """SUBSCRIBE on its own connection; after an outage, subscribe again."""
        name = self._channel(channel)
        while True:
            pubsub = self._blocking.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(name)
                while True:
                    message = await pubsub.get_message(timeout=30.0)
                    if message is not None and message.get("type") == "message":
                        handler(message["data"])
            except _ERRORS as exc:
                log.warning("%s; listening again in 1s", self._error(exc, "listening"))
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    # --- lifecycle -------------------------------------------------------------

    async def ping(self) -> bool:
        """True when Redis answers; False (not an exception) when it does not."""
        try:
            return bool(await self._cmd("PING"))
        except _ERRORS:
            return False

    async def close(self) -> None:
        """Let the in-flight and queued appends finish, then close both pools."""
        flusher = self._flusher
        if flusher is not None:
            # asyncio.wait does not cancel the flusher if close() itself is cancelled.
            await asyncio.wait({flusher})
        if self._conn is not None:
            await self._pool.release(self._conn)
            self._conn = None
        await self._r.aclose()
        await self._blocking.aclose()
