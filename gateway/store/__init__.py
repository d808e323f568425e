"""The session store: pick one with ``open_store(url)``.

No URL (or ``memory://``) gives the in-process ``MemoryStore``, so a single
gateway runs with nothing to install; a ``redis://``, ``rediss://`` or
``unix://`` URL gives ``RedisStore`` on one server, which many nodes share;
``redis+sentinel://H:P[,H:P…]/MASTER`` follows a Sentinel-managed primary
across failovers; ``redis+cluster://H:P[,H:P…]`` spreads sessions over a
Redis Cluster (``rediss+…`` for TLS).
"""

from __future__ import annotations

from gateway.store.base import (
    Bus,
    Counters,
    Durability,
    EventLog,
    Health,
    LeaseLost,
    Leases,
    LogEntry,
    Secrets,
    SeqConflict,
    SessionMeta,
    Sessions,
    Store,
    StoreError,
    StoreUnavailable,
    Unreplicated,
)
from gateway.store.memory import MemoryStore
from gateway.store.memory_sessions import MAX_BYTES
from gateway.store.redis import REDIS_SCHEMES, RedisStore, StoreStats
from gateway.store.redis_connect import open_redis_client

__all__ = [
    "Bus",
    "Counters",
    "Durability",
    "EventLog",
    "Health",
    "LeaseLost",
    "Leases",
    "LogEntry",
    "MemoryStore",
    "RedisStore",
    "Secrets",
    "SeqConflict",
    "SessionMeta",
    "Sessions",
    "Store",
    "StoreError",
    "StoreStats",
    "StoreUnavailable",
    "Unreplicated",
    "open_redis_client",
    "open_store",
]


def open_store(
    url: str | None,
    *,
    prefix: str = "rtgw",
    ttl: float = 86400.0,
    max_log: int = 10_000,
    memory_bytes: int = MAX_BYTES,
    durability: Durability = "local",
    replica_timeout: float = 1.0,
    retry_window: float = 2.0,
) -> Store:
    """The store for ``url``; does not connect (Redis may still be starting).

    ``ttl`` is the idle time (s) after which a session expires, ``max_log`` how
    many log entries a session keeps at least, ``prefix`` the Redis key prefix,
    ``memory_bytes`` what the in-process store keeps of all sessions at most.
    The rest are ``RedisStore``'s (ignored by the memory store):
    ``durability`` "replicated" reports an append stored only once a replica
    has it (waiting up to ``replica_timeout`` s), "replicated-or-local" too
    while a replica confirms, else once the primary has it; ``retry_window`` is
    how long commands are sent again through a Cluster redirect or a failover.
    """
    if not url or url == "memory://":
        return MemoryStore(ttl=ttl, max_log=max_log, max_bytes=memory_bytes)
    if url.startswith(REDIS_SCHEMES):
        return RedisStore.from_url(
            url,
            prefix=prefix,
            ttl=ttl,
            max_log=max_log,
            durability=durability,
            replica_timeout=replica_timeout,
            retry_window=retry_window,
        )
    raise ValueError(
        f"unsupported store URL {url!r}: use memory:// (or nothing) for the in-process "
        "store, or redis://HOST:PORT/DB, rediss://… or unix:///path/redis.sock for Redis, "
        "redis+sentinel://HOST:PORT[,…]/MASTER_NAME for Sentinel, "
        "redis+cluster://HOST:PORT[,…] for a Redis Cluster"
    )
