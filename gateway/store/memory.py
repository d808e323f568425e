"""The in-process store: each concern's memory implementation, and ``MemoryStore``.

Same semantics as the Redis implementations (the shared test suite holds both
to them), kept in dicts: every method runs without an ``await`` between its
check and its write, so on one event loop each call is as atomic as the Redis
scripts are.

One class per concern of ``gateway.store.base`` (``MemorySessions``,
``MemoryCounters``, ``MemoryBus``, ``MemorySecrets``), each usable alone;
``MemoryStore`` is all four on one clock, the embedded default.

Time comes from an injectable monotonic ``clock`` so lease expiry and the idle
TTL can be tested without sleeping. Expired sessions and leases disappear lazily
(when touched) plus in an occasional sweep on writes, so a process that serves
many short sessions does not keep them all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence

from gateway.store.base import (
    NOT_STORED,
    RECORDING,
    RECORDING_CUT,
    AppendBatch,
    LeaseLost,
    LogEntry,
    RecordingChunk,
    SeqConflict,
    StoreError,
    whole_lines,
)

__all__ = [
    "MemoryBus",
    "MemoryCounters",
    "MemoryRecordings",
    "MemorySecrets",
    "MemorySessions",
    "MemoryStore",
]

WAIT_LIMIT = 1000
"""The most entries one ``wait_log`` call returns (a follower simply calls again)."""


class _Session:
    """Everything stored for one session; the Redis keys' common idle deadline."""

    __slots__ = ("deadline", "history", "log", "meta", "recording")

    def __init__(self, deadline: float) -> None:
        self.meta: dict[str, str] | None = None
        # Its recording (``MemoryRecordings``): it goes with the session, deleted or expired.
        self.recording = bytearray()
        # Seqs in the log are contiguous (appends are fenced), so the position of
        # seq N is N - log[0].seq: reads slice, they never search.
        self.log: list[LogEntry] = []
        self.history: list[bytes] = []
        self.deadline = deadline


class MemorySessions:
    """The session log in one process: meta, events, history, leases (``Sessions``).

    ``ttl`` is the idle time (s) after which a session disappears; every append or
    meta write restarts it. ``max_log`` is how many log entries are kept at least
    (like Redis ``MAXLEN ~``, a few more may be kept until the next trim).
    """

    def __init__(
        self,
        *,
        ttl: float = 86400.0,
        max_log: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
        if max_log < 1:
            raise ValueError(f"max_log must be >= 1, got {max_log!r}")
        self.ttl = ttl
        self.max_log = max_log
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
            del self._sessions[sid]
            return None
        return session

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
            del self._sessions[sid]
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
        session.meta.update(fields)
        session.deadline = now + self.ttl

    async def delete_session(self, sid: str) -> bool:
        now = self._clock()
        session = self._session(sid, now)
        existed = self._sessions.pop(sid, None) is not None and session is not None
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
        if entries:
            log = session.log
            log.extend(entries)
            if len(log) > self._trim_at:
                del log[: len(log) - self.max_log]
        if history:
            session.history.extend(history)
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


class MemoryBus:
    """Control messages between the tasks of one process (``Bus``)."""

    def __init__(self) -> None:
        self._listeners: dict[str, list[Callable[[bytes], None]]] = {}

    async def publish(self, channel: str, data: bytes) -> int:
        loop = asyncio.get_running_loop()
        handlers = tuple(self._listeners.get(channel, ()))
        for handler in handlers:
            loop.call_soon(handler, data)
        return len(handlers)

    async def listen(self, channel: str, handler: Callable[[bytes], None]) -> None:
        handlers = self._listeners.setdefault(channel, [])
        handlers.append(handler)
        try:
            await asyncio.Future()  # until cancelled
        finally:
            handlers.remove(handler)
            if not handlers:
                del self._listeners[channel]


class MemorySecrets:
    """The shared secret and the API keys of one process (``Secrets``)."""

    def __init__(self) -> None:
        self._secrets: dict[str, bytes] = {}
        self._api_keys: dict[str, str] = {}

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        return self._secrets.setdefault(name, candidate)

    async def api_key(self, digest: str) -> str | None:
        return self._api_keys.get(digest)

    async def api_keys(self, digests: Sequence[str]) -> dict[str, str]:
        keys = self._api_keys
        return {d: keys[d] for d in digests if d in keys}

    async def all_api_keys(self) -> dict[str, str]:
        return dict(self._api_keys)

    async def put_api_key(self, digest: str, value: str) -> None:
        self._api_keys[digest] = value

    async def remove_api_keys(self, digests: Sequence[str]) -> int:
        return sum(self._api_keys.pop(d, None) is not None for d in set(digests))


class MemoryRecordings:
    """Sessions' recordings in one process (``Recordings``), kept with each session of
    ``sessions``: a recording expires and is deleted with its session."""

    def __init__(self, sessions: MemorySessions) -> None:
        self._of = sessions

    async def append_recordings(self, chunks: Sequence[RecordingChunk], limit: int) -> list[int]:
        now = self._of._clock()
        sizes: list[int] = []
        for sid, lines, cut in chunks:
            session = self._of._session(sid, now)
            if session is None or session.meta is None:
                sizes.append(NOT_STORED)
                continue
            recording = session.recording
            if session.meta.get(RECORDING) == "cut":
                sizes.append(RECORDING_CUT)
            elif len(recording) + len(lines) > limit:
                # The whole lines that fit before the limit, then the cut line.
                room = limit - len(recording) - len(cut)
                if room > 0:
                    recording += lines[: lines.rfind(b"\n", 0, room) + 1]
                recording += cut
                session.meta[RECORDING] = "cut"
                sizes.append(RECORDING_CUT)
            else:
                if lines and not recording:
                    session.meta[RECORDING] = "on"
                recording += lines
                sizes.append(len(recording))
        return sizes

    async def read_recording(self, sid: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        session = self._of._session(sid, self._of._clock())
        if session is None or session.meta is None:
            return b"", 0
        recording = session.recording
        return whole_lines(bytes(recording[offset : offset + max_bytes])), len(recording)


class MemoryStore(MemorySessions, MemoryCounters, MemoryBus, MemorySecrets):
    """The in-process store: one process, nothing to install, nothing survives a restart.

    Every concern on one ``clock`` (see ``MemorySessions`` for ``ttl`` and ``max_log``).
    """

    kind = "memory"

    def __init__(
        self,
        *,
        ttl: float = 86400.0,
        max_log: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        MemorySessions.__init__(self, ttl=ttl, max_log=max_log, clock=clock)
        MemoryCounters.__init__(self, clock=clock)
        MemoryBus.__init__(self)
        MemorySecrets.__init__(self)
        self._recordings = MemoryRecordings(self)

    async def append_recordings(self, chunks: Sequence[RecordingChunk], limit: int) -> list[int]:
        return await self._recordings.append_recordings(chunks, limit)

    async def read_recording(self, sid: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        return await self._recordings.read_recording(sid, offset, max_bytes)

    async def ping(self) -> bool:
        return True

    async def refusal(self) -> str | None:
        return None

    def degraded(self) -> str | None:
        return None

    def unconfirmed(self) -> list[str]:
        return []

    async def close(self) -> None:
        self.wake_followers()
