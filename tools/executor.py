"""Runs one ``<execute>`` batch: every call at once, results in call order.

The protocol promises the model that the calls of one block run in parallel,
that results come back in the order of the calls, and that one failed call
never blocks the others. So each call runs in its own task and every way a
call can go wrong (unknown tool, bad args, ``ToolFailure``, timeout, a bug in
the tool, output that is not JSON) becomes a ``failure`` result that says what
to do; ``run_batch`` itself only raises when the batch is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from protocol.calls import ToolCall, ToolResult

from .base import ToolContext, ToolFailure
from .output import NotJSON, cap_output
from .registry import InvalidArgs, Registry, UnknownTool

__all__ = ["Executor"]

log = logging.getLogger(__name__)


class Executor:
    """Runs tool calls against a registry with a timeout and an output cap per tool.

    ``timeout`` and ``max_output`` (bytes) apply to every tool unless
    ``per_tool_timeout`` / ``per_tool_max_output`` name it.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        timeout: float = 30.0,
        max_output: int = 64_000,
        per_tool_timeout: Mapping[str, float] | None = None,
        per_tool_max_output: Mapping[str, int] | None = None,
    ) -> None:
        if timeout <= 0 or max_output <= 0:
            raise ValueError("timeout and max_output must be positive")
        self.registry = registry
        self.timeout = timeout
        self.max_output = max_output
        self.per_tool_timeout = dict(per_tool_timeout or {})
        self.per_tool_max_output = dict(per_tool_max_output or {})

    def timeout_for(self, name: str) -> float:
        return self.per_tool_timeout.get(name, self.timeout)

    def max_output_for(self, name: str) -> int:
        return self.per_tool_max_output.get(name, self.max_output)

    async def run_batch(self, calls: Sequence[ToolCall], ctx: ToolContext) -> list[ToolResult]:
        """Run ``calls`` concurrently; one result per call, in call order.

        If the caller is cancelled (the user cancelled the turn), every running
        tool is cancelled and awaited, so a tool's cleanup (killing a
        subprocess) has finished when ``CancelledError`` reaches the caller.
        """
        tasks = [
            asyncio.create_task(self.run_call(call, ctx), name=f"tool {call.name}")
            for call in calls
        ]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def run_call(self, call: ToolCall, ctx: ToolContext) -> ToolResult:
        """Run one call; never raises except ``CancelledError`` when cancelled."""
        try:
            tool, args = self.registry.bind(call)
        except (UnknownTool, InvalidArgs) as exc:
            return _failure(call, str(exc))

        timeout = self.timeout_for(tool.name)
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

        try:
            capped = cap_output(content, self.max_output_for(tool.name))
        except NotJSON as exc:
            log.error("tool %r returned a value that is not JSON: %s", tool.name, exc)
            return _failure(
                call,
                f"{tool.name!r} returned output that could not be encoded as JSON ({exc}). "
                "This is a fault in the tool; try another way to get the result",
            )
        return ToolResult(tool=call.name, status="success", content=capped)


def _failure(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(tool=call.name, status="failure", content=message)
