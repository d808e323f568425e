"""Per-key limits: connections at the handshake, turns per minute, tokens and dollars per day.

Counters that must hold across nodes live in the store (``Store.incr_window``,
``Store.acquire_slot``): a fixed window per minute / per UTC day for rates and
quotas, and a set of heartbeated connection slots for concurrency, whose
entries expire when the node holding them stops renewing (dies), so a crashed
node never leaks a key's capacity. With the memory store the same code counts
in-process. Every limit is off at 0 and then costs nothing: no store call.

The refusals say what to do: HTTP 429 at the handshake (close another
connection), an ``error`` event ``rate_limited`` with the seconds until the
next window, or ``quota_exceeded`` with the time the day rolls over.

A store outage does not stop turns: the limiter fails open (logs, counts
``rtgw_store_errors``) because a gateway whose store is down cannot log a turn's
events anyway, and refusing paying users for an outage is worse than a
briefly unenforced limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.store.base import Counters, SessionMeta, StoreError
from protocol.events import Error, Usage

__all__ = ["SLOT_TTL", "ConnectionSlots", "Limits"]

log = logging.getLogger("gateway.sessions.limits")

SLOT_TTL: Final = 30.0
"""Seconds a per-key connection slot lives unless renewed: how long a dead node's
connections keep counting against their keys."""

_MINUTE: Final = 60
_DAY: Final = 86_400
_OWNERS_KEPT: Final = 65_536


class LimitStore(SessionMeta, Counters, Protocol):
    """What the limits use: a session's owner (its meta) and the shared counters."""


class Limits:
    """Turns per minute and tokens per day per API key (the session's owner).

    ``clock`` is wall time (windows are minutes and UTC days); tests replace it.
    """

    def __init__(
        self,
        config: Config,
        store: LimitStore,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.turns_per_minute = config.turns_per_minute
        self.tokens_per_day = config.tokens_per_day
        # Counted in micro-dollars: store counters are integers.
        self.micro_usd_per_day = round(config.usd_per_day * 1e6)
        self.store = store
        self.metrics = metrics
        self.clock = clock
        # sid → owner: filled at the handshake; a miss reads the session meta.
        self._owners: OrderedDict[str, str] = OrderedDict()
        # Usage writes in flight, per session: the next turn waits for them so a
        # quota is checked against every token already reported.
        self._pending: dict[str, set[asyncio.Task[None]]] = {}
        self._warned_at = 0.0

    @property
    def active(self) -> bool:
        return self.turns_per_minute > 0 or self.tokens_per_day > 0 or self.micro_usd_per_day > 0

    # ----------------------------------------------------------------- owners

    def bind(self, sid: str, owner: str) -> None:
        """Remember who owns ``sid`` (the handshake established it)."""
        if not self.active:
            return
        self._owners[sid] = owner
        self._owners.move_to_end(sid)
        while len(self._owners) > _OWNERS_KEPT:
            self._owners.popitem(last=False)

    async def owner_of(self, sid: str) -> str:
        owner = self._owners.get(sid)
        if owner is None:
            meta = await self.store.get_meta(sid)
            owner = (meta or {}).get("owner", "")
            if owner:
                self.bind(sid, owner)
        return owner

    # ----------------------------------------------------------------- turns

    async def admit_turn(self, sid: str, source: object = None) -> Error | None:
        """None if a new turn of ``sid`` may start, else the error to reply with.

        ``source`` is what the connection follows; while its runtime's turn
        refuses a message (``TurnMachine.takes_message``: ``turn_active``) it is not
        counted. Whether the runtime's driver runs says nothing: a listening voice
        session's runs between turns too, and its typed turns went uncounted.
        """
        machine = getattr(source, "machine", None)
        if not self.active or (machine is not None and not machine.takes_message):
            return None
        pending = self._pending.get(sid)
        if pending:
            await asyncio.wait(set(pending))
        try:
            owner = await self.owner_of(sid)
            if not owner:
                return None
            now = self.clock()
            if self.tokens_per_day > 0:
                day = int(now // _DAY)
                used = await self.store.incr_window(f"tokens:{owner}:{day}", 0, 2 * _DAY)
                if used >= self.tokens_per_day:
                    return self._refuse(
                        "quota_exceeded",
                        f"this API key used {used} of its {self.tokens_per_day} tokens for "
                        f"today; new turns are refused until 00:00 UTC, in "
                        f"{_until(now, (day + 1) * _DAY)} s — ask the operator for a "
                        "larger quota",
                    )
            if self.micro_usd_per_day > 0:
                day = int(now // _DAY)
                spent = await self.store.incr_window(f"usd:{owner}:{day}", 0, 2 * _DAY)
                if spent >= self.micro_usd_per_day:
                    return self._refuse(
                        "quota_exceeded",
                        f"this API key spent ${spent / 1e6:.4f} of its ${self.micro_usd_per_day / 1e6:.2f} "
                        f"budget for today; new turns are refused until 00:00 UTC, in "
                        f"{_until(now, (day + 1) * _DAY)} s — ask the operator for a larger budget",
                    )
            if self.turns_per_minute > 0:
                minute = int(now // _MINUTE)
                count = await self.store.incr_window(f"turns:{owner}:{minute}", 1, 2 * _MINUTE)
                if count > self.turns_per_minute:
                    wait = _until(now, (minute + 1) * _MINUTE)
                    return self._refuse(
                        "rate_limited",
                        f"this API key may start {self.turns_per_minute} turns per minute; "
                        f"retry after {wait} s",
                    )
        except StoreError as exc:
            self._store_failed(exc)
        return None

    async def standing(self, sid: str) -> list[tuple[str, int, int, float]]:
        """Where ``sid``'s key stands: ``(name, limit, remaining, seconds to reset)`` of
        its turns this minute (``requests``) and tokens today (``tokens``); [] when
        neither limit is set (what the OpenAI door's ``rate_limits.updated`` shows)."""
        if self.turns_per_minute <= 0 and self.tokens_per_day <= 0:
            return []
        out: list[tuple[str, int, int, float]] = []
        try:
            owner = await self.owner_of(sid)
            if not owner:
                return []
            now = self.clock()
            if self.turns_per_minute > 0:
                minute = int(now // _MINUTE)
                count = await self.store.incr_window(f"turns:{owner}:{minute}", 0, 2 * _MINUTE)
                limit = self.turns_per_minute
                out.append(("requests", limit, max(0, limit - count), (minute + 1) * _MINUTE - now))
            if self.tokens_per_day > 0:
                day = int(now // _DAY)
                used = await self.store.incr_window(f"tokens:{owner}:{day}", 0, 2 * _DAY)
                limit = self.tokens_per_day
                out.append(("tokens", limit, max(0, limit - used), (day + 1) * _DAY - now))
        except StoreError as exc:
            self._store_failed(exc)
            return []
        return out

    def _refuse(self, code: str, content: str) -> Error:
        self.metrics.turns_refused.labels(code).inc()
        return Error(code=code, content=content)

    def _store_failed(self, exc: StoreError) -> None:
        """Fail open: count it, and log at most every 10 s (an outage is one story)."""
        self.metrics.store_errors.inc()
        now = time.monotonic()
        if now - self._warned_at >= 10.0:
            self._warned_at = now
            log.warning("limits not enforced while the store is unavailable: %s", exc)

    # ----------------------------------------------------------------- tokens

    def record_usage(self, sid: str, usage: Usage, cost: float = 0.0) -> None:
        """Charge a model step's tokens and dollars to the session's owner (from the turn loop)."""
        tokens = usage.input + usage.output if self.tokens_per_day > 0 else 0
        micro_usd = round(cost * 1e6) if self.micro_usd_per_day > 0 else 0
        if tokens <= 0 and micro_usd <= 0:
            return
        task = asyncio.create_task(self._charge(sid, tokens, micro_usd), name=f"usage:{sid}")
        pending = self._pending.setdefault(sid, set())
        pending.add(task)

        def done(t: asyncio.Task[None]) -> None:
            pending.discard(t)
            if not pending and self._pending.get(sid) is pending:
                del self._pending[sid]

        task.add_done_callback(done)

    async def _charge(self, sid: str, tokens: int, micro_usd: int) -> None:
        try:
            owner = await self.owner_of(sid)
            if owner:
                day = int(self.clock() // _DAY)
                if tokens > 0:
                    await self.store.incr_window(f"tokens:{owner}:{day}", tokens, 2 * _DAY)
                if micro_usd > 0:
                    await self.store.incr_window(f"usd:{owner}:{day}", micro_usd, 2 * _DAY)
        except StoreError as exc:
            self._store_failed(exc)

    async def close(self) -> None:
        """Let the usage writes in flight finish (they are single store calls)."""
        tasks = {t for pending in self._pending.values() for t in pending}
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)


def _until(now: float, boundary: float) -> int:
    return max(1, math.ceil(boundary - now))


class ConnectionSlots:
    """Per-key concurrent connections across nodes, as heartbeated store slots.

    Each admitted connection holds the slot ``NODE:N`` in its key's set; one
    task per node renews all of them every ``SLOT_TTL / 3`` s. A node that dies
    stops renewing and its slots expire within ``SLOT_TTL``.
    """

    def __init__(self, store: Counters, node_id: str, limit: int, *, ttl: float = SLOT_TTL) -> None:
        self.store = store
        self.node_id = node_id
        self.limit = limit
        self.ttl = ttl
        self._numbers = itertools.count(1)
        self._held: dict[str, set[str]] = {}  # key → members this node holds
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self.limit > 0

    async def acquire(self, key: str) -> str | None:
        """A slot of ``key`` (its member id), or None when the key is at its limit.

        Raises ``StoreError`` when the store cannot be asked.
        """
        member = f"{self.node_id}:{next(self._numbers)}"
        if not await self.store.acquire_slot(key, member, self.limit, self.ttl):
            return None
        self._held.setdefault(key, set()).add(member)
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._renew_forever(), name="slot-heartbeat")
        return member

    async def release(self, key: str, member: str) -> None:
        held = self._held.get(key)
        if held is not None:
            held.discard(member)
            if not held:
                del self._held[key]
        with contextlib.suppress(StoreError):  # it expires by itself otherwise
            await self.store.release_slot(key, member)

    async def _renew_forever(self) -> None:
        while self._held:
            await asyncio.sleep(self.ttl / 3)
            for key, members in list(self._held.items()):
                try:
                    await self.store.renew_slots(key, sorted(members), self.ttl)
                except StoreError as exc:
                    # A short outage is covered by the TTL; a long one frees the
                    # slots, which errs towards letting clients in.
                    log.warning("could not renew connection slots of %s: %s", key, exc)

    async def close(self) -> None:
        task, self._heartbeat = self._heartbeat, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
