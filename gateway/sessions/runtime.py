"""One session driven by this node: the event log writer and the turn loop.

A ``SessionRuntime`` exists on the node that holds the session's lease. It owns
the upstream connection, numbers every event (``seq``), logs it, and only then
hands it to the attached client connections (**log, then send**). Appends are
group-committed: events emitted while an append is in flight go out together in
the next one, so a token costs a share of a round trip, not a round trip.

The turn loop (``_run_turn``): user message → upstream → text deltas → parser →
events; on ``execute`` the response is stopped, the tools run, ``<results>`` go
back as a user message and the model continues; ``end`` or the upstream's
``response.done`` closes the turn, and ``metric`` reports the usage. Upstream
loss reruns the step on a fresh connection whose context is rebuilt from
history, after an ``interrupt`` event when the client had seen part of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.sessions.limits import Limits
from gateway.sessions.logwriter import Batch, LogWriter
from gateway.sessions.subscriber import Subscriber
from gateway.store.base import LeaseLost, LogEntry, SeqConflict, StoreUnavailable
from gateway.upstream.base import (
    ResponseDone,
    TextDelta,
    Upstream,
    UpstreamClosed,
    UpstreamError,
    UpstreamFactory,
)
from protocol.assembly import (
    HistoryItem,
    Message,
    assemble,
    encode_history_item,
    results_message,
)
from protocol.calls import ToolCall, ToolResult, decode_call, encode_results, result_payload
from protocol.events import (
    Call,
    Cancelled,
    End,
    Error,
    Event,
    Execute,
    Interrupt,
    Metric,
    Respond,
    Result,
    Think,
    Usage,
    User,
    encode,
)
from protocol.parser import Parser
from protocol.steps import StepRecorder
from tools.base import ToolContext
from tools.executor import Executor

__all__ = ["SessionHost", "SessionRuntime", "SessionServices"]

log = logging.getLogger("gateway.sessions.runtime")


@dataclass(frozen=True, slots=True)
class SessionServices:
    """What every session on a node shares: settings, metrics and the node's workers."""

    config: Config
    metrics: Metrics
    log_writer: LogWriter
    limits: Limits
    executor: Executor
    upstream_factory: UpstreamFactory
    system_prompt: str
    tool_context: Callable[[str], ToolContext]
    store_retry_delay: float = 0.5


class SessionHost(Protocol):
    """How a runtime calls up to the node that drives it: three calls, no node object."""

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` in the background, owned (and cancelled on stop) by the node."""

    def runtime_idle(self, runtime: SessionRuntime) -> None:
        """The runtime may have no client and no turn left: the node may let it go."""

    def runtime_closed(self, runtime: SessionRuntime, *, release: bool) -> None:
        """The runtime stopped: forget it and, if ``release``, free its lease."""


class _StepOutcome:
    """How one model step ended."""

    __slots__ = ("calls", "ended", "error", "malformed", "usage")

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.malformed: str | None = None
        self.ended = False
        self.error: str | None = None
        self.usage: Usage | None = None


class SessionRuntime:
    """The live state of one session on the node that drives it."""

    def __init__(
        self,
        host: SessionHost,
        services: SessionServices,
        sid: str,
        *,
        last_seq: int,
        history: list[HistoryItem],
        usage: Usage,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.host = host
        self.services = services
        self.sid = sid
        self.history = history
        self.usage = usage
        self._clock = clock
        self._seq = last_seq
        self.delivered_seq = last_seq
        self._pending: list[LogEntry] = []
        self._pending_history: list[bytes] = []
        self._marked = False  # waiting in the node's LogWriter for its turn
        self._lost = False  # another node owns the session: write nothing more
        # A batch whose append failed with StoreUnavailable (may have landed).
        self.unsure: Batch | None = None
        self._flushed = asyncio.Event()
        self._flushed.set()
        self.subscribers: set[Subscriber] = set()
        self.upstream: Upstream | None = None
        self.turn: asyncio.Task[None] | None = None
        self._cancel_requested = False
        self._ending = False  # the running turn emitted end and awaits its usage
        self._store_down = False
        self.closed = False

    # ------------------------------------------------------------------ log

    @property
    def last_seq(self) -> int:
        """The seq of the newest event emitted (logged or about to be)."""
        return self._seq

    def emit(self, event: Event) -> None:
        """Number, stamp and queue an event for logging, then delivery."""
        self._seq += 1
        event.seq = self._seq
        event.timestamp = self._clock()
        self._pending.append(LogEntry(self._seq, encode(event)))
        if not self._marked:
            self._mark()

    def persist(self, items: Sequence[HistoryItem]) -> None:
        """Add history items; they are written with the next log append (atomically)."""
        for item in items:
            self.history.append(item)
            self._pending_history.append(encode_history_item(item))
        if not self._marked:
            self._mark()

    def _mark(self) -> None:
        self._marked = True
        self._flushed.clear()
        self.services.log_writer.mark(self)

    async def flushed(self) -> None:
        """Wait until everything emitted so far is logged and delivered."""
        await self._flushed.wait()

    # The LogWriter's side: it takes a batch, writes it, and reports back.

    def take_batch(self) -> Batch | None:
        """What to append now (None: nothing). Called by the node's LogWriter."""
        self._marked = False
        if self._lost:
            return None
        entries, history = self._pending, self._pending_history
        self._pending, self._pending_history = [], []
        if not entries and not history and self.unsure is None:
            self._check_flushed()
            return None
        return entries, history

    def settle_unsure(self, stored_last: int, batch: Batch) -> Batch | None:
        """After a failed append: ``stored_last`` tells whether it landed after all.

        A batch whose append failed in flight may or may not be stored (Redis
        may have run it before the connection broke): never sent twice, never lost.
        """
        unsure, self.unsure = self.unsure, None
        assert unsure is not None
        if unsure[0] and stored_last >= unsure[0][-1].seq:
            self._delivered(unsure[0])  # it landed: just send it
        else:
            batch = (unsure[0] + batch[0], unsure[1] + batch[1])
        if not batch[0] and not batch[1]:
            self._check_flushed()
            return None
        return batch

    def appended(self, batch: Batch, result: BaseException | None) -> None:
        """The LogWriter's report on ``batch``: stored (None) or why not."""
        if result is None:
            if self._store_down:
                self._store_down = False
                log.info("store is back for session %s", self.sid)
            self._delivered(batch[0])
            self._check_flushed()
        elif isinstance(result, LeaseLost | SeqConflict):
            log.warning("session %s: lost ownership while logging: %s", self.sid, result)
            self._lost = True
            self._pending, self._pending_history = [], []
            self._flushed.set()
            self.lose(str(result))
        else:
            # StoreUnavailable (or an unexpected error): hold the batch, in
            # order, and retry; nothing reaches a client before it is logged.
            held = self.unsure  # still unsettled if the log could not be read
            self.unsure = batch if held is None else (held[0] + batch[0], held[1] + batch[1])
            if isinstance(result, StoreUnavailable):
                self._store_unavailable(result)
            else:
                log.error("session %s: appending failed: %r", self.sid, result)
            asyncio.get_running_loop().call_later(self.services.store_retry_delay, self._retry)

    def write_failed(self) -> None:
        """The LogWriter broke on this session's batch (a bug): reload it elsewhere."""
        self._lost = True
        self._flushed.set()
        self.lose("internal error while logging")

    def _retry(self) -> None:
        if not self._marked and not self._lost:
            self._mark()

    def _check_flushed(self) -> None:
        if (
            not self._marked
            and self.unsure is None
            and not self._pending
            and not self._pending_history
        ):
            self._flushed.set()

    def _delivered(self, entries: list[LogEntry]) -> None:
        """Entries are in the log: hand them to the attached clients."""
        if not entries:
            return
        self.delivered_seq = entries[-1].seq
        self.services.metrics.events.inc(len(entries))
        for sub in tuple(self.subscribers):
            sub.deliver(entries)

    def _store_unavailable(self, exc: StoreUnavailable) -> None:
        if self._store_down:
            return
        self._store_down = True
        self.services.metrics.store_errors.inc()
        log.warning("store unavailable for session %s: %s", self.sid, exc)
        self._notify(
            Error(
                code="store",
                content=(
                    "the session store is unavailable; events are held and "
                    "will be delivered when it returns — stay connected"
                ),
                seq=self.delivered_seq,
                timestamp=self._clock(),
            )
        )

    def _notify(self, event: Error) -> None:
        for sub in tuple(self.subscribers):
            sub.notify(event)

    # ------------------------------------------------------------------ subscribers

    def attach(self, sub: Subscriber) -> None:
        self.subscribers.add(sub)

    def detach(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        self.host.runtime_idle(self)

    # ------------------------------------------------------------------ commands

    def start_turn(self, text: str) -> Error | None:
        """Start a turn with the user's text; an ``Error`` reply if one is running."""
        if self.closed:
            return Error(code="internal", content="session is closing; reconnect and resend")
        previous = self.turn
        if previous is not None and not self._ending:
            return Error(
                code="turn_active",
                content="a turn is already running; wait for its end event or send cancel",
            )
        # After the model's <end> the turn only waits for its usage report: a
        # message sent on `end` starts right after it instead of being refused.
        self._cancel_requested = False
        self._ending = False
        self.turn = asyncio.create_task(self._turn_after(previous, text), name=f"turn:{self.sid}")
        return None

    async def _turn_after(self, previous: asyncio.Task[None] | None, text: str) -> None:
        if previous is not None:
            try:
                await asyncio.wait({previous})
            except asyncio.CancelledError:
                # Cancelled (or the node closing) before it started: nothing to undo.
                self._turn_done()
                raise
        await self._turn_main(text)

    def _turn_done(self) -> None:
        if self.turn is asyncio.current_task():
            self.turn = None
        self.host.runtime_idle(self)

    def cancel_turn(self) -> Error | None:
        """Cancel the running turn; an ``Error`` reply if there is none."""
        if self.turn is None or self.turn.done() or self._ending:
            return Error(code="no_turn", content="no turn is running; nothing to cancel")
        if not self._cancel_requested:
            self._cancel_requested = True
            self.turn.cancel()
        return None

    def rerun_interrupted(self, reason: str) -> None:
        """After a takeover: if the last turn was in flight, mark it and rerun it."""
        if not self.history or not isinstance(self.history[-1], User | Result):
            return
        self.emit(Interrupt(content=reason))
        self.turn = asyncio.create_task(self._turn_main(None), name=f"turn:{self.sid}")

    # ------------------------------------------------------------------ turn loop

    async def _turn_main(self, text: str | None) -> None:
        self.services.metrics.turns.inc()
        recorder = StepRecorder()
        try:
            if text is not None:
                user = User(content=text)
                self.emit(user)
                self.persist([User(content=text)])
                message: Message | None = Message(role="user", content=text)
            else:
                message = None  # rerun: the last history item is already the prompt
            await self._run_steps(message, recorder)
        except asyncio.CancelledError:
            if not self._cancel_requested:
                raise
            await self._finish_cancelled(recorder)
        except Exception as exc:
            log.exception("session %s: turn failed", self.sid)
            self.emit(
                Error(
                    code="internal",
                    content=f"the turn failed inside the gateway ({type(exc).__name__}); "
                    "send your message again",
                )
            )
            self.persist(recorder.finish())
            self.emit(End())
            await self._drop_upstream()
        finally:
            self._turn_done()

    async def _finish_cancelled(self, recorder: StepRecorder) -> None:
        self.persist([*recorder.finish(), Cancelled(content="cancelled by the user")])
        self.emit(Cancelled(content="cancelled by the user"))
        # Cancelling leaves the provider's conversation with a partial response;
        # the upstream is dropped and the next turn reopens from history, so the
        # model's context says what the history says. Stopping the provider's
        # response and closing can take seconds: the client does not wait.
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            self.host.spawn(_discard(upstream), f"discard-upstream:{self.sid}")

    async def _drop_upstream(self) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            with contextlib.suppress(Exception):
                await upstream.close()

    async def _open_upstream(self) -> Upstream:
        upstream = self.services.upstream_factory.create()
        await upstream.open(self.services.system_prompt, assemble(self.history))
        self.upstream = upstream
        return upstream

    async def _run_steps(self, message: Message | None, recorder: StepRecorder) -> None:
        """Run model steps until the turn ends (end, failure, cancel, step limit)."""
        cfg = self.services.config
        malformed_in_a_row = 0
        for _ in range(cfg.max_steps):
            outcome = await self._run_step_with_retries(message, recorder)
            if outcome is None:  # upstream unreachable: already reported
                self.persist(recorder.finish())
                self.emit(End())
                return
            metric = self._account(outcome.usage)
            if outcome.error is not None:
                self.emit(Error(code="upstream", content=outcome.error))
                self.persist(recorder.finish())
                self.emit(End())
                self._emit_metric(metric)
                await self._drop_upstream()
                return
            if outcome.calls or outcome.malformed is not None:
                self._emit_metric(metric)
                if outcome.malformed is not None:
                    malformed_in_a_row += 1
                    results = [
                        ToolResult(tool="execute", status="failure", content=outcome.malformed)
                    ]
                    if malformed_in_a_row > 2:
                        self.persist(recorder.finish())
                        self.emit(
                            Error(
                                code="malformed_execute",
                                content="the model wrote three malformed <execute> blocks in a "
                                "row; the turn is stopped — rephrase the request and try again",
                            )
                        )
                        self.emit(End())
                        return
                else:
                    malformed_in_a_row = 0
                    results = await self._run_tools(outcome.calls)
                content = encode_results(results)
                result = Result(content=content, payload=result_payload(results))
                self.emit(result)
                self.persist([*recorder.finish(), Result(content=content, payload=result.payload)])
                message = results_message(content)
                recorder = StepRecorder()
                continue
            # The step answered: the turn is over (end, then the step's metric).
            self.persist(recorder.finish())
            if not outcome.ended:
                self.emit(End())
            self._emit_metric(metric)
            return
        self.persist(recorder.finish())
        self.emit(
            Error(
                code="internal",
                content=f"the turn reached the limit of {cfg.max_steps} model steps and was "
                "stopped; ask for a smaller task",
            )
        )
        self.emit(End())

    def _account(self, usage: Usage | None) -> Metric | None:
        """Add a step's usage to the session's totals; the metric event to emit."""
        if usage is None:
            return None
        self.usage = Usage(
            input=self.usage.input + usage.input, output=self.usage.output + usage.output
        )
        metrics = self.services.metrics
        metrics.tokens.labels("input").inc(usage.input)
        metrics.tokens.labels("output").inc(usage.output)
        self.services.limits.record_usage(self.sid, usage)
        return Metric(step=usage, total=self.usage)

    def _emit_metric(self, metric: Metric | None) -> None:
        if metric is not None:
            self.emit(metric)

    async def _run_tools(self, calls: list[ToolCall]) -> list[ToolResult]:
        services = self.services
        services.metrics.tool_calls.inc(len(calls))
        results = await services.executor.run_batch(calls, services.tool_context(self.sid))
        failures = sum(1 for r in results if r.status != "success")
        if failures:
            services.metrics.tool_failures.inc(failures)
        return results

    async def _run_step_with_retries(
        self, message: Message | None, recorder: StepRecorder
    ) -> _StepOutcome | None:
        """One model step; on upstream loss, reconnect from history and rerun it."""
        retries = self.services.config.upstream_retries
        attempt = 0
        while True:
            try:
                upstream = self.upstream
                if upstream is None:
                    # Fresh connection: history already ends with the prompt message.
                    upstream = await self._open_upstream()
                elif message is not None:
                    await upstream.add_message(message)
                message = None
                return await self._stream_step(upstream, recorder)
            except UpstreamClosed as exc:
                await self._drop_upstream()
                attempt += 1
                self.services.metrics.upstream_errors.inc()
                log.warning(
                    "session %s: upstream lost (%s); %s",
                    self.sid,
                    exc.reason,
                    f"retry {attempt}/{retries}" if attempt <= retries else "giving up",
                )
                if attempt > retries:
                    self.emit(
                        Error(
                            code="upstream",
                            content=f"the model's API is unreachable ({exc.reason}); "
                            "the turn was stopped — send your message again later",
                        )
                    )
                    return None
                if recorder.emitted:
                    self.emit(
                        Interrupt(
                            content=f"upstream connection lost ({exc.reason}); "
                            "this step is being rerun — discard its partial output"
                        )
                    )
                recorder.finish()  # the partial step is not history
                recorder.emitted = False
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))

    async def _stream_step(self, upstream: Upstream, recorder: StepRecorder) -> _StepOutcome:
        """Stream one response through a fresh parser until it is done."""
        outcome = _StepOutcome()
        parser = Parser()
        feed = parser.feed
        emit = self.emit
        add = recorder.add
        metrics = self.services.metrics
        started = time.perf_counter()
        first = True
        await upstream.start_response()
        while True:
            ev = await upstream.recv()
            if type(ev) is TextDelta:
                if first:
                    first = False
                    metrics.first_delta.observe(time.perf_counter() - started)
                if parser.stopped:
                    continue  # the overrun after </execute> or <end> is discarded
                for out in feed(ev.text):
                    self._route(out, outcome, emit, add)
                if parser.stopped:
                    if outcome.ended:
                        self._ending = True  # <end>: the next message may queue now
                    else:
                        # </execute> (or a malformed block): stop the model's turn now.
                        await upstream.cancel_response()
            elif type(ev) is ResponseDone:
                if not parser.stopped:
                    for out in parser.close():
                        self._route(out, outcome, emit, add)
                outcome.usage = ev.usage
                if (
                    ev.status in ("failed", "incomplete")
                    and not outcome.calls
                    and not outcome.ended
                ):
                    outcome.error = f"the model's response {ev.status}" + (
                        f": {ev.detail}" if ev.detail else ""
                    )
                if outcome.calls or outcome.malformed is not None:
                    # The model's own words up to </execute>, without the overrun:
                    # its context keeps its own formatting, and a provider that
                    # already holds exactly this text has nothing to redo.
                    try:
                        await upstream.replace_response(parser.accepted_text)
                    except UpstreamClosed:
                        await self._drop_upstream()
                return outcome
            elif type(ev) is UpstreamError:
                assert isinstance(ev, UpstreamError)
                log.warning("session %s: upstream error %s: %s", self.sid, ev.code, ev.message)
                outcome.error = f"the model's API reported {ev.code}: {ev.message}"
                return outcome

    @staticmethod
    def _route(
        out: Event,
        outcome: _StepOutcome,
        emit: Callable[[Event], None],
        add: Callable[[Event], None],
    ) -> None:
        kind = type(out)
        if kind is Think or kind is Respond:
            add(out)
            emit(out)
        elif kind is Call:
            add(out)
            outcome.calls.append(decode_call(out.content))  # type: ignore[union-attr]
            emit(out)
        elif kind is Execute:
            emit(out)
        elif kind is End:
            outcome.ended = True
            emit(out)
        elif kind is Error:
            assert isinstance(out, Error)
            if out.code == "malformed_execute":
                outcome.malformed = out.content
            emit(out)
        else:
            emit(out)

    # ------------------------------------------------------------------ ownership

    def lose(self, reason: str) -> None:
        """Another node owns the session now: stop everything, tell the clients."""
        if self.closed:
            return
        self.host.spawn(self.close(reason, lost=True), f"lose:{self.sid}")

    async def close(self, reason: str, *, lost: bool = False) -> None:
        """Stop driving the session (lease lost, drain, idle release)."""
        if self.closed:
            return
        self.closed = True
        turn = self.turn
        if turn is not None and not turn.done():
            turn.cancel()
            with contextlib.suppress(BaseException):
                await turn
        if not lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flushed(), 5.0)
        self._lost = True  # whatever could not be written by now is dropped
        # Free the lease before the slow part (closing the upstream socket), so
        # another node can pick the session up at once.
        self.host.runtime_closed(self, release=not lost)
        for sub in tuple(self.subscribers):
            sub.session_lost(reason)
        self.subscribers.clear()
        await self._drop_upstream()


async def _discard(upstream: Upstream) -> None:
    """Stop an abandoned upstream's response (so it stops billing) and close it."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(upstream.cancel_response(), 2.0)
    with contextlib.suppress(Exception):
        await upstream.close()
