"""The in-process sessions: records, event logs and leases (``Sessions``), in dicts.

``MemorySessions`` keeps what ``gateway.store.redis_sessions`` keeps in Redis,
with the same semantics (the shared test suite holds both to them): every
method runs without an ``await`` between its check and its write, so on one
event loop each call is as atomic as the Redis scripts are. Time comes from an
injectable monotonic ``clock``; expired sessions and leases disappear lazily
(when touched) plus in an occasional sweep on writes. ``MemoryStore``
(``gateway.store.memory``) puts it together with the other concerns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from gateway.store.base import (
    AppendBatch,
    LeaseLost,
    LogEntry,
    SeqConflict,
    StoreError,
)

__all__ = ["MAX_BYTES", "WAIT_LIMIT", "MemorySessions"]

log = logging.getLogger("gateway.store.memory")

WAIT_LIMIT = 1000
"""The most entries one ``wait_log`` call returns (a follower simply calls again)."""
MAX_BYTES = 512 * 1024 * 1024
"""What the store keeps by default (``memory_store_mb``): logs, history, recordings."""
ENTRY_BYTES = 128
"""What one log entry or history item costs beyond its data (its objects), as counted."""


def _meta_bytes(meta: Mapping[str, str]) -> int:
    return sum(len(k) + len(v) for k, v in meta.items())


class _Session:
    """Everything stored for one session; the Redis keys' common idle deadline."""

    __slots__ = ("deadline", "history", "log", "meta", "recording", "size", "trimmed")

    def __init__(self, deadline: float) -> None:
        self.size = 0  # bytes counted against the store's budget
        self.trimmed = False  # its oldest events went for room (warned once)
        self.meta: dict[str, str] | None = None
        # Its recording (``MemoryRecordings``): it goes with the session, deleted or expired.
        self.recording = bytearray()
        # Seqs in the log are contiguous (appends are fenced), so the position of
        # seq N is N - log[0].seq: reads slice, they never search.
        self.log: list[LogEntry] = []
        self.history: list[bytes] = []
        self.deadline = deadline

    def halve(self) -> int:
        """The older half of its log and history dropped (room in a full store): the
        bytes freed."""
        log_cut, history_cut = len(self.log) // 2, len(self.history) // 2
        freed = sum(len(e.data) for e in self.log[:log_cut])
        freed += sum(len(h) for h in self.history[:history_cut])
        freed += (log_cut + history_cut) * ENTRY_BYTES
        del self.log[:log_cut]
        del self.history[:history_cut]
        self.size -= freed
        return freed


class MemorySessions:
    """The session log in one process: meta, events, history, leases (``Sessions``).

    ``ttl`` is the idle time (s) after which a session disappears; every append or
    meta write restarts it. ``max_log`` is how many log entries are kept at least
    (like Redis ``MAXLEN ~``, a few more may be kept until the next trim).

    ``max_bytes`` bounds what all sessions keep together (Redis has ``maxmemory``;
    this store had nothing, and 200 messages of 1 MB grew a node by 740 MB). Past it,
    down to nine tenths of it: sessions no node drives go first, least recently
    written first (as if expired); then the largest sessions lose the older half of
    their log and history (as ``max_log`` trims), each with a warning.
    """

    def __init__(
        self,
        *,
        ttl: float = 86400.0,
        max_log: int = 10_000,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
        if max_log < 1:
            raise ValueError(f"max_log must be >= 1, got {max_log!r}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes!r}")
        self.ttl = ttl
        self.max_log = max_log
        self.max_bytes = max_bytes
        self.size = 0  # bytes counted, all sessions
        self._clock = clock
        # Trim in steps rather than on every append: amortised O(1) appends, and
        # the same "at least max_log" promise the Redis store makes.
        self._trim_at = max_log + max(1, max_log // 4)
        self._sessions: dict[str, _Session] = {}
        self._leases: dict[str, tuple[str, float]] = {}
        self._gone: dict[str, float] = {}  # deleted sessions → until when they stay fenced
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._closed = False
        self._sweep_every = min(ttl, 60.0)
        self._next_sweep = clock() + self._sweep_every

    # --- internals -----------------------------------------------------------

    def _session(self, sid: str, now: float) -> _Session | None:
        """The live session, dropping it if its idle TTL has passed."""
        session = self._sessions.get(sid)
        if session is not None and now >= session.deadline:
            self._drop(sid)
            return None
        return session

    def _drop(self, sid: str) -> bool:
        session = self._sessions.pop(sid, None)
        if session is None:
            return False
        self.size -= session.size
        return True

    def _grew(self, writing: str, session: _Session, added: int) -> None:
        """``added`` bytes more in ``session`` (negative: fewer). Over the budget: room
        down to nine tenths of it (see the class)."""
        session.size += added
        self.size += added
        if self.size <= self.max_bytes:
            return
        target = self.max_bytes * 9 // 10
        now = self._clock()
        self._next_sweep = now
        self._maybe_sweep(now)
        idle = sorted(
            (other.deadline, sid)
            for sid, other in self._sessions.items()
            if sid != writing and self._holder(sid, now) is None
        )
        gone = 0
        for _, sid in idle:
            if self.size <= target:
                break
            gone += self._drop(sid)
        if gone:
            log.warning(
                "the in-memory store is full (%d MiB, memory_store_mb): %d idle sessions "
                "were dropped, least recently written first; set REDIS_URL to keep more",
                self.max_bytes >> 20,
                gone,
            )
        while self.size > target:
            freed = 0
            for sid, largest in sorted(self._sessions.items(), key=lambda i: -i[1].size)[:8]:
                cut = largest.halve()
                self.size -= cut
                freed += cut
                if cut and not largest.trimmed:
                    largest.trimmed = True
                    log.warning(
                        "session %s: the in-memory store is full (%d MiB, memory_store_mb): "
                        "its oldest events and history were dropped; set REDIS_URL to keep more",
                        sid,
                        self.max_bytes >> 20,
                    )
            if not freed:
                return  # nothing left to shed but each session's newest entry

    def _holder(self, sid: str, now: float) -> str | None:
        lease = self._leases.get(sid)
        if lease is None:
            return None
        if now >= lease[1]:
            del self._leases[sid]
            return None
        return lease[0]

    def _maybe_sweep(self, now: float) -> None:
        """Drop everything expired, at most every ``min(ttl, 60)`` s of clock time.

        Lazy expiry alone would keep sessions that are never touched again.
        """
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_every
        for sid in [s for s, v in self._sessions.items() if now >= v.deadline]:
            self._drop(sid)
        for sid in [s for s, v in self._leases.items() if now >= v[1]]:
            del self._leases[sid]
        for sid in [s for s, deadline in self._gone.items() if now >= deadline]:
            del self._gone[sid]

    def _slice(
        self, session: _Session | None, after: int, limit: int, max_bytes: int | None = None
    ) -> list[LogEntry]:
        if session is None or not session.log or limit <= 0:
            return []
        log = session.log
        start = max(0, after + 1 - log[0].seq)
        if max_bytes is None:
            return log[start : start + limit]
        page: list[LogEntry] = []
        size = 0
        for entry in log[start : start + limit]:
            size += len(entry.data)
            if page and size > max_bytes:
                break
            page.append(entry)
        return page

    def _wake(self, sid: str) -> None:
        for waiter in self._waiters.pop(sid, ()):
            if not waiter.done():
                waiter.set_result(None)

    # --- meta ------------------------------------------------------------------

    async def create_session(
        self, sid: str, meta: Mapping[str, str], ttl: float | None = None
    ) -> bool:
        if not meta:
            raise ValueError("create_session needs at least one meta field")
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
        now = self._clock()
        self._maybe_sweep(now)
        session = self._session(sid, now)
        if session is not None and session.meta is not None:
            return False
        deadline = now + (self.ttl if ttl is None else ttl)
        if session is None:
            session = self._sessions[sid] = _Session(deadline)
        session.meta = dict(meta)
        session.deadline = deadline
        self._grew(sid, session, _meta_bytes(meta))
        return True

    async def get_meta(self, sid: str) -> dict[str, str] | None:
        session = self._session(sid, self._clock())
        if session is None or session.meta is None:
            return None
        return dict(session.meta)

    async def set_meta(self, sid: str, fields: Mapping[str, str]) -> None:
        """Update fields and restart the idle TTL; a no-op if the session is gone.

        Writing into an expired session would resurrect a partial one.
        """
        now = self._clock()
        session = self._session(sid, now)
        if session is None or session.meta is None:
            return
        before = _meta_bytes(session.meta)
        session.meta.update(fields)
        session.deadline = now + self.ttl
        self._grew(sid, session, _meta_bytes(session.meta) - before)

    async def delete_session(self, sid: str) -> bool:
        now = self._clock()
        session = self._session(sid, now)
        existed = self._drop(sid) and session is not None
        self._leases.pop(sid, None)
        self._gone[sid] = now + self.ttl
        if sid in self._waiters:
            self._wake(sid)  # followers see an empty log and look again
        return existed

    async def were_deleted(self, sids: Sequence[str]) -> list[bool]:
        now = self._clock()
        return [now < self._gone.get(sid, now) for sid in sids]

    # --- log + history -----------------------------------------------------

    async def append(
        self,
        sid: str,
        node: str,
        entries: Sequence[LogEntry],
        history: Sequence[bytes] = (),
    ) -> None:
        self._append_now(sid, node, entries, history)

    def submit_appends(
        self,
        batches: Sequence[AppendBatch],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> None:
        """Every append at once; ``on_done`` on the next loop pass (no task)."""
        asyncio.get_running_loop().call_soon(on_done, self._append_all(batches))

    def _append_all(self, batches: Sequence[AppendBatch]) -> list[BaseException | None]:
        """Each batch appended now: its error, or None, in order."""
        results: list[BaseException | None] = []
        for sid, node, entries, history in batches:
            try:
                self._append_now(sid, node, entries, history)
            except (StoreError, ValueError) as exc:
                results.append(exc)
            else:
                results.append(None)
        return results

    def _append_now(
        self,
        sid: str,
        node: str,
        entries: Sequence[LogEntry],
        history: Sequence[bytes],
    ) -> None:
        if entries:
            first = entries[0].seq
            for offset, entry in enumerate(entries):
                if entry.seq != first + offset:
                    raise ValueError(
                        f"append to {sid}: entries must have consecutive seqs, "
                        f"got {entry.seq} at position {offset} after {first}"
                    )
        now = self._clock()
        self._maybe_sweep(now)
        holder = self._holder(sid, now)
        if holder != node:
            raise LeaseLost(
                f"session {sid}: node {node!r} does not hold the lease "
                f"(held by {holder or 'nobody'}); stop driving this session",
                holder,
            )
        session = self._session(sid, now)
        if entries:
            last = session.log[-1].seq if session is not None and session.log else 0
            if entries[0].seq != last + 1:
                raise SeqConflict(
                    f"session {sid}: append starts at seq {entries[0].seq} but the log "
                    f"ends at {last}; another writer raced: reload last_seq before writing"
                )
        if session is None:
            session = self._sessions[sid] = _Session(now + self.ttl)
        session.deadline = now + self.ttl
        added = sum(len(h) for h in history) + (len(entries) + len(history)) * ENTRY_BYTES
        if entries:
            kept = session.log
            kept.extend(entries)
            added += sum(len(e.data) for e in entries)
            if len(kept) > self._trim_at:
                cut = len(kept) - self.max_log
                added -= sum(len(e.data) for e in kept[:cut]) + cut * ENTRY_BYTES
                del kept[:cut]
        if history:
            session.history.extend(history)
        self._grew(sid, session, added)
        if entries and sid in self._waiters:
            self._wake(sid)

    async def read_log(
        self, sid: str, after: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[LogEntry]:
        return self._slice(self._session(sid, self._clock()), after, limit, max_bytes)

    async def wait_log(
        self,
        sid: str,
        after: int,
        timeout: float,
        limit: int = WAIT_LIMIT,
    ) -> list[LogEntry]:
        """Entries after ``after`` (at most ``limit``), waiting up to ``timeout`` s.

        The timeout runs on the event loop's clock, not the injected one: it is
        how long the caller is willing to wait, not a stored expiry.
        """
        entries = self._slice(self._session(sid, self._clock()), after, limit)
        if entries or timeout <= 0 or self._closed:
            return entries
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(sid, []).append(waiter)
            try:
                async with asyncio.timeout(remaining):
                    await waiter
            except TimeoutError:
                return []
            finally:
                waiters = self._waiters.get(sid)
                if waiters is not None and waiter in waiters:
                    waiters.remove(waiter)
                    if not waiters:
                        del self._waiters[sid]
            # Woken by an append; it may still end before ``after`` (a follower
            # ahead of the log), then keep waiting like XREAD BLOCK does.
            entries = self._slice(self._session(sid, self._clock()), after, limit)
            if entries or self._closed:
                return entries

    async def first_seq(self, sid: str) -> int:
        session = self._session(sid, self._clock())
        return session.log[0].seq if session is not None and session.log else 0

    async def last_seq(self, sid: str) -> int:
        session = self._session(sid, self._clock())
        return session.log[-1].seq if session is not None and session.log else 0

    async def read_history(self, sid: str, start: int = 0, count: int = 0) -> list[bytes]:
        session = self._session(sid, self._clock())
        if session is None:
            return []
        return list(session.history[start : start + count if count > 0 else None])

    # --- lease ---------------------------------------------------------------

    async def acquire_lease(self, sid: str, node: str, ttl: float) -> bool:
        if ttl <= 0:
            raise ValueError(f"lease ttl must be > 0 seconds, got {ttl!r}")
        now = self._clock()
        self._maybe_sweep(now)
        gone = self._gone.get(sid)
        if gone is not None and now < gone:
            return False  # deleted: fenced (see delete_session)
        holder = self._holder(sid, now)
        if holder is not None and holder != node:
            return False
        self._leases[sid] = (node, now + ttl)
        return True

    async def renew_lease(self, sid: str, node: str, ttl: float) -> bool:
        if ttl <= 0:
            raise ValueError(f"lease ttl must be > 0 seconds, got {ttl!r}")
        now = self._clock()
        if self._holder(sid, now) != node:
            return False
        self._leases[sid] = (node, now + ttl)
        return True

    async def release_lease(self, sid: str, node: str) -> None:
        if self._holder(sid, self._clock()) == node:
            del self._leases[sid]

    async def lease_owner(self, sid: str) -> str | None:
        return self._holder(sid, self._clock())

    async def lease_expires_in(self, sid: str) -> float:
        now = self._clock()
        if self._holder(sid, now) is None:
            return 0.0
        return max(self._leases[sid][1] - now, 0.0)

    async def append_many(self, batches: Sequence[AppendBatch]) -> list[BaseException | None]:
        return self._append_all(batches)

    async def confirmed_seq(self, sid: str) -> int:
        """The last seq: one process has no replica to wait for."""
        return await self.last_seq(sid)

    async def keep_leases(self, sids: Sequence[str], node: str, ttl: float) -> list[bool]:
        return [await self.acquire_lease(sid, node, ttl) for sid in sids]

    def wake_followers(self) -> None:
        """Wake every follower (they see an empty result) so none outlives the store."""
        self._closed = True
        for sid in list(self._waiters):
            self._wake(sid)
