"""The session store: pick one with ``open_store(url)``.

No URL (or ``memory://``) gives the in-process ``MemoryStore``, so a single
gateway runs with nothing to install; a ``redis://``, ``rediss://`` or
``unix://`` URL gives ``RedisStore``, which many nodes share.
"""

from __future__ import annotations

from gateway.store.base import (
    LeaseLost,
    LogEntry,
    SeqConflict,
    Store,
    StoreError,
    StoreUnavailable,
)
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore, StoreStats

__all__ = [
    "LeaseLost",
    "LogEntry",
    "MemoryStore",
    "RedisStore",
    "SeqConflict",
    "Store",
    "StoreError",
    "StoreStats",
    "StoreUnavailable",
    "open_store",
]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def open_store(
    url: str | None,
    *,
    prefix: str = "rtgw",
    ttl: float = 86400.0,
    max_log: int = 10_000,
) -> Store:
    """The store for ``url``; does not connect (Redis may still be starting).

    ``ttl`` is the idle time (s) after which a session expires, ``max_log`` how
    many log entries a session keeps at least, ``prefix`` the Redis key prefix.
    """
    if not url or url == "memory://":
        return MemoryStore(ttl=ttl, max_log=max_log)
    if url.startswith(_REDIS_SCHEMES):
        return RedisStore.from_url(url, prefix=prefix, ttl=ttl, max_log=max_log)
    raise ValueError(
        f"unsupported store URL {url!r}: use memory:// (or nothing) for the in-process "
        "store, or redis://HOST:PORT/DB, rediss://… or unix:///path/redis.sock for Redis"
    )
