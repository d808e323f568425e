"""The session store's interfaces: narrow Protocols, one per concern.

A consumer is typed against the concern it uses, as centrifuge's ``Broker``
and ``PresenceManager`` are: the log writer against ``Sessions``, the
connection slots against ``Counters``, the rights watch against ``Bus``, the
client tokens and API keys against ``Secrets``, readiness against ``Health``.
``Store`` is all of them, what ``open_store`` returns and the node holds.
Two implementations share them, side by side: the memory ones
(``gateway.store.memory``: one process, nothing to install) and the Redis ones
(``gateway.store.redis_*``: many nodes, survives restarts); one test suite
runs against both (tests/store/conftest.py).

Data model (Redis keys share the hash tag ``{SID}`` so a cluster keeps a session
on one slot):

- ``rtgw:{SID}:meta``    hash: owner, provider, created, status, …
- ``rtgw:{SID}:log``     stream of every client event; entry id ``SEQ-0`` (``SEQ-1`` past a fence)
- ``rtgw:{SID}:history`` list of persisted semantic units (context assembly input)
- ``rtgw:{SID}:lease``   the node driving the session (``SET NX PX``, renewed)
- ``rtgw:{SID}:gone``    set by ``delete_session``: the session may not be leased again
- ``rtgw:{SID}:rec``     string: the session's recording (JSON Lines), if it is recorded

Durability rule: **log, then send**. ``append`` returns only when the entries are
stored as the store's durability promises (on the primary, or on a replica
too); only then are they sent to clients. ``append`` is fenced by the lease: a
node that lost its lease cannot write, so two nodes never both write a ``seq``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple, Protocol

__all__ = [
    "NOT_STORED",
    "RECORDING",
    "RECORDING_CUT",
    "AppendBatch",
    "Bus",
    "Counters",
    "Durability",
    "EventLog",
    "Health",
    "LeaseLost",
    "Leases",
    "LogEntry",
    "RecordingChunk",
    "RecordingPage",
    "Recordings",
    "Secrets",
    "SeqConflict",
    "SessionMeta",
    "Sessions",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Unreplicated",
    "read_recording_page",
    "submit_in_task",
    "whole_lines",
]


class LogEntry(NamedTuple):
    """One logged client event: its ``seq`` and the exact bytes sent to clients."""

    seq: int
    data: bytes


Durability = Literal["local", "replicated", "replicated-or-local"]
"""When an append counts as stored: on the primary ("local"); on a replica too
("replicated": while none confirms, sessions hold their events); on a replica
while one confirms, else on the primary ("replicated-or-local": available, but a
failover may lose what no replica confirmed)."""

AppendBatch = tuple[str, str, Sequence[LogEntry], Sequence[bytes]]
"""One session's append in a round: ``(sid, node, entries, history)``."""


RecordingChunk = tuple[str, bytes, bytes]
"""One session's lines for its recording in a round: ``(sid, lines, cut)``, where ``cut``
is the line written instead when ``lines`` would take the recording past its limit."""

RECORDING: Final = "recording"
"""The meta field that says a session is recorded: ``on``, or ``cut`` at its limit."""
NOT_STORED: Final = -1
"""``Recordings.append_recordings``: the session is not stored (yet, or any more)."""
RECORDING_CUT: Final = -2
"""``Recordings.append_recordings``: the recording reached its limit (now or before)."""


class StoreError(Exception):
    """Base of the store's errors."""


class StoreUnavailable(StoreError):
    """The backing store cannot be reached (Redis down or restarting). Retry later."""


class Unreplicated(StoreUnavailable):
    """Stored on the primary, but no replica confirmed it in time (durability replicated).

    Not yet safe to show a client: a failover now would lose it. The writer
    holds it and asks again (``EventLog.confirmed_seq``) until a replica has it.
    """


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


# Every method below may raise ``StoreUnavailable``.


class SessionMeta(Protocol):
    """A session's record: created, read, updated, deleted, its tombstone read (5 methods)."""

    async def create_session(
        self, sid: str, meta: Mapping[str, str], ttl: float | None = None
    ) -> bool:
        """Create the session with ``meta``; False if it already exists.

        ``ttl`` (s) replaces the store's idle TTL until the session's next
        write (append or ``set_meta``), which restarts the normal one: a
        session made for a client that never comes (``POST /v1/sessions``)
        is kept a short while only.
        """
        ...

    async def get_meta(self, sid: str) -> dict[str, str] | None:
        """The session's meta, or None if it does not exist (or expired)."""
        ...

    async def set_meta(self, sid: str, fields: Mapping[str, str]) -> None:
        """Update some meta fields of an existing session (a no-op if it is gone)."""
        ...

    async def delete_session(self, sid: str) -> bool:
        """Remove the session's meta, log, history, lease and recording; False if it did not exist.

        The session is fenced for its idle TTL afterwards: no node can take its
        lease, so a driver that has not heard of the delete yet cannot write
        it back (its appends and lease renewals fail, ``LeaseLost``).
        """
        ...

    async def were_deleted(self, sids: Sequence[str]) -> list[bool]:
        """Whether each session was deleted and is still fenced (its ``gone`` mark).

        The tombstones a node's workspace sweep reads: a workspace written by a
        turn that raced its session's delete (its node missed the ``Deleted``
        message) is removed whatever its age. A store without fences: all False.
        """
        ...


class EventLog(Protocol):
    """A session's event log and history: append, read, follow (9 methods)."""

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
        if the seqs do not follow on, ``Unreplicated`` if the primary has it but
        no replica confirmed it (durability replicated). Refreshes the session's
        idle TTL.
        """
        ...

    async def append_many(self, batches: Sequence[AppendBatch]) -> list[BaseException | None]:
        """``append`` for several sessions, in one round trip where the store can.

        Each batch succeeds or fails on its own; the result for each is None or
        the exception ``append`` would have raised.
        """
        ...

    def submit_appends(
        self,
        batches: Sequence[AppendBatch],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> None:
        """``append_many``, answered by calling ``on_done(results)`` (on the event loop).

        The node's log writer runs one round per event at low load; a callback
        saves it a task wake-up per round and another for the store's answer.
        ``on_done`` is called exactly once, never from inside this call.
        """
        ...

    async def read_log(
        self, sid: str, after: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[LogEntry]:
        """Up to ``limit`` entries with ``seq > after``, in order.

        With ``max_bytes``, no more entries than fit in that many bytes of
        ``data``, except that the first is returned whatever its size (a
        reader always moves on). The store decides what fits as it reads, so
        a page of large events is never materialised whole, here or in Redis.
        """
        ...

    async def wait_log(self, sid: str, after: int, timeout: float) -> list[LogEntry]:
        """Entries with ``seq > after``, waiting up to ``timeout`` s for the first one.

        How a node that does not drive the session follows it live.
        """
        ...

    async def first_seq(self, sid: str) -> int:
        """The oldest ``seq`` still in the (trimmed) log; 0 if the log is empty."""
        ...

    async def last_seq(self, sid: str) -> int:
        """The newest ``seq`` in the log; 0 if the log is empty."""
        ...

    async def confirmed_seq(self, sid: str) -> int:
        """The newest ``seq`` stored as durably as ``append`` promises; 0 if none.

        How a writer settles an append that failed in flight: what this says
        is stored may be sent to clients. With durability replicated it is the
        log's last seq only once a replica has confirmed it (asked again now):
        having reached the primary is not enough. Raises ``Unreplicated`` when
        no replica confirms in time.
        """
        ...

    async def read_history(self, sid: str, start: int = 0, count: int = 0) -> list[bytes]:
        """History items from the ``start``-th (0: the oldest), oldest first: ``count``
        of them at most (0: every one to the end)."""
        ...


class Leases(Protocol):
    """Which node drives a session (6 methods)."""

    async def acquire_lease(self, sid: str, node: str, ttl: float) -> bool:
        """Take the lease if free (or already ours, then refresh it). True if held now."""
        ...

    async def renew_lease(self, sid: str, node: str, ttl: float) -> bool:
        """Extend our lease; False if it is no longer ours."""
        ...

    async def keep_leases(self, sids: Sequence[str], node: str, ttl: float) -> list[bool]:
        """``acquire_lease`` for many sessions at once, in few round trips: whether each is held."""
        ...

    async def release_lease(self, sid: str, node: str) -> None:
        """Give the lease up if it is ours (no-op otherwise)."""
        ...

    async def lease_owner(self, sid: str) -> str | None:
        """The node holding the lease, or None."""
        ...

    async def lease_expires_in(self, sid: str) -> float:
        """Seconds until the lease expires unless renewed (0: nobody holds it).

        A node following a session waits this long, not a whole poll, to take
        over from a driver that died.
        """
        ...


class Sessions(SessionMeta, EventLog, Leases, Protocol):
    """The session log: meta, events and history, lease (19 methods)."""


class Counters(Protocol):
    """Counters shared by nodes, for per-key limits (``gateway.sessions.limits``) (6 methods)."""

    async def incr_window(self, key: str, amount: int, ttl: float) -> int:
        """Atomically add ``amount`` to counter ``key``; its new value.

        A new counter starts at 0 and expires ``ttl`` s after it was created
        (adding does not extend it), so ``key`` names a window: a key per
        minute or per day is a fixed-window rate counter. ``amount`` 0 reads.
        """
        ...

    async def acquire_slot(self, key: str, member: str, limit: int, ttl: float) -> bool:
        """Hold one of ``limit`` slots of ``key`` as ``member`` for ``ttl`` s.

        False when ``limit`` live members already hold one (``limit`` 0: no
        limit). Members not renewed within their ``ttl`` stop counting, so the
        slots of a node that died free themselves.
        """
        ...

    async def renew_slots(self, key: str, members: Sequence[str], ttl: float) -> None:
        """Extend the slots ``members`` still hold in ``key`` by ``ttl`` s (heartbeat)."""
        ...

    async def release_slot(self, key: str, member: str) -> None:
        """Give the slot up (no-op if ``member`` holds none)."""
        ...

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
        ...

    async def release_bytes(self, key: str, member: str) -> None:
        """Give ``member``'s bytes back (no-op if it holds none)."""
        ...


class Bus(Protocol):
    """Control messages between nodes, best effort (2 methods)."""

    async def publish(self, channel: str, data: bytes) -> int:
        """Send ``data`` to whoever listens on ``channel`` now; how many listeners got it.

        0 must mean that certainly nobody did (the listener's node is dead, or
        its subscription is between connections): a node forwarding a command
        then keeps it instead of counting on an answer. A store that cannot
        count every listener (a cluster that counts one shard's clients) must
        return at least 1 when it is unsure.
        """
        ...

    async def listen(self, channel: str, handler: Callable[[bytes], None]) -> None:
        """Call ``handler`` for each message on ``channel`` until cancelled.

        Survives store outages by itself (reconnects and subscribes again);
        messages published while it was disconnected are lost, so senders
        must treat delivery as best effort.
        """
        ...


class Secrets(Protocol):
    """What nodes must agree on to trust each other's clients: a secret, the API keys (6)."""

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        """The secret stored as ``name``, storing ``candidate`` if none is yet.

        How nodes sharing a store agree on a secret (the client tokens'
        signing key) with no setup: the first node's candidate wins.
        """
        ...

    async def api_key(self, digest: str) -> str | None:
        """The value stored for an API key's SHA-256 ``digest`` (``key_id [options]``), or None."""
        ...

    async def api_keys(self, digests: Sequence[str]) -> dict[str, str]:
        """digest → value for those of ``digests`` that are issued now (one round trip)."""
        ...

    async def all_api_keys(self) -> dict[str, str]:
        """Every issued key: digest → value."""
        ...

    async def put_api_key(self, digest: str, value: str) -> None:
        """Issue a key: store ``value`` (``key_id [tools=…]``) for its ``digest``."""
        ...

    async def remove_api_keys(self, digests: Sequence[str]) -> int:
        """Revoke keys by digest; how many were issued."""
        ...


class Health(Protocol):
    """What readiness, the metrics and a starting node ask of a store (4 methods)."""

    async def ping(self) -> bool:
        """True when the store answers; False (not an exception) when it does not."""
        ...

    async def refusal(self) -> str | None:
        """What to change when the store refuses this node for good (a wrong password,
        no such database, not a Redis at all), in one line; None when it answers or is
        only down (waiting fixes that). A starting node stops on it."""
        ...

    def degraded(self) -> str | None:
        """Why the store cannot keep its durability promise now, or None while it can.

        With durability replicated: no replica confirms writes, so sessions
        hold their events (``/readyz`` says so). Cheap: no I/O.
        """
        ...

    def unconfirmed(self) -> list[str]:
        """The servers whose replicas did not confirm the last write asked of them.

        Under "replicated-or-local" these take writes no replica has: what a
        failover there may lose. Empty under "local". Cheap: no I/O.
        """
        ...


class Recordings(Protocol):
    """Sessions' recordings (the flight recorder): written in rounds, read by bytes (2 methods).

    A recording lives with its session: it is written only while the session
    is stored, expires the session's idle TTL after its last write, and
    ``delete_session`` removes it.
    """

    async def append_recordings(self, chunks: Sequence[RecordingChunk], limit: int) -> list[int]:
        """Append each session's lines to its recording; per chunk, the recording's size
        in bytes after it, or ``NOT_STORED`` (the session is not stored: nothing was
        written), or ``RECORDING_CUT``: the lines would take it past ``limit`` bytes, so
        the whole lines of them that fit (the ``cut`` line included) were written, then
        the chunk's ``cut`` line, once, and nothing is written to it any more. Empty lines only keep the recording as long as its session."""
        ...

    async def read_recording(self, sid: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """The recording's bytes from ``offset``, at most ``max_bytes``, ended after the
        last whole line they hold (if any); and the recording's size (0: none)."""
        ...


class Store(Sessions, Counters, Bus, Secrets, Health, Recordings, Protocol):
    """Every concern at once: what ``open_store`` gives and a node holds."""

    kind: str

    async def close(self) -> None:
        """Let the writes in flight finish, then release connections."""
        ...


def submit_in_task(
    append_many: Callable[[Sequence[AppendBatch]], Coroutine[Any, Any, list[BaseException | None]]],
    batches: Sequence[AppendBatch],
    on_done: Callable[[list[BaseException | None]], None],
) -> None:
    """``submit_appends`` for a store with no callback path: ``append_many`` in a task.

    ``on_done`` is called exactly once, from the task's done callback.
    """
    task = asyncio.get_running_loop().create_task(append_many(batches))
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


# Tasks of ``submit_in_task`` (the loop keeps only weak references).
_submitted: set[asyncio.Task[list[BaseException | None]]] = set()


def whole_lines(page: bytes) -> bytes:
    """A recording's page up to its last newline (all of it if it holds none: part of
    one long line, which the next page goes on with)."""
    end = page.rfind(b"\n")
    return page if end < 0 else page[: end + 1]


ReadRecording = Callable[[str, int, int], Coroutine[Any, Any, tuple[bytes, int]]]
"""A store's ``read_recording``."""


class RecordingPage(NamedTuple):
    """A page of a recording (``read_recording_page``): its bytes, the recording's size,
    and, when ``offset`` was not where a line starts (the recording's end is one), what
    was wrong with it instead of a page."""

    data: bytes
    size: int
    problem: str | None = None


async def read_recording_page(
    read: ReadRecording, sid: str, offset: int, max_bytes: int
) -> RecordingPage:
    """The whole lines of ``sid``'s recording from ``offset`` that fit in ``max_bytes``,
    or the one line there, whole and alone, when it is longer.

    A page is JSON Lines that reads on its own (no line, and no UTF-8 character, cut
    in two), so every page ends where a line starts, and an offset that is not where
    a line starts (the byte before it is no newline) gives no page, but a problem.
    That is one byte read beside the page (one ``GETRANGE`` on Redis). A line longer
    than ``max_bytes`` is read on, ``max_bytes`` at a time, to its newline: a page holds
    at most the longest line, which the recorder keeps within ``record_max_bytes``.
    """
    if offset == 0:
        before = b"\n"
        data, size = await read(sid, 0, max_bytes)
    else:
        (before, _), (data, size) = await asyncio.gather(
            read(sid, offset - 1, 1), read(sid, offset, max_bytes)
        )
    if before != b"\n":
        if offset > size:
            problem = f"offset {offset} is past the end of the recording ({size:,} bytes)"
        else:
            problem = f"offset {offset} is inside a line of the recording, not where one starts"
        return RecordingPage(b"", size, problem)
    parts, end = [data], offset + len(data)
    while parts[-1] and not parts[-1].endswith(b"\n"):  # part of a longer line
        more, now = await read(sid, end, max_bytes)
        more = more[: more.find(b"\n") + 1 or None]  # the line alone, to its newline
        parts.append(more)
        end, size = end + len(more), max(size, now)
    return RecordingPage(b"".join(parts), size)
