"""The log writer's rounds on the append pipe, and the way back to the group commit.

On one server under durability "local", a round of the node's log writer is
packed and written on the append pipe (``gateway.store.redis_pipe``) and
answered from its ``data_received``: no task, future or await per round. What
the pipe cannot finish itself goes through the awaited group commit
(``gateway.store.redis_commit``), which owns redirects, retries and reconnect
backoff: a round sent while the pipe is not connected, and the appends a
round's replies say were not run (``NOSCRIPT``, ``READONLY`` and the like).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial

from gateway.store.base import AppendBatch, StoreError
from gateway.store.redis_commit import REDIRECT_REPLIES, CommitStats, GroupCommit, consecutive
from gateway.store.redis_fastpath import pack_append
from gateway.store.redis_pipe import AppendPipe, Replies

__all__ = ["PipeRounds"]


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

    def send(
        self,
        batches: Sequence[AppendBatch],
        on_done: Callable[[list[BaseException | None]], None],
    ) -> bool:
        """Send a round on the pipe if it is connected; False: take the awaited path.

        ``on_done(results)`` is called once, from the pipe's ``data_received``
        (or when the connection ends or the round overruns its budget).
        """
        pipe = self._pipe
        if not pipe.ready:
            pipe.warm()
            return False
        commands: list[bytes] = []
        # (index, sid, node, first, last, check) per command
        sent: list[tuple[int, str, str, int, int, bytes]] = []
        results: list[BaseException | None] = [None] * len(batches)
        limits = self._commit.limits
        flag = self._commit.memo.flag
        prefix = self._prefix
        for i, (sid, node, entries, history) in enumerate(batches):
            try:
                first = consecutive(sid, entries)
            except ValueError as exc:
                results[i] = exc
                continue
            check = flag(sid, first)
            commands.append(
                pack_append(
                    f"{prefix}:{{{sid}}}:".encode(),
                    node.encode(),
                    limits,
                    first,
                    [data for _, data in entries],
                    history,
                    check,
                )
            )
            sent.append((i, sid, node, first, first + len(entries) - 1 if entries else 0, check))
        if not commands:
            asyncio.get_running_loop().call_soon(on_done, results)
            return True
        stats = self.stats
        stats.appends += len(commands)
        stats.flushes += 1
        stats.pipe_rounds += 1
        if len(commands) > stats.max_batch:
            stats.max_batch = len(commands)
        pipe.send(
            b"".join(commands),
            len(commands),
            partial(self._replies, batches, sent, results, on_done),
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
        sent: list[tuple[int, str, str, int, int, bytes]],
        results: list[BaseException | None],
        on_done: Callable[[list[BaseException | None]], None],
        replies: Replies,
    ) -> None:
        if isinstance(replies, BaseException):
            error = self._error(
                replies,
                "appending",
                "; the append may or may not be stored: read last_seq before writing again",
            )
            for i, *_ in sent:
                results[i] = error
            on_done(results)
            return
        again: list[int] = []
        stored = self._commit.memo.stored
        for (i, sid, node, first, last, check), line in zip(sent, replies, strict=True):
            if line == b":1":
                stored(sid, last, check)
                continue
            if line.startswith(b"-NOSCRIPT") or line.startswith(REDIRECT_REPLIES):
                again.append(i)  # not run: send it again the awaited way (loads, retries)
            else:
                message = line[1:].decode(errors="replace")
                results[i] = self._commit.rejection(sid, node, first, message)
        if not again:
            on_done(results)
            return
        self._pipe.reset()  # READONLY and the like: the next connect finds the primary
        task = asyncio.get_running_loop().create_task(
            self._append_again(batches, again, results, on_done)
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
