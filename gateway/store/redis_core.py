"""What every Redis concern shares: the servers, key names, scripts, and what errors mean.

``RedisSessions``, ``RedisCounters``, ``RedisBus`` and ``RedisSecrets`` each hold
one ``RedisCore``; ``RedisStore`` gives all four the same one, so one store has
one set of connections. Where the servers are (one Redis, Sentinel, Cluster) is
``gateway.store.redis_topology``'s job; this module says how a command is run.

Every write that needs a check (the lease fence, "create if absent", compare-and-
delete) is one Lua script (``gateway.store.redis_scripts``), so it is atomic on
the server with no WATCH/MULTI round trips. Scripts are called by SHA
(``EVALSHA``); each new connection to a single Redis loads them first (so a
restarted, empty Redis never answers ``NOSCRIPT`` to a fresh connection), and a
``NOSCRIPT`` that still happens (``SCRIPT FLUSH``, a new cluster node) is
handled by loading and retrying.

**Failovers.** A command that certainly did not run (refused connection, or a
``MOVED``/``TRYAGAIN``/``CLUSTERDOWN``/``READONLY``/``LOADING`` reply) is sent
again with backoff for up to ``retry_window`` seconds, so a client's message
that arrives while its shard fails over waits rather than bounces; a read or
an idempotent script is also sent again after a lost connection. Only then
does the caller see ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.base import StoreError, StoreUnavailable
from gateway.store.redis_commit import CommitStats
from gateway.store.redis_connect import open_topology
from gateway.store.redis_refusal import closed_at_once, refusal
from gateway.store.redis_scripts import SCRIPTS, LuaScript
from gateway.store.redis_topology import Topology

__all__ = ["ERRORS", "MAX_SUB_ID", "RedisCore", "ms", "seq_of"]

# RedisClusterException (no slot known, no node answers) is not a RedisError.
ERRORS: Final = (RedisError, RedisClusterException, OSError)
# Server replies that mean "not now" rather than "wrong": the store is unavailable.
# NOSCRIPT too: the store loads the script and sends again, and a promoted Cluster
# replica answers it to its first appends (Redis 7 does not replicate SCRIPT LOAD),
# so an append whose retry window ends on it is one more failover casualty.
_TRANSIENT_REPLIES: Final = (
    "NOSCRIPT",
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
# Of those, the replies that say the command did not run.
_NOT_RUN_REPLIES: Final = ("LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MOVED")


def ms(seconds: float, what: str) -> int:
    """``seconds`` as whole milliseconds (at least 1); ValueError unless positive."""
    if not seconds > 0:
        raise ValueError(f"{what} must be > 0 seconds, got {seconds!r}")
    return max(1, round(seconds * 1000))


MAX_SUB_ID: Final = 2**64 - 1
"""The largest second part of a stream ID: ``<seq>-MAX_SUB_ID`` is past every entry of a
seq (``<seq>-0``, or ``<seq>-1`` past a fence: ``redis_scripts.ACQUIRE``)."""


def seq_of(entry_id: bytes) -> int:
    """The seq of a stream entry id ``SEQ-0`` (or ``SEQ-1``)."""
    return int(entry_id.partition(b"-")[0])


def _not_run(exc: BaseException) -> bool:
    """The command certainly did not run: it may be sent again whatever it does."""
    if isinstance(exc, ResponseError):
        return str(exc).startswith(_NOT_RUN_REPLIES)
    # redis-py words a refused or unreachable connect "Error N connecting to H:P".
    return isinstance(exc, RedisConnectionError | RedisClusterException) and (
        "connecting to" in str(exc) or isinstance(exc, RedisClusterException)
    )


class RedisCore:
    """One store's servers and the rules for talking to them (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        ttl: float,
        socket_timeout: float,
        connect_timeout: float,
        health_check_interval: float,
        max_connections: int,
        max_blocking_connections: int | None,
        retry_window: float,
    ) -> None:
        if retry_window < 0:
            raise ValueError(f"retry_window must be >= 0 seconds, got {retry_window!r}")
        self.prefix = prefix
        self.ttl_ms = ms(ttl, "ttl")
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.retry_window = retry_window
        self.stats = CommitStats()
        self.topology: Topology = open_topology(
            url,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            health_check_interval=health_check_interval,
            max_connections=max_connections,
            max_blocking_connections=max_blocking_connections,
            retry_window=retry_window,
            on_connect=self._on_connect,
        )
        self.kind = self.topology.kind
        self.where = self.topology.where
        self.client: Any = self.topology.client
        # redis-py leaves execute_command untyped; this gives it a type once.
        self._cmd: Callable[..., Awaitable[Any]] = self.client.execute_command

    def key(self, sid: str, kind: str) -> str:
        """A session's key: ``{prefix}:{SID}:{kind}`` (the hash tag keeps a session on one slot)."""
        return f"{self.prefix}:{{{sid}}}:{kind}"

    def error(self, exc: BaseException, doing: str, after: str = "") -> StoreError:
        """The store error for a redis-py exception, saying what to do about it."""
        transient = isinstance(
            exc, RedisConnectionError | RedisTimeoutError | OSError | RedisClusterException
        ) or (isinstance(exc, ResponseError) and str(exc).startswith(_TRANSIENT_REPLIES))
        detail = str(exc).rstrip(".") or (
            f"no reply in {self.socket_timeout:g}s"
            if isinstance(exc, TimeoutError)
            else type(exc).__name__
        )
        # A refusal no wait fixes (a wrong password…) says what to change; the error's
        # kind stays, so callers retry as before (the password may be fixed meanwhile).
        why = None if closed_at_once(exc) else refusal(exc, self.where)
        if why is not None:
            return (StoreUnavailable if transient else StoreError)(f"{why} (while {doing})")
        if transient:
            return StoreUnavailable(
                f"Redis at {self.where} is unreachable while {doing}: {detail}{after}; "
                "the gateway retries; check --store (GATEWAY_STORE, REDIS_URL) and that "
                "Redis is running"
            )
        return StoreError(f"Redis at {self.where} refused {doing}: {detail}")

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

    async def run(self, doing: str, *args: Any, again: bool = True) -> Any:
        """One command, sent again through a failover (see the module docstring).

        ``again``: the command may be sent again after a lost connection too
        (a read, or a write that does the same when run twice).
        """
        deadline = time.monotonic() + self.retry_window
        delay = 0.05
        while True:
            try:
                return await self._cmd(*args)
            except ERRORS as exc:
                transient = _not_run(exc) or (
                    again and isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError)
                )
                if not transient or time.monotonic() + delay > deadline:
                    raise self.error(exc, doing) from exc
            self.stats.redirects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def eval(
        self, script: LuaScript, keys: Sequence[str], *args: Any, again: bool = True
    ) -> Any:
        """EVALSHA outside the group commit, loading the script on NOSCRIPT."""
        call = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return await self.run("running a script", *call, again=again)
        except StoreError as exc:
            if not isinstance(exc.__cause__, NoScriptError):
                raise
        self.stats.noscript_reloads += 1
        try:
            await self.client.script_load(script.src)  # on every primary of a Cluster
        except ERRORS as exc:
            raise self.error(exc, "loading a script") from exc
        return await self.run("running a script", *call, again=again)
