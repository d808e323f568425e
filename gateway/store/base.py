"""The session store interface: event log, history, meta, lease.

Two implementations share it: ``RedisStore`` (many nodes, survives restarts) and
``MemoryStore`` (the embedded default: one process, nothing to install). The
gateway is written against this interface only, and the same test suite runs
against both.

Data model (Redis keys share the hash tag ``{SID}`` so a cluster keeps a session
on one slot):

- ``rtgw:{SID}:meta``    hash: owner, provider, created, status, …
- ``rtgw:{SID}:log``     stream of every client event; entry id ``SEQ-0``
- ``rtgw:{SID}:history`` list of persisted semantic units (context assembly input)
- ``rtgw:{SID}:lease``   the node driving the session (``SET NX PX``, renewed)
- ``rtgw:{SID}:gone``    set by ``delete_session``: the session may not be leased again

Durability rule: **log, then send**. ``append`` returns only when the entries are
stored; only then are they sent to clients. ``append`` is fenced by the lease: a
node that lost its lease cannot write, so two nodes never both write a ``seq``.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

__all__ = [
    "LeaseLost",
    "LogEntry",
    "SeqConflict",
    "Store",
    "StoreError",
    "StoreUnavailable",
]


class LogEntry(NamedTuple):
    """One logged client event: its ``seq`` and the exact bytes sent to clients."""

    seq: int
    data: bytes


class StoreError(Exception):
    """Base of the store's errors."""


class StoreUnavailable(StoreError):
    """The backing store cannot be reached (Redis down or restarting). Retry later."""


class LeaseLost(StoreError):
    """This node no longer holds the session's lease: another node drives it now.

    ``holder`` is the node that holds it, or None when nobody does (it expired,
    e.g. during a store outage longer than the lease): then the writer may take
    it back and write again, the seq check fencing any writer in between.
    """

    def __init__(self, message: str, holder: str | None = None) -> None:
        super().__init__(message)
        self.holder = holder


class SeqConflict(StoreError):
    """An append's first ``seq`` does not follow the log's last one (a racing writer)."""


class Store(abc.ABC):
    """Where sessions live. Every method may raise ``StoreUnavailable``."""

    kind: str = "store"

    # --- meta --------------------------------------------------------------

    @abc.abstractmethod
    async def create_session(
        self, sid: str, meta: Mapping[str, str], ttl: float | None = None
    ) -> bool:
        """Create the session with ``meta``; False if it already exists.

        ``ttl`` (s) replaces the store's idle TTL until the session's next
        write (append or ``set_meta``), which restarts the normal one: a
        session made for a client that never comes (``POST /v1/sessions``)
        is kept a short while only.
        """

    @abc.abstractmethod
    async def get_meta(self, sid: str) -> dict[str, str] | None:
        """The session's meta, or None if it does not exist (or expired)."""

    @abc.abstractmethod
    async def set_meta(self, sid: str, fields: Mapping[str, str]) -> None:
        """Update some meta fields of an existing session."""

    @abc.abstractmethod
    async def delete_session(self, sid: str) -> bool:
        """Remove the session's meta, log, history and lease; False if it did not exist.

        The session is fenced for its idle TTL afterwards: no node can take its
        lease, so a driver that has not heard of the delete yet cannot write
        it back (its appends and lease renewals fail, ``LeaseLost``).
        """

    async def were_deleted(self, sids: Sequence[str]) -> list[bool]:
        """Whether each session was deleted and is still fenced (its ``gone`` mark).

        The tombstones a node's workspace sweep reads: a workspace written by a
        turn that raced its session's delete (its node missed the ``Deleted``
        message) is removed whatever its age. A store without fences: all False.
        """
        return [False] * len(sids)

    @abc.abstractmethod
    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        """The secret stored as ``name``, storing ``candidate`` if none is yet.

        How nodes sharing a store agree on a secret (the client tokens'
        signing key) with no setup: the first node's candidate wins.
        """

    # --- log + history -----------------------------------------------------

    @abc.abstractmethod
    async def append(
        self,
        sid: str,
        node: str,
        entries: Sequence[LogEntry],
        history: Sequence[bytes] = (),
    ) -> None:
        """Atomically append log entries and history items, fenced by ``node``'s lease.

        ``entries`` must be consecutive and start at the log's last ``seq`` + 1.
        Raises ``LeaseLost`` if ``node`` does not hold the lease, ``SeqConflict``
        if the seqs do not follow on. Refreshes the session's idle TTL.
        """

    async def append_many(
        self, batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]]
    ) -> list[BaseException | None]:
        """``append`` for several sessions: ``(sid, node, entries, history)`` each.

        Each batch succeeds or fails on its own; the result for each is None or
        the exception ``append`` would have raised. Stores override it to write
        all of them in one round trip.
        """
        results: list[BaseException | None] = []
        for sid, node, entries, history in batches:
            try:
                await self.append(sid, node, entries, history)
            except StoreError as exc:
                results.append(exc)
            else:
                results.append(None)
        return results

    def submit_appends(
        self,
        batches: Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> None:
        """``append_many``, answered by calling ``on_done(results)`` (on the event loop).

        The node's log writer runs one round per event at low load; a callback
        saves it a task wake-up per round and another for the store's answer.
        This default runs ``append_many`` in a task; stores that can answer
        without one override it (the memory store at once, Redis from the
        connection's ``data_received``). ``on_done`` is called exactly once,
        never from inside this call.
        """
        loop = asyncio.get_running_loop()
        task = loop.create_task(self.append_many(batches))
        _submitted.add(task)

        def done(task: asyncio.Task[list[BaseException | None]]) -> None:
            _submitted.discard(task)
            if task.cancelled():
                failed: BaseException = StoreUnavailable("append cancelled (closing); retry")
            elif (error := task.exception()) is not None:
                failed = error
            else:
                on_done(task.result())
                return
            on_done([failed] * len(batches))

        task.add_done_callback(done)

    @abc.abstractmethod
    async def read_log(
        self, sid: str, after: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[LogEntry]:
        """Up to ``limit`` entries with ``seq > after``, in order.

        With ``max_bytes``, no more entries than fit in that many bytes of
        ``data``, except that the first is returned whatever its size (a
        reader always moves on). The store decides what fits as it reads, so
        a page of large events is never materialised whole, here or in Redis.
        """

    @abc.abstractmethod
    async def wait_log(self, sid: str, after: int, timeout: float) -> list[LogEntry]:
        """Entries with ``seq > after``, waiting up to ``timeout`` s for the first one.

        How a node that does not drive the session follows it live.
        """

    @abc.abstractmethod
    async def first_seq(self, sid: str) -> int:
        """The oldest ``seq`` still in the (trimmed) log; 0 if the log is empty."""

    @abc.abstractmethod
    async def last_seq(self, sid: str) -> int:
        """The newest ``seq`` in the log; 0 if the log is empty."""

    @abc.abstractmethod
    async def read_history(self, sid: str) -> list[bytes]:
        """Every history item, oldest first."""

    # --- lease ---------------------------------------------------------------

    @abc.abstractmethod
    async def acquire_lease(self, sid: str, node: str, ttl: float) -> bool:
        """Take the lease if free (or already ours, then refresh it). True if held now."""

    @abc.abstractmethod
    async def renew_lease(self, sid: str, node: str, ttl: float) -> bool:
        """Extend our lease; False if it is no longer ours."""

    async def keep_leases(self, sids: Sequence[str], node: str, ttl: float) -> list[bool]:
        """``acquire_lease`` for many sessions at once: whether each is held now.

        How a node keeps all its leases alive; stores override it to do it in
        few round trips. Raises ``StoreUnavailable`` if the store is down.
        """
        return [await self.acquire_lease(sid, node, ttl) for sid in sids]

    @abc.abstractmethod
    async def release_lease(self, sid: str, node: str) -> None:
        """Give the lease up if it is ours (no-op otherwise)."""

    @abc.abstractmethod
    async def lease_owner(self, sid: str) -> str | None:
        """The node holding the lease, or None."""

    # --- counters and slots (per-key limits, see gateway.sessions.limits) ---------------
    # Not abstract, so a store written for tests need not carry them; both
    # real stores implement them.

    async def incr_window(self, key: str, amount: int, ttl: float) -> int:
        """Atomically add ``amount`` to counter ``key``; its new value.

        A new counter starts at 0 and expires ``ttl`` s after it was created
        (adding does not extend it), so ``key`` names a window: a key per
        minute or per day is a fixed-window rate counter. ``amount`` 0 reads.
        """
        raise NotImplementedError(f"{type(self).__name__} has no counters")

    async def acquire_slot(self, key: str, member: str, limit: int, ttl: float) -> bool:
        """Hold one of ``limit`` slots of ``key`` as ``member`` for ``ttl`` s.

        False when ``limit`` live members already hold one (``limit`` 0: no
        limit). Members not renewed within their ``ttl`` stop counting, so the
        slots of a node that died free themselves.
        """
        raise NotImplementedError(f"{type(self).__name__} has no slots")

    async def renew_slots(self, key: str, members: Sequence[str], ttl: float) -> None:
        """Extend the slots ``members`` still hold in ``key`` by ``ttl`` s (heartbeat)."""
        raise NotImplementedError(f"{type(self).__name__} has no slots")

    async def release_slot(self, key: str, member: str) -> None:
        """Give the slot up (no-op if ``member`` holds none)."""
        raise NotImplementedError(f"{type(self).__name__} has no slots")

    async def hold_bytes(
        self, key: str, member: str, size: int, limit: int, ttl: float
    ) -> tuple[bool, int]:
        """Hold ``size`` bytes of quota ``key`` as ``member`` for ``ttl`` s.

        Returns ``(held, total)``: ``total`` is what the key's live members
        hold now (with this one if it was held). Refused, with nothing
        changed, when that would pass ``limit`` (0: no limit). A member held
        already is replaced (its size and its deadline), so the same call
        moves a deadline. Members past their deadline stop counting: a
        quota of stored bytes frees itself as what it counts expires.
        """
        raise NotImplementedError(f"{type(self).__name__} has no byte quotas")

    async def release_bytes(self, key: str, member: str) -> None:
        """Give ``member``'s bytes back (no-op if it holds none)."""
        raise NotImplementedError(f"{type(self).__name__} has no byte quotas")

    # --- control messages between nodes -----------------------------------------

    @abc.abstractmethod
    async def publish(self, channel: str, data: bytes) -> int:
        """Send ``data`` to whoever listens on ``channel`` now; how many listeners got it.

        0 must mean that certainly nobody did (the listener's node is dead, or
        its subscription is between connections): a node forwarding a command
        then keeps it instead of counting on an answer. A store that cannot
        count every listener (a cluster that counts one shard's clients) must
        return at least 1 when it is unsure.
        """

    @abc.abstractmethod
    async def listen(self, channel: str, handler: Callable[[bytes], None]) -> None:
        """Call ``handler`` for each message on ``channel`` until cancelled.

        Survives store outages by itself (reconnects and subscribes again);
        messages published while it was disconnected are lost, so senders
        must treat delivery as best effort.
        """

    # --- lifecycle -------------------------------------------------------------

    async def ping(self) -> bool:
        """True when the store answers (for readiness checks)."""
        return True

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


# Tasks of ``Store.submit_appends`` (the loop keeps only weak references).
_submitted: set[asyncio.Task[list[BaseException | None]]] = set()
