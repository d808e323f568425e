"""``RedisStore``: every concern of the store in Redis, for many gateway nodes.

One ``RedisCore`` (the servers and how commands run) shared by the concern
classes, each in its own module beside its memory twin: ``RedisSessions``
(meta, log, history, lease), ``RedisCounters``, ``RedisBus``, ``RedisSecrets``,
``RedisRecordings``. ``RedisStore`` is all of them on one set of connections: what ``open_store``
gives for a Redis URL.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from gateway.store.base import Durability
from gateway.store.redis_bus import RedisBus
from gateway.store.redis_commit import CommitStats
from gateway.store.redis_connect import CLUSTER_SCHEMES, SENTINEL_SCHEMES, SINGLE_SCHEMES
from gateway.store.redis_core import ERRORS, RedisCore
from gateway.store.redis_counters import RedisCounters
from gateway.store.redis_recordings import RedisRecordings
from gateway.store.redis_refusal import (
    Unasked,
    closed_at_once,
    connection_lost,
    not_redis,
    refusal,
    spoken_first,
    unasked_words,
)
from gateway.store.redis_secrets import RedisSecrets
from gateway.store.redis_sessions import RedisSessions

__all__ = ["REDIS_SCHEMES", "RedisStore", "StoreStats"]

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
REDIS_SCHEMES: Final = SINGLE_SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES

StoreStats = CommitStats


class RedisStore(RedisSessions, RedisCounters, RedisBus, RedisSecrets, RedisRecordings):
    """The store for many nodes: every session in Redis, any node can serve any session.

    Construction does not connect: pools connect on first use and reconnect by
    themselves after an outage (which callers see as ``StoreUnavailable``).

    ``url`` is ``redis://``, ``rediss://`` or ``unix://`` for one server,
    ``redis+sentinel://H:P[,H:P…]/MASTER`` for the primary Sentinel names, or
    ``redis+cluster://H:P[,H:P…]`` for a Redis Cluster (see
    ``gateway.store.redis_topology``).

    ``prefix`` starts every key (``{prefix}:{SID}:log``). ``ttl`` is the idle time
    (s) after which a session's keys expire; each append or meta write restarts
    it. ``socket_timeout`` / ``connect_timeout`` bound how long a dead Redis can
    hold a call; ``health_check_interval`` pings connections idle longer than
    that. ``max_connections`` caps the command pool (per node on a Cluster; a
    caller waits up to ``socket_timeout`` for a free connection);
    ``max_blocking_connections`` caps the pool of ``wait_log`` followers
    (None: one connection per follower). ``retry_window`` is how long a command
    keeps being sent again while a Cluster redirects it or a node refuses
    connections (a failover) before it fails with ``StoreUnavailable``.
    ``max_log``, ``max_batch``, ``durability`` and ``replica_timeout`` are the
    session log's (``RedisSessions``).
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
        retry_window: float = 2.0,
        durability: Durability = "local",
        replica_timeout: float = 1.0,
    ) -> None:
        if durability not in ("local", "replicated", "replicated-or-local"):
            raise ValueError(
                "durability must be 'local', 'replicated' or 'replicated-or-local', "
                f"got {durability!r}"
            )
        core = RedisCore(
            url,
            prefix=prefix,
            ttl=ttl,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            health_check_interval=health_check_interval,
            max_connections=max_connections,
            max_blocking_connections=max_blocking_connections,
            retry_window=retry_window,
        )
        RedisSessions.__init__(
            self,
            core,
            max_log=max_log,
            max_batch=max_batch,
            durability=durability,
            replica_timeout=replica_timeout,
        )
        RedisCounters.__init__(self, core)
        RedisBus.__init__(self, core)
        RedisSecrets.__init__(self, core)
        RedisRecordings.__init__(self, core)
        self.prefix = prefix
        self.ttl = ttl
        self.kind = core.kind
        self.stats = core.stats
        self._r: Any = core.client

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

    async def ping(self) -> bool:
        """True when Redis answers; False (not an exception) when it does not."""
        try:
            await self._core.topology.prepare()
            return bool(await self._r.execute_command("PING"))
        except ERRORS:
            return False

    async def refusal(self) -> str | None:
        """What to change when Redis refuses this node for good (``gateway.store.
        redis_refusal``); None when it answers, or is only down or busy."""
        for attempt in range(4):
            try:
                await self._core.topology.prepare()
                await self._r.execute_command("PING")
                return None
            except ERRORS as exc:
                hung_up = closed_at_once(exc)
                address = self._core.topology.address()
                if address is not None and connection_lost(exc):
                    # redis-py's words do not tell a banner-and-close from a reset: ask the port
                    said = await spoken_first(*address)
                    if isinstance(said, bytes):
                        return unasked_words(said, self._core.where)
                    if said is Unasked.RESET:
                        return None  # a proxy whose Redis is down: waited for
                    hung_up = hung_up or said is Unasked.CLOSED  # silence: redis-py's words stand
                if attempt < 3 and hung_up:  # or a Redis stopping right now
                    await asyncio.sleep(0.5)
                    continue
                if hung_up:
                    return not_redis(self._core.where, str(exc).rstrip("."))
                return refusal(exc, self._core.where)
            except Exception:  # nothing known to be final: start, and wait for it
                return None
        return None

    def degraded(self) -> str | None:
        return self._commit.replicas.holding()

    def unconfirmed(self) -> list[str]:
        return self._commit.replicas.unconfirmed()

    async def close(self) -> None:
        """Let the in-flight and queued appends finish, then close every connection."""
        if self._rounds is not None:
            await self._rounds.close()
        await self._commit.close()
        await self._core.topology.close()
