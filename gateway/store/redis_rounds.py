"""The log writer's rounds on the append pipe, and the way back to the group commit.

On one server under durability "local", a round of the node's log writer is
packed as calls of the ``ROUND`` script (every session's append in one call:
one EVALSHA and one MGET of the leases per round, then an XADD per event;
``gateway.store.redis_scripts``), written on the append pipe
(``gateway.store.redis_pipe``) and answered from its ``data_received``: no task, future or await per round. What
the pipe cannot finish itself goes through the awaited group commit
(``gateway.store.redis_commit``), which owns redirects, retries and reconnect
backoff: a round sent while the pipe is not connected, and the appends a
round's replies say were not run (``NOSCRIPT``, ``READONLY`` and the like).

**The fence in the log: a bare XADD.** Most of a round is sessions appending
one event where the store knows the log ends (``SeqMemo``'s ``TRUST``). Such an
append is one bare ``XADD … NOMKSTREAM … <seq>-0`` (``pack_xadd``): no script,
no lease read, one command per event where the script made three (EVALSHA, the
lease's GET, XADD; at 10 sessions a round carries one event, so that was Redis's
count per event). The lease's fence moves into the log: a node that takes a
lease nobody holds sets the log's last ID to ``<top + 1>-0`` (``ACQUIRE``), and
this node's bare appends are at most that, so Redis refuses them once another
node has taken the session (measured and argued in docs/performance.md). An
append the fence refuses, whose log is gone (nil: ``NOMKSTREAM`` on a deleted
session), or which failed otherwise is sent again through the group commit
with the check (the script reads the lease and the log's end): it is then
refused for what it is (``LeaseLost``, ``SeqConflict``) or stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from typing import Final

from gateway.store.base import AppendBatch, StoreError
from gateway.store.redis_batch import REDIRECT_REPLIES, CommitStats
from gateway.store.redis_commit import GroupCommit, consecutive
from gateway.store.redis_fastpath import (
    RoundPart,
    bare_entry,
    pack_append,
    pack_round,
    pack_xadd,
)
from gateway.store.redis_pipe import AppendPipe, Replies
from gateway.store.redis_seqmemo import TRUST

__all__ = ["ROUND_SESSIONS", "PipeRounds"]

ROUND_SESSIONS: Final = 200
"""Sessions per ``ROUND`` call at most: Lua's ``unpack`` of the leases stays small."""

# (index in the round, sid, node, first seq, last seq, check flag) of one append sent.
_Sent = tuple[int, str, str, int, int, bytes]
BARE: Final = b"(bare XADD)"
"""The ``_Sent`` flag of a bare XADD (``pack_xadd``): no script, no check flag."""


class PipeRounds:
    """Rounds on ``pipe``; appends it could not run are sent again through ``commit``."""

    def __init__(
        self,
        pipe: AppendPipe,
        commit: GroupCommit,
        *,
        prefix: str,
        error: Callable[[BaseException, str, str], StoreError],
        stats: CommitStats,
    ) -> None:
        self._pipe = pipe
        self._commit = commit
        self._prefix = prefix
        self._error = error
        self.stats = stats
        self._again: set[asyncio.Task[None]] = set()  # rounds resent the awaited way
        self._connects = 0  # the pipe's connects seen: a new one clears the memo

    def send(
        self,
        batches: Sequence[AppendBatch],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> bool:
        """Send a round on the pipe if it is connected; False: take the awaited path.

        The round's appends go as ``ROUND`` script calls of up to
        ``ROUND_SESSIONS`` sessions each (one per node named). ``on_done(results)``
        is called once, from the pipe's ``data_received`` (or when the
        connection ends or the round overruns its budget).
        """
        pipe = self._pipe
        if not pipe.ready:
            self._commit.memo.clear()  # a new connection: maybe a new primary (``SeqMemo``)
            pipe.warm()
            return False
        if pipe.connects != self._connects:
            self._connects = pipe.connects
            self._commit.memo.clear()
        commands: list[bytes] = []
        chunks: list[list[_Sent]] = []  # the sessions of each command
        results: list[BaseException | None] = [None] * len(batches)
        limits = self._commit.limits
        max_log = self._commit.max_log
        flag = self._commit.memo.flag
        prefix = self._prefix
        parts: list[RoundPart] = []
        chunk: list[_Sent] = []
        chunk_node = ""
        bare: list[bytes] = []  # the bare XADDs (see the module), after the script calls
        bare_sent: list[list[_Sent]] = []
        for i, (sid, node, entries, history) in enumerate(batches):
            try:
                first = consecutive(sid, entries)
            except ValueError as exc:
                results[i] = exc
                continue
            check = flag(sid, node, first)
            key = f"{prefix}:{{{sid}}}:".encode()
            if (data := bare_entry(check, entries, history)) is not None:
                bare.append(pack_xadd(key, max_log, first, data))
                bare_sent.append([(i, sid, node, first, first, BARE)])
                continue
            if chunk and (node != chunk_node or len(chunk) == ROUND_SESSIONS):
                commands.append(_pack(chunk_node.encode(), limits, parts))
                chunks.append(chunk)
                parts, chunk = [], []
            chunk_node = node
            parts.append((key, first, [data for _, data in entries], history, check))
            chunk.append((i, sid, node, first, first + len(entries) - 1 if entries else 0, check))
        if chunk:
            commands.append(_pack(chunk_node.encode(), limits, parts))
            chunks.append(chunk)
        if bare:
            commands += bare
            chunks += bare_sent
        if not commands:
            asyncio.get_running_loop().call_soon(on_done, results)
            return True
        stats = self.stats
        appends = len(batches) - sum(1 for r in results if r is not None)
        stats.appends += appends
        stats.flushes += 1
        stats.pipe_rounds += 1
        if appends > stats.max_batch:
            stats.max_batch = appends
        pipe.send(
            b"".join(commands),
            len(commands),
            partial(self._replies, batches, chunks, results, on_done),
        )
        return True

    async def close(self) -> None:
        """Let the rounds in flight and those being resent finish."""
        await self._pipe.close()
        if self._again:
            await asyncio.wait(set(self._again))

    def _replies(
        self,
        batches: Sequence[AppendBatch],
        chunks: list[list[_Sent]],
        results: list[BaseException | None],
        on_done: Callable[[list[BaseException | None]], None],
        replies: Replies,
    ) -> None:
        if isinstance(replies, BaseException):
            self._commit.memo.clear()
            error = self._error(
                replies,
                "appending",
                "; the append may or may not be stored: read last_seq before writing again",
            )
            for chunk in chunks:
                for i, *_ in chunk:
                    results[i] = error
            on_done(results)
            return
        again: list[int] = []
        checked: list[int] = []  # bare XADDs not stored: sent again with the check
        memo = self._commit.memo
        stored = memo.stored
        rejection = self._commit.sender.rejection
        for chunk, line in zip(chunks, replies, strict=True):
            if chunk[0][5] is BARE:
                i, sid, node, _, last, _ = chunk[0]
                if line.startswith(b"$") and line != b"$-1":
                    stored(sid, node, last, TRUST)
                elif line.startswith(REDIRECT_REPLIES):
                    again.append(i)
                else:  # fenced, refused, or the log is gone: the script says which
                    memo.forget(sid)
                    checked.append(i)
                continue
            if line.startswith(b"+"):
                outcomes = line[1:].split(b"|")
            elif line == b":1":  # a lone session's APPEND (``_pack``)
                outcomes = [b"1"]
            elif line.startswith(b"-NOSCRIPT") or line.startswith(REDIRECT_REPLIES):
                again += [i for i, *_ in chunk]  # not run: sent again the awaited way
                continue
            else:  # the whole call failed: each session gets what APPEND would answer
                outcomes = [line[1:]] * len(chunk)
            for (i, sid, node, first, last, check), outcome in zip(chunk, outcomes, strict=True):
                if outcome == b"1":
                    stored(sid, node, last, check)
                else:
                    results[i] = rejection(sid, node, first, outcome.decode(errors="replace"))
        if not again and not checked:
            on_done(results)
            return
        if again:
            self._pipe.reset()  # READONLY and the like: the next connect finds the primary
            memo.clear()
        task = asyncio.get_running_loop().create_task(
            self._append_again(batches, again + checked, results, on_done)
        )
        self._again.add(task)
        task.add_done_callback(self._again.discard)

    async def _append_again(
        self,
        batches: Sequence[AppendBatch],
        again: list[int],
        results: list[BaseException | None],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> None:
        commit = self._commit
        futures = [commit.enqueue(*batches[i], start=False) for i in again]
        try:
            await commit.flush_queued()
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
        except BaseException as exc:
            outcomes = [exc] * len(again)
            raise
        finally:
            for i, outcome in zip(again, outcomes, strict=True):
                results[i] = outcome
            on_done(results)


def _pack(node: bytes, limits: bytes, parts: list[RoundPart]) -> bytes:
    """A ``ROUND`` call, or for a lone session its ``APPEND``: the same 3 commands in
    Redis, a smaller script and packing (an error reply is then that session's own)."""
    if len(parts) == 1:
        key, first, entries, history, check = parts[0]
        return pack_append(key, node, limits, first, entries, history, check)
    return pack_round(node, limits, parts)
