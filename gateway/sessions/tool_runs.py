"""A session's tool calls as I/O: the batch the driver awaits, and calls in the background.

The turn machine decides which calls run and when (``RunTools``,
``StartBackground``, ``CancelBackground``); this room runs them on the
node's executor with the session's context, each call under its id (so its
idempotency key), and reports each result as soon as it comes: a batch's
through ``journal`` (the driver logs it at once), a background call's
through ``finished`` (a command for the machine, like a client's answer).
Either waits until everything the session emitted before is logged: a node
that takes over must know every call that may have run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

import msgspec

from gateway.sessions.guard import guard_result
from gateway.sessions.guardrail_check import screened
from gateway.sessions.observer import TurnObserver
from gateway.sessions.recorder import SessionRecorder
from gateway.sessions.session_log import SessionLog
from gateway.sessions.setup import SessionServices, SessionSetup
from gateway.upstream.base import Upstream, UpstreamClosed, UpstreamEvent
from protocol.calls import ToolCall, ToolResult
from protocol.guardrails import RuleSet
from protocol.turn_events import RunTools, SpeechBegan, StartBackground
from tools.executor import CallObserver, Judge

__all__ = ["Gone", "Hearing", "ToolRuns", "hear"]

log = logging.getLogger("gateway.sessions.runtime")

Report = Callable[[str, ToolResult], None]
"""``(call id, result)``, told as each call finishes."""

Hearing = tuple[Upstream, "deque[UpstreamEvent | Gone]", Callable[[SpeechBegan], None]]
"""What ``hear`` reads while a batch runs: the upstream, where events go, and the barge-in."""


class ToolRuns:
    """Runs one session's tool calls (see the module docstring)."""

    def __init__(
        self,
        sid: str,
        services: SessionServices,
        log_: SessionLog,
        observer: TurnObserver,
        setup: Callable[[], SessionSetup],
    ) -> None:
        self.sid = sid
        self.services = services
        self.log = log_
        self.observer = observer
        self._setup = setup
        self._background: dict[str, asyncio.Task[None]] = {}  # call id → its task
        self.recorder: SessionRecorder | None = None  # the session records its tool calls

    @property
    def background_running(self) -> int:
        return len(self._background)

    async def run(
        self, run: RunTools, journal: Report, hearing: Hearing | None = None
    ) -> list[ToolResult]:
        """Run a batch's server calls; their results in order (cut to the batch's share).

        ``hearing``: a voice session's upstream, read meanwhile (``hear``): the
        driver awaits the tools, so without it speech could not barge in until
        a slow tool returned.
        """
        await self.log.flushed()
        metrics = self.services.metrics
        metrics.tools.calls.inc(len(run.calls))
        watcher = None
        if hearing is not None:
            watcher = asyncio.create_task(hear(*hearing), name=f"hear:{self.sid}")
        try:
            results = await self._run(run.calls, run.ids, journal)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(BaseException):
                    await watcher
        failures = sum(1 for r in results if r.status != "success")
        if failures:
            metrics.tools.failures.inc(failures)
        return results

    def start(self, action: StartBackground, finished: Report) -> None:
        """Run background calls, each in its own task; ``finished`` is told each result."""
        for call, call_id in zip(action.calls, action.ids, strict=True):
            if call_id in self._background:
                continue  # already running here (a takeover's journal named it twice)
            task = asyncio.create_task(
                self._one_in_background(call, call_id, finished), name=f"tool:{self.sid}"
            )
            self._background[call_id] = task
            self.services.metrics.tools.background.inc()

    def cancel(self, ids: tuple[str, ...]) -> None:
        """Cancel background calls (their results are logged already, as cancelled)."""
        for call_id in ids:
            task = self._background.get(call_id)
            if task is not None:
                task.cancel()

    async def stop(self) -> None:
        """The session stops here: background calls end (the next node runs them again,
        under the same keys, from the journal)."""
        tasks = list(self._background.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def _one_in_background(self, call: ToolCall, call_id: str, finished: Report) -> None:
        try:
            await self.log.flushed()
            self.services.metrics.tools.calls.inc()
            [result] = await self._run((call,), (call_id,), None)
            if result.status != "success":
                self.services.metrics.tools.failures.inc()
            finished(call_id, result)
        except asyncio.CancelledError:
            self._count(call.name, "cancelled")
            raise
        except Exception:
            log.exception("session %s: background call %s failed", self.sid, call_id)
            finished(
                call_id,
                ToolResult(
                    tool=call.name,
                    status="failure",
                    content="the call failed inside the gateway; try it again",
                ),
            )
        finally:
            self._background.pop(call_id, None)
            self.services.metrics.tools.background.dec()

    async def _run(
        self, calls: tuple[ToolCall, ...], ids: tuple[str, ...], journal: Report | None
    ) -> list[ToolResult]:
        services = self.services
        observe: CallObserver | None = self.observer.tool if self.observer.tracing else None
        if self.recorder is not None:
            observe = self.recorder.observe_tools(observe)

        def finished(index: int, result: ToolResult) -> None:
            self._count(calls[index].name, result.status)
            if journal is not None and index < len(ids):
                journal(ids[index], result)

        results = await services.executor.run_batch(
            list(calls),
            services.tool_context(self.sid),
            observe=observe,
            allowed=self._setup().server_tools,
            ids=ids,
            on_result=finished,
            judge=self._judge(),
        )
        rules = self._setup().guardrails.input
        return [_guarded(rules, r) for r in results] if rules else results

    def _judge(self) -> Judge | None:
        """The session's HTTP checker rules on each result, before anyone sees it."""
        guard = self.log.guard
        if guard is None or not guard.guardrails.input.checks:
            return None

        async def judge(result: ToolResult) -> ToolResult:
            assert guard is not None
            judged: ToolResult = await screened(
                result, guard, self.services.checkers, self.sid, self.log.emit
            )
            return judged

        return judge

    def _count(self, name: str, outcome: str) -> None:
        # Label only the node's own tools: a session's client tools are named by tenants.
        tool = name if name in self.services.executor.registry else "other"
        self.services.metrics.tools.outcomes.labels(tool, outcome).inc()


class Gone:
    """The upstream's loss as the tools' watcher read it: the driver's next read raises it."""

    __slots__ = ("error",)

    def __init__(self, error: UpstreamClosed) -> None:
        self.error = error


async def hear(
    upstream: Upstream, heard: deque[UpstreamEvent | Gone], barge_in: Callable[[SpeechBegan], None]
) -> None:
    """Read a voice session's upstream while its tools run (the driver awaits them):
    speech barges in (cancelling the turn and its tools, as a client ``cancel``
    does); anything else waits in ``heard`` for the driver's next reads, in order."""
    try:
        while True:
            ev = await upstream.recv()
            if type(ev) is SpeechBegan:
                barge_in(ev)
                return
            heard.append(ev)
    except UpstreamClosed as exc:
        heard.append(Gone(exc))  # the driver's next read raises it


def _guarded(rules: RuleSet, result: ToolResult) -> ToolResult:
    """A tool's result as the model gets it: redacted, or withheld (a failure) by a
    ``block`` rule (the logged result is judged at the log: ``gateway.sessions.guard``)."""
    content, hits, withheld = guard_result(rules, result.content)
    if not hits:
        return result
    status = "failure" if withheld else result.status
    return msgspec.structs.replace(result, status=status, content=content)
