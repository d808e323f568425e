"""The in-process store: each concern's memory implementation, and ``MemoryStore``.

Same semantics as the Redis implementations (the shared test suite holds both
to them), kept in dicts: every method runs without an ``await`` between its
check and its write, so on one event loop each call is as atomic as the Redis
scripts are.

One class per concern of ``gateway.store.base``, each usable alone, as the
Redis ones are: ``MemorySessions`` (``gateway.store.memory_sessions``: records,
logs, leases), ``MemoryCounters`` (``gateway.store.memory_counters``: limits,
slots, byte quotas), and here ``MemoryBus``, ``MemorySecrets`` and
``MemoryRecordings``; ``MemoryStore`` is all of them on one clock, the
embedded default (and names every class, where importers look for them).

Time comes from an injectable monotonic ``clock`` so lease expiry and the idle
TTL can be tested without sleeping. Expired sessions and leases disappear lazily
(when touched) plus in an occasional sweep on writes, so a process that serves
many short sessions does not keep them all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from gateway.store.base import (
    NOT_STORED,
    RECORDING,
    RECORDING_CUT,
    RecordingChunk,
    whole_lines,
)
from gateway.store.memory_counters import MemoryCounters
from gateway.store.memory_sessions import MAX_BYTES, MemorySessions

__all__ = [
    "MemoryBus",
    "MemoryCounters",
    "MemoryRecordings",
    "MemorySecrets",
    "MemorySessions",
    "MemoryStore",
]


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
            before = len(recording)
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
            self._of._grew(sid, session, len(recording) - before)
        return sizes

    async def read_recording(self, sid: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        session = self._of._session(sid, self._of._clock())
        if session is None or session.meta is None:
            return b"", 0
        recording = session.recording
        return whole_lines(bytes(recording[offset : offset + max_bytes])), len(recording)


class MemoryStore(MemorySessions, MemoryCounters, MemoryBus, MemorySecrets):
    """The in-process store: one process, nothing to install, nothing survives a restart.

    Every concern on one ``clock`` (see ``MemorySessions`` for ``ttl``, ``max_log`` and
    ``max_bytes``).
    """

    kind = "memory"

    def __init__(
        self,
        *,
        ttl: float = 86400.0,
        max_log: int = 10_000,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        MemorySessions.__init__(self, ttl=ttl, max_log=max_log, max_bytes=max_bytes, clock=clock)
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
