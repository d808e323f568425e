"""The in-process counters: per-key limit windows, connection slots, byte quotas (``Counters``).

``MemoryCounters`` keeps what ``gateway.store.redis_counters`` keeps in Redis,
with the same semantics, on an injectable monotonic ``clock``; expired
counters and slots are swept at most once a minute. ``MemoryStore``
(``gateway.store.memory``) puts it together with the other concerns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

__all__ = ["MemoryCounters"]


class MemoryCounters:
    """Counters, slots and byte quotas in one process (``Counters``)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Limit counters and slots (gateway.sessions.limits): key → [value, deadline] and
        # key → {member: deadline}; expired ones are dropped by _sweep_limits.
        self._counters: dict[str, list[float]] = {}
        self._slots: dict[str, dict[str, float]] = {}
        # Byte quotas: key → {member: (size, deadline)}.
        self._bytes: dict[str, dict[str, tuple[int, float]]] = {}
        self._next_limit_sweep = clock() + 60.0

    def _sweep_limits(self, now: float) -> None:
        """Drop expired counters and slots, at most once a minute of clock time.

        Counters are keyed by window (one per key per minute), so without a
        sweep a long-running process would keep every window it ever counted.
        """
        if now < self._next_limit_sweep:
            return
        self._next_limit_sweep = now + 60.0
        for key in [k for k, v in self._counters.items() if now >= v[1]]:
            del self._counters[key]
        for key, members in list(self._slots.items()):
            for member in [m for m, deadline in members.items() if now >= deadline]:
                del members[member]
            if not members:
                del self._slots[key]
        for key in list(self._bytes):
            if not self._live_bytes(key, now):
                del self._bytes[key]

    async def incr_window(self, key: str, amount: int, ttl: float) -> int:
        if ttl <= 0:
            raise ValueError(f"counter ttl must be > 0 seconds, got {ttl!r}")
        now = self._clock()
        self._sweep_limits(now)
        counter = self._counters.get(key)
        if counter is None or now >= counter[1]:
            counter = self._counters[key] = [0, now + ttl]
        counter[0] += amount
        return int(counter[0])

    async def acquire_slot(self, key: str, member: str, limit: int, ttl: float) -> bool:
        if ttl <= 0:
            raise ValueError(f"slot ttl must be > 0 seconds, got {ttl!r}")
        now = self._clock()
        self._sweep_limits(now)
        members = self._slots.setdefault(key, {})
        for expired in [m for m, deadline in members.items() if now >= deadline]:
            del members[expired]
        if member not in members and limit > 0 and len(members) >= limit:
            return False
        members[member] = now + ttl
        return True

    async def renew_slots(self, key: str, members: Sequence[str], ttl: float) -> None:
        now = self._clock()
        held = self._slots.get(key)
        if held is None:
            return
        for member in members:
            deadline = held.get(member)
            if deadline is not None and now < deadline:
                held[member] = now + ttl

    async def release_slot(self, key: str, member: str) -> None:
        held = self._slots.get(key)
        if held is not None:
            held.pop(member, None)
            if not held:
                del self._slots[key]

    def _live_bytes(self, key: str, now: float) -> dict[str, tuple[int, float]]:
        """``key``'s members still within their deadline: member → (size, deadline)."""
        held = self._bytes.setdefault(key, {})
        for expired in [m for m, (_, deadline) in held.items() if now >= deadline]:
            del held[expired]
        return held

    async def hold_bytes(
        self, key: str, member: str, size: int, limit: int, ttl: float
    ) -> tuple[bool, int]:
        if ttl <= 0:
            raise ValueError(f"quota ttl must be > 0 seconds, got {ttl!r}")
        if size < 0:
            raise ValueError(f"a quota holds sizes >= 0, got {size!r}")
        now = self._clock()
        self._sweep_limits(now)
        held = self._live_bytes(key, now)
        total = sum(s for s, _ in held.values())
        total_then = total - held.get(member, (0, 0.0))[0] + size
        if limit > 0 and total_then > limit:
            if not held:
                del self._bytes[key]
            return False, total
        held[member] = (size, now + ttl)
        return True, total_then

    async def release_bytes(self, key: str, member: str) -> None:
        held = self._bytes.get(key)
        if held is not None:
            held.pop(member, None)
            if not held:
                del self._bytes[key]
