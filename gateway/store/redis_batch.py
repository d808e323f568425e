"""One batch of appends to one master: the pipeline sent, and each reply settled.

The group commit (``gateway.store.redis_commit``) decides which appends go
together and to which master's lane, and holds and resends what was not
written; this is the round trip it hands each batch to. ``BatchSender.send``
writes the batch's packed ``EVALSHA`` commands as one pipeline (ending with
``WAIT 1 timeout`` under replicated durability), reads the replies in bulk
(``gateway.store.redis_fastpath``; ``bulk_replies = False``: through
redis-py's parser) and settles each append as its reply arrives: stored,
rejected by the script (``LEASELOST``, ``SEQCONFLICT``: ``rejection``), or
returned to be sent again (a redirect, ``READONLY``; ``NOSCRIPT`` at once, after the
script is loaded there). A connection lost after the batch was sent fails
what it had not settled ("maybe stored"); replicas that do not confirm in
time fail or pass the appends by the durability (``gateway.store.redis_replicas``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

from gateway.store.base import (
    LeaseLost,
    SeqConflict,
    StoreError,
    StoreUnavailable,
    Unreplicated,
)
from gateway.store.redis_fastpath import (
    bulk,
    closed_by_server,
    fast_replies,
    pack_append_at,
    reply_lines,
    with_check,
)
from gateway.store.redis_replicas import ReplicaWatch
from gateway.store.redis_scripts import APPEND
from gateway.store.redis_seqmemo import CHECK, TRUST, SeqMemo
from gateway.store.redis_topology import Route

__all__ = [
    "ERRORS",
    "REDIRECT_REPLIES",
    "BatchSender",
    "CommitStats",
    "PendingAppend",
    "fail",
]

ERRORS: Final = (RedisError, RedisClusterException, OSError)
# Replies that mean "not written, not here or not now": send again after a refresh.
REDIRECT_REPLIES: Final = (
    b"-MOVED",
    b"-ASK",
    b"-TRYAGAIN",
    b"-CLUSTERDOWN",
    b"-MASTERDOWN",
    b"-READONLY",
    b"-LOADING",
)


@dataclass(slots=True)
class CommitStats:
    """Counters for the group commit and reconnects (for tests, metrics and benches)."""

    appends: int = 0
    """``append`` calls queued."""
    flushes: int = 0
    """Batches sent (``appends / flushes`` = batch size)."""
    max_batch: int = 0
    """The most appends one flush carried."""
    connects: int = 0
    """Command connections opened on a single Redis (each loads the scripts)."""
    noscript_reloads: int = 0
    """Times a ``NOSCRIPT`` reply made the store load its scripts and retry."""
    redirects: int = 0
    """Appends sent again after a redirect or a refused connection (failover, resharding)."""
    unreplicated: int = 0
    """Appends no replica confirmed in time (held, or under replicated-or-local sent anyway)."""
    pipe_rounds: int = 0
    """Log writer rounds sent on the append pipe (``gateway.store.redis_pipe``)."""


@dataclass(slots=True)
class PendingAppend:
    """One queued append: its packed command, its caller's future, where it goes."""

    command: bytes
    future: asyncio.Future[None]
    sid: str
    node: str
    first: int
    key: str
    last: int  # its last seq (0: no entries)
    check: bytes  # the script's ``check`` flag it was packed with (``SeqMemo``)
    check_at: int  # where that flag is in ``command``
    generation: int  # the memo's generation it was packed under
    deadline: float = 0.0  # until when it is sent again (set at its first redirect)
    delay: float = 0.05  # its next backoff
    reloaded: bool = False  # answered NOSCRIPT once, and sent again at once
    bare: bytes | None = None
    """A bare XADD's entry (``pack_xadd``): packed as the script with the check when
    it must read the log (a stale memo, or Redis refused or fenced it)."""

    def checked(self, limits: bytes) -> None:
        """Packed again as the append script with ``check`` "1" (reads the lease and
        the log's end), whatever it was packed as."""
        if self.bare is not None:
            self.command, self.check_at = pack_append_at(
                self.key[:-3].encode(),
                self.node.encode(),
                limits,
                self.first,
                [self.bare],
                [],
                CHECK,
            )
            self.bare = None
        else:
            self.command = with_check(self.command, self.check_at, CHECK)
        self.check = CHECK


class BatchSender:
    """Send a batch to its master and settle each append (see the module docstring)."""

    bulk_replies: bool = True
    """Read replies in bulk (``gateway.store.redis_fastpath``); False: redis-py's parser."""

    def __init__(
        self,
        *,
        socket_timeout: float,
        replicas: ReplicaWatch,
        memo: SeqMemo,
        limits: bytes,
        error: Callable[[BaseException, str, str], StoreError],
        stats: CommitStats,
    ) -> None:
        self._socket_timeout = socket_timeout
        self._limits = limits  # the append script's TTL and log bound, packed
        self._wait = replicas.durability != "local"
        self.replicas = replicas
        self.memo = memo
        self._error = error
        self.stats = stats
        # One deadline covers a whole round trip (and the replicas' wait).
        self._budget = socket_timeout + (replicas.replica_timeout_ms / 1000 if self._wait else 0.0)

    async def send(
        self, route: Route, items: list[PendingAppend]
    ) -> tuple[list[PendingAppend], BaseException | None]:
        """One pipelined round trip to one master; settles what it can.

        Returns the appends to send again (nothing of them was written) and why.
        """
        try:
            conn = await route.connection()
        except MaxConnectionsError as exc:
            fail(items, self._error(exc, "appending", "; nothing was stored"))
            return [], None
        except ERRORS as exc:
            return items, exc
        if closed_by_server(conn):
            # Redis closed it while idle (a restart): reconnect, as the pool
            # would on checkout, rather than fail a flush on a dead socket.
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
        elif conn.is_connected:
            return await self._round_trip(route.name, conn, items)
        self.memo.clear()  # a new connection: maybe a new primary (``SeqMemo``)
        try:
            async with asyncio.timeout(self._socket_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
        except ERRORS as exc:  # also the deadline: TimeoutError is an OSError
            return items, exc  # refused or unreachable: nothing was sent
        return await self._round_trip(route.name, conn, items)

    async def _round_trip(
        self, master: str, conn: AbstractConnection, items: list[PendingAppend]
    ) -> tuple[list[PendingAppend], BaseException | None]:
        again: list[PendingAppend] = []
        reason: BaseException | None = None
        stored: list[PendingAppend] = []
        noscript: list[PendingAppend] = []
        settled = 0
        wait = self._wait
        count = len(items) + wait
        generation = self.memo.generation
        for item in items:
            if item.generation != generation and item.check is TRUST:
                # Packed before the memo was cleared (a reconnect, a redirect):
                # what it knew may be stale, so this one reads the log's end.
                item.checked(self._limits)
                item.generation = generation
        packed = [item.command for item in items]
        if wait:
            packed.append(_wait_command(self.replicas.wait_ms(master)))
        acked = -1
        try:
            async with asyncio.timeout(self._budget):
                await conn.send_packed_command(packed, check_health=False)
                if self.bulk_replies and fast_replies(conn):
                    replies = reply_lines(conn, count)
                else:
                    replies = _parsed_lines(conn, count)
                async for lines in replies:
                    for line in lines:
                        if settled == len(items):  # the WAIT reply
                            acked = int(line[1:])
                            continue
                        item = items[settled]
                        settled += 1
                        if item.bare is not None and not line.startswith(REDIRECT_REPLIES):
                            if line.startswith(b"$") and line != b"$-1":
                                if wait:
                                    stored.append(item)  # stored once the replicas confirm
                                elif not item.future.done():
                                    self.memo.stored(item.sid, item.node, item.last, TRUST)
                                    item.future.set_result(None)
                            else:  # fenced, refused, or the log is gone: the script says which
                                self.memo.forget(item.sid)
                                item.checked(self._limits)
                                again.append(item)
                            continue
                        if line == b":1":
                            if wait:
                                stored.append(item)  # stored once the replicas confirm
                            elif not item.future.done():
                                # Settled as its reply arrives: its session queues
                                # the next append while the rest are still read.
                                self.memo.stored(item.sid, item.node, item.last, item.check)
                                item.future.set_result(None)
                        elif line.startswith(b"-NOSCRIPT"):
                            noscript.append(item)
                            again.append(item)
                        elif line.startswith(REDIRECT_REPLIES):
                            again.append(item)
                            reason = ResponseError(line[1:].decode(errors="replace"))
                        else:
                            self._reject(item, line[1:].decode(errors="replace"))
                if noscript:
                    self.stats.noscript_reloads += 1
                    await conn.send_command("SCRIPT", "LOAD", APPEND.src)
                    await conn.read_response()
                    if reason is None and not any(item.reloaded for item in noscript):
                        # Nothing of them ran and the script is there now (a promoted
                        # replica, a node the store's view missed when it loaded its
                        # scripts): sent again at once, as a second send, not held
                        # as a failure, so no retry window is spent on it.
                        for item in noscript:
                            item.reloaded = True
                    else:
                        reason = reason or NoScriptError(
                            "NOSCRIPT the append script was not loaded"
                        )
        except ERRORS as exc:  # also the deadline: TimeoutError is an OSError
            self.memo.clear()
            fail(
                stored + items[settled:] + again,
                self._error(
                    exc,
                    "appending",
                    "; the append may or may not be stored: read last_seq before writing again",
                ),
            )
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            return [], None
        except BaseException:
            fail(
                stored + items[settled:] + again,
                StoreUnavailable("append interrupted (the store is closing); retry"),
            )
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            raise
        if wait and stored:
            self._replicated(master, stored, acked)
        if again:  # a redirect, READONLY, NOSCRIPT: maybe another primary now
            self.memo.clear()
        return again, reason

    def _replicated(self, master: str, stored: list[PendingAppend], acked: int) -> None:
        """Settle appends the primary took, by what its replicas said (the WAIT reply)."""
        confirmed = acked >= 1
        self.replicas.confirmed(master, confirmed)
        if not confirmed:
            self.stats.unreplicated += len(stored)
        if confirmed or self.replicas.durability == "replicated-or-local":
            for item in stored:
                if not item.future.done():
                    if confirmed:  # what no replica has may be lost: not remembered
                        self.memo.stored(item.sid, item.node, item.last, item.check)
                    else:
                        self.memo.forget(item.sid)
                    item.future.set_result(None)
            return
        fail(
            stored,
            Unreplicated(
                f"Redis at {master}: no replica confirmed the append within "
                f"{self.replicas.replica_timeout_ms} ms (durability replicated); it is "
                "held, not sent, until one does (confirmed_seq); check that the "
                "replicas are up and in sync"
            ),
        )

    def _reject(self, item: PendingAppend, message: str) -> None:
        """Turn the append script's error (``LEASELOST owner``, …) into an exception."""
        error = self.rejection(item.sid, item.node, item.first, message)
        if not item.future.done():
            item.future.set_exception(error)

    def rejection(self, sid: str, node: str, first: int, message: str) -> StoreError:
        """The exception for the append script's error reply ``message``."""
        if message.startswith("LEASELOST"):
            holder = message[10:] or None
            return LeaseLost(
                f"session {sid}: node {node!r} does not hold the lease "
                f"(held by {holder or 'nobody'}); stop driving this session",
                holder,
            )
        if message.startswith("SEQCONFLICT"):
            return SeqConflict(
                f"session {sid}: append starts at seq {first} but the log ends "
                f"at {message[12:]}; another writer raced: reload last_seq before writing"
            )
        return self._error(ResponseError(message), "appending", "")


async def _parsed_lines(conn: AbstractConnection, count: int) -> AsyncIterator[list[bytes]]:
    """The reply lines ``reply_lines`` gives, through redis-py's parser (portable, slower)."""
    for _ in range(count):
        try:
            reply = await conn.read_response(timeout=math.inf)
        except NoScriptError:  # redis-py strips the error code of these
            yield [b"-NOSCRIPT"]
        except MovedError as exc:
            yield [b"-MOVED " + str(exc).encode()]
        except AskError as exc:
            yield [b"-ASK " + str(exc).encode()]
        except TryAgainError:
            yield [b"-TRYAGAIN"]
        except ClusterDownError as exc:
            yield [b"-CLUSTERDOWN " + str(exc).encode()]
        except ReadOnlyError:
            yield [b"-READONLY"]
        except ResponseError as exc:
            yield [b"-" + str(exc).encode()]
        else:
            if reply is None:
                yield [b"$-1"]
            elif isinstance(reply, bytes):
                yield [b"$" + reply]  # a bare XADD's ID, as ``reply_lines`` gives it
            else:
                yield [b":%d" % reply]


def _wait_command(timeout_ms: int) -> bytes:
    """``WAIT 1 timeout_ms``, packed."""
    return b"*3\r\n" + bulk(b"WAIT") + bulk(b"1") + bulk(b"%d" % timeout_ms)


def fail(items: Sequence[PendingAppend], error: StoreError) -> None:
    """Settle every append of ``items`` not settled yet with ``error``."""
    for item in items:
        if not item.future.done():
            item.future.set_exception(error)
