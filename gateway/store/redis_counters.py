"""``RedisCounters``: counters, slots and byte quotas shared by nodes (``Counters``).

Each is one Lua script (``gateway.store.redis_scripts``) on keys of one slot,
so a check and its write are atomic on one Redis and on a Cluster alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.redis_core import RedisCore, ms
from gateway.store.redis_scripts import (
    HOLD_BYTES,
    INCR_WINDOW,
    RELEASE_BYTES,
    SLOT_ACQUIRE,
    SLOT_RENEW,
)

__all__ = ["RedisCounters"]


class RedisCounters:
    """Per-key limits' counters in Redis (``gateway.sessions.limits``)."""

    def __init__(self, core: RedisCore) -> None:
        self._core = core

    async def incr_window(self, key: str, amount: int, ttl: float) -> int:
        core = self._core
        window = [f"{core.prefix}:limit:{key}"]
        # Not sent again after a lost connection: it may have counted once already.
        return int(
            await core.eval(INCR_WINDOW, window, amount, ms(ttl, "counter ttl"), again=False)
        )

    async def acquire_slot(self, key: str, member: str, limit: int, ttl: float) -> bool:
        keys = [f"{self._core.prefix}:slots:{key}"]
        return bool(await self._core.eval(SLOT_ACQUIRE, keys, member, limit, ms(ttl, "slot ttl")))

    async def renew_slots(self, key: str, members: Sequence[str], ttl: float) -> None:
        if members:
            keys = [f"{self._core.prefix}:slots:{key}"]
            await self._core.eval(SLOT_RENEW, keys, ms(ttl, "slot ttl"), *members)

    async def release_slot(self, key: str, member: str) -> None:
        await self._core.run("releasing a slot", "ZREM", f"{self._core.prefix}:slots:{key}", member)

    def _quota_keys(self, key: str) -> list[str]:
        # One hash tag: the three keys of a quota are one slot on a Cluster.
        return [f"{self._core.prefix}:quota:{{{key}}}:{part}" for part in ("at", "size", "total")]

    async def hold_bytes(
        self, key: str, member: str, size: int, limit: int, ttl: float
    ) -> tuple[bool, int]:
        if size < 0:
            raise ValueError(f"a quota holds sizes >= 0, got {size!r}")
        quota_ms = ms(ttl, "quota ttl")
        keys = self._quota_keys(key)
        held, total = await self._core.eval(HOLD_BYTES, keys, member, size, limit, quota_ms)
        return bool(held), int(total)

    async def release_bytes(self, key: str, member: str) -> None:
        await self._core.eval(RELEASE_BYTES, self._quota_keys(key), member)
