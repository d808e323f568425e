"""Runs one ``<execute>`` batch: every call at once, results in call order.

The protocol promises the model that the calls of one block run in parallel,
that results come back in the order of the calls, and that one failed call
never blocks the others. So each call runs in its own task and every way a
call can go wrong (unknown tool, bad args, ``ToolFailure``, timeout, a bug in
the tool, output that is not JSON) becomes a ``failure`` result that says what
to do; ``run_batch`` itself only raises when the batch is cancelled.

A batch is bounded as a whole, not only per call: one ``<execute>`` of 9,000
``read`` calls once produced a 567 MB result. So at most
``max_calls`` calls run (the rest get a failure saying to send them again),
and the results together are cut to ``max_batch_output`` bytes, each call
keeping a fair share (small results whole, the big ones truncated with a note).

The gateway watches each call (a tracing span per tool call) through
``CallObserver``, a plain context-manager factory, so ``tools`` knows nothing
of how calls are observed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from protocol.calls import ToolCall, ToolResult
from protocol.journal import idempotency_key

from .base import DEFAULT_MAX_OUTPUT, ToolContext, ToolFailure
from .done_markers import recall, record
from .output import NotJSON, cap_output, fit_output, output_size
from .registry import AnyTool, InvalidArgs, Registry, UnknownTool

__all__ = ["CallObserver", "Executor", "Judge", "ResultSink"]

log = logging.getLogger(__name__)

CallObserver = Callable[
    [ToolCall, ToolContext], AbstractContextManager[Callable[[ToolResult], None]]
]
"""Entered around each call that runs (with the call's context: its id and idempotency
key); the block gets a callable that is handed the call's result (before truncation to
the batch's share). An exception escaping the call (a cancel) leaves the block with it."""

ResultSink = Callable[[int, ToolResult], None]
Judge = Callable[[ToolResult], Awaitable[ToolResult]]
"""A result as the session lets it on (an awaited guardrail check), before anyone sees it."""
"""Told each call's result as soon as it finishes (its index in the batch): the session
logs it at once, so a node that takes over reruns only the calls without one."""

_YIELD_EVERY = 16
"""Results measured or cut between two yields to the event loop."""


class Executor:
    """Runs tool calls against a registry with a timeout and an output cap per tool.

    ``timeout`` and ``max_output`` (bytes) apply to every tool unless
    ``per_tool_timeout`` / ``per_tool_max_output`` name it. ``max_calls`` is
    how many calls of one batch run; ``max_batch_output`` bounds the bytes of
    all of one batch's results together.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        timeout: float = 30.0,
        max_output: int = DEFAULT_MAX_OUTPUT,
        per_tool_timeout: Mapping[str, float] | None = None,
        per_tool_max_output: Mapping[str, int] | None = None,
        max_calls: int = 64,
        max_batch_output: int = 1_048_576,
    ) -> None:
        if timeout <= 0 or max_output <= 0 or max_calls <= 0 or max_batch_output <= 0:
            raise ValueError("timeout, max_output, max_calls and max_batch_output must be positive")
        self.registry = registry
        self.timeout = timeout
        self.max_output = max_output
        self.per_tool_timeout = dict(per_tool_timeout or {})
        self.per_tool_max_output = dict(per_tool_max_output or {})
        self.max_calls = max_calls
        self.max_batch_output = max_batch_output

    def timeout_for(self, name: str) -> float:
        return self.per_tool_timeout.get(name, self.timeout)

    def max_output_for(self, name: str) -> int:
        return self.per_tool_max_output.get(name, self.max_output)

    async def run_batch(
        self,
        calls: Sequence[ToolCall],
        ctx: ToolContext,
        *,
        observe: CallObserver | None = None,
        allowed: frozenset[str] | None = None,
        ids: Sequence[str] = (),
        on_result: ResultSink | None = None,
        judge: Judge | None = None,
    ) -> list[ToolResult]:
        """Run ``calls`` concurrently; one result per call, in call order.

        ``observe`` (optional) is entered around each call that runs.
        ``allowed``: the tools this session may use (None: all); a call to
        another fails in its place, naming the ones it may use. ``ids``: the
        calls' ids in their session (parallel to ``calls``), from which each
        call's idempotency key derives (``ToolContext.idempotency_key``);
        ``on_result`` is told each call's result as it finishes, after ``judge``
        (the session's guardrail checkers) has had it.

        Calls past ``max_calls`` do not run: each gets a failure naming the
        limit. If the caller is cancelled (the user cancelled the turn), every
        running tool is cancelled and awaited, so a tool's cleanup (killing a
        subprocess) has finished when ``CancelledError`` reaches the caller.
        """
        admitted, refused = calls[: self.max_calls], calls[self.max_calls :]
        tasks = [
            asyncio.create_task(
                self._run_one(
                    index, call, _call_context(ctx, ids, index), observe, on_result, judge
                ),
                name=f"tool {call.name}",
            )
            if allowed is None or call.name in allowed
            else _not_allowed(call, allowed)
            for index, call in enumerate(admitted)
        ]
        try:
            results: list[ToolResult] = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                if isinstance(task, asyncio.Task):
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        results += [
            _failure(
                call,
                f"not run: one <execute> block may hold at most {self.max_calls} calls and "
                f"this one held {len(calls)}; the first {self.max_calls} ran. Send the rest "
                "in a later <execute> block",
            )
            for call in refused
        ]
        return await self._fit_batch(results)

    async def _fit_batch(self, results: list[ToolResult]) -> list[ToolResult]:
        """``results`` cut to ``max_batch_output`` bytes in all, by fair shares.

        Water-filling: results at or under an equal share of what is left stay
        whole, so one huge read does not erase twenty small answers; the big
        ones share the rest equally. Yields to the loop every few results:
        measuring and cutting a large batch is CPU work other sessions wait for.
        """
        sizes: list[int] = []
        for i, result in enumerate(results):
            sizes.append(output_size(result.content))
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
        if sum(sizes) <= self.max_batch_output:
            return results
        left, share = self.max_batch_output, 0
        order = sorted(range(len(results)), key=sizes.__getitem__)
        for done, i in enumerate(order):
            share = left // (len(order) - done)
            if sizes[i] > share:
                break
            left -= sizes[i]
        fitted = list(results)
        for n, i in enumerate(i for i in order if sizes[i] > share):
            content = cap_output(results[i].content, max(share, 1))
            note = (
                f"\n[this <execute> block's results are limited to {self.max_batch_output:,} "
                "bytes in all; ask for less per call or use fewer calls]"
            )
            fitted[i] = ToolResult(
                tool=results[i].tool, status=results[i].status, content=content + note
            )
            if n % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
        return fitted

    async def _run_one(
        self,
        index: int,
        call: ToolCall,
        ctx: ToolContext,
        observe: CallObserver | None,
        on_result: ResultSink | None,
        judge: Judge | None = None,
    ) -> ToolResult:
        if observe is None:
            result = await self.run_call(call, ctx)
        else:
            with observe(call, ctx) as seen:
                result = await self.run_call(call, ctx)
                seen(result)
        if judge is not None:
            result = await judge(result)
        if on_result is not None:
            on_result(index, result)
        return result

    async def run_call(self, call: ToolCall, ctx: ToolContext) -> ToolResult:
        """Run one call; never raises except ``CancelledError`` when cancelled."""
        try:
            tool, args = self.registry.bind(call)
        except (UnknownTool, InvalidArgs) as exc:
            return _failure(call, str(exc))

        timeout = self.timeout_for(tool.name)
        max_output = self.max_output_for(tool.name)
        if ctx.max_output != max_output:
            ctx = dataclasses.replace(ctx, max_output=max_output)
        journaled = getattr(tool, "journaled", False) and bool(ctx.idempotency_key)
        if journaled:
            done = await asyncio.to_thread(recall, ctx.workspace, ctx.idempotency_key)
            if done is not None:
                return done  # a rerun of a call whose first run finished: not done twice
        result = await self._run_bound(tool, args, call, ctx, timeout, max_output)
        secrets = getattr(tool, "secrets", None)
        if secrets:
            # Before anyone sees it: the client, the log, history, recordings (tools.secrets).
            result = secrets.scrub_result(result)
        if journaled and result.status == "success":
            await asyncio.to_thread(record, ctx.workspace, ctx.idempotency_key, result)
        return result

    async def _run_bound(
        self,
        tool: AnyTool,
        args: Any,
        call: ToolCall,
        ctx: ToolContext,
        timeout: float,
        max_output: int,
    ) -> ToolResult:
        try:
            async with asyncio.timeout(timeout):
                content = await tool.run(args, ctx)
        except ToolFailure as exc:
            return _failure(call, exc.message)
        except TimeoutError:
            return _failure(
                call,
                f"{tool.name!r} timed out after {timeout:g}s and was stopped; "
                "ask for less at once (a narrower path, pattern or range) or split the work",
            )
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled: the user cancelled the batch
            # The tool cancelled itself (e.g. awaited something that was cancelled).
            return _failure(call, f"{tool.name!r} was cancelled before it finished; try again")
        except Exception as exc:
            log.exception(
                "tool %r raised in session %s (call args %.500r)",
                tool.name,
                ctx.session_id,
                call.args,
            )
            return _failure(
                call,
                f"{tool.name!r} failed with an unexpected error: {type(exc).__name__}: {exc}. "
                "This is a fault in the tool, not in your call; try another way to get the result",
            )

        secrets = getattr(tool, "secrets", None)
        try:
            capped = fit_output(content, max_output, secrets.scrub if secrets else None)
        except NotJSON as exc:
            log.error("tool %r returned a value that is not JSON: %s", tool.name, exc)
            return _failure(
                call,
                f"{tool.name!r} returned output that could not be encoded as JSON ({exc}). "
                "This is a fault in the tool; try another way to get the result",
            )
        return ToolResult(tool=call.name, status="success", content=capped)


def _call_context(ctx: ToolContext, ids: Sequence[str], index: int) -> ToolContext:
    """``ctx`` for call ``index``: its id and idempotency key (unchanged without ids)."""
    if index >= len(ids):
        return ctx
    call_id = ids[index]
    return dataclasses.replace(
        ctx, call_id=call_id, idempotency_key=idempotency_key(ctx.session_id, call_id)
    )


def _failure(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(tool=call.name, status="failure", content=message)


def _not_allowed(call: ToolCall, allowed: frozenset[str]) -> asyncio.Future[ToolResult]:
    """The failure of a call to a tool the session may not use, as a done future."""
    names = ", ".join(sorted(allowed)) or "none"
    done: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
    done.set_result(
        _failure(
            call,
            f"the tool {call.name!r} is not available in this session; its tools are: {names}",
        )
    )
    return done
