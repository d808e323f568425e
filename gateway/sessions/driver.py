"""The turn driver: performs the turn machine's actions, feeds it what I/O brings.

``protocol.turn.TurnMachine`` decides everything about a turn; this is its
I/O shell. Commands (a user message, a cancel, a client's tool result, a
commit, a rerun after a takeover) feed the machine and hand its actions to
the driver (``command``), one task per running turn, which performs them in
order — events and history at once, upstream requests, tools and backoffs
awaited — and feeds the machine what the upstream, the tools and the
timers bring. A cancel interrupts the driver's current await; the actions
it had not performed yet are superseded.

**Client-side tools**: while the machine waits for a client's result
(``awaits_client``), the driver waits for a command to bring one, up to
``client_tool_timeout`` seconds after the batch began (server calls of the
same batch run meanwhile), then feeds ``ClientTimeout``. A voice session
keeps reading its upstream meanwhile, so the user's speech still barges in.

**Voice**: a session that streams audio keeps its upstream connection
open between turns, and the driver keeps running while a client is
attached (``listening``), reading the upstream's voice events when no
turn runs too: the provider's VAD starts turns by itself.

**The hot path**: while the driver waits for a response's next delta, the
adapter hands deltas to ``_text_now`` in its read callback (no task resumed
per token); a marker that asks the session to act wakes the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, Protocol

import msgspec

from gateway.sessions.observer import TurnObserver
from gateway.sessions.session_log import SessionLog
from gateway.sessions.setup import SessionServices, SessionSetup
from gateway.sessions.tool_runs import Gone, ToolRuns
from gateway.sessions.upstream_link import OpenRequest, UpstreamLink
from gateway.sessions.voice import VoiceInput
from gateway.upstream.base import (
    AudioDelta,
    ModelOptions,
    Resumable,
    Upstream,
    UpstreamClosed,
    UpstreamError,
    UpstreamEvent,
    VoiceConfig,
    Woken,
)
from protocol.assembly import Message
from protocol.audio import OUTPUT_RATE, audio_frame
from protocol.calls import ToolResult
from protocol.events import Approval, Error, Interrupt, Metric, Usage
from protocol.turn import TurnMachine, TurnState
from protocol.turn_events import (
    EVENT_TYPES,
    Account,
    Action,
    ApprovalTimeout,
    AwaitApproval,
    AwaitClient,
    BackgroundDone,
    Backoff,
    CallDone,
    CancelBackground,
    ClientTimeout,
    CommitAudio,
    DropUpstream,
    Persist,
    Refuse,
    ReplaceResponse,
    Request,
    ResponseDone,
    RetryNow,
    RunTools,
    ShellFailed,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    StartBackground,
    StopResponse,
    TextDelta,
    Thought,
    ToolsDone,
    TurnStarted,
    UpstreamFailed,
    UpstreamLost,
    UpstreamStalled,
)

__all__ = ["DrivenSession", "TurnDriver"]

log = logging.getLogger("gateway.sessions.runtime")

# The actions the driver awaits; a cancel supersedes those not yet performed.
_AWAITED: Final = frozenset(
    {
        Request,
        CommitAudio,
        StopResponse,
        ReplaceResponse,
        RunTools,
        AwaitClient,
        AwaitApproval,
        Backoff,
    }
)
_RETRY_NOW: Final = RetryNow()
# How long a cancelled response may take to report its end (and usage) before
# the turn closes with an estimate: OpenAI answers a response.cancel within a
# round trip; the Gemini adapter bounds its own wait by its cancel_grace.
_CANCEL_REPORT_WAIT: Final = 5.0
# What clients are told of upstream failures. The real reason goes to the log
# only: it may carry the upstream URL (with a key in its query string) or the
# provider's own text (account ids, internal hosts).
_LOST_REASON: Final = "connection failed"
_FAILED_MESSAGE: Final = (
    "the request failed at the provider; send your message again, and if it keeps "
    "failing tell the operator (the gateway's log has the details)"
)
_LISTEN_UNREACHABLE: Final = (
    "the model's API cannot be reached: audio sent now is not heard; "
    "the gateway keeps trying and the session goes on when it answers"
)
# Provider codes and reasons that are plain identifiers (rate_limit_exceeded,
# max_output_tokens) help the client and are passed on; other text is not.
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class DrivenSession(Protocol):
    """What the driver reads of the session it drives (the runtime)."""

    @property
    def setup(self) -> SessionSetup: ...

    @property
    def voice(self) -> VoiceConfig | None:
        """The audio the session's clients send and hear (None: text)."""

    @property
    def listening(self) -> bool:
        """The driver keeps reading the upstream between turns."""

    @property
    def closed(self) -> bool: ...

    def speaking_voice(self) -> VoiceConfig | None:
        """The voice to open a model that only speaks with (its transcript is the answer)."""

    def driver_stopped(self) -> None:
        """No turn runs any more (the node may let the session go)."""


class TurnDriver:
    """Performs one session's turns (see the module docstring)."""

    def __init__(
        self,
        session: DrivenSession,
        machine: TurnMachine,
        log_: SessionLog,
        link: UpstreamLink,
        voice_in: VoiceInput,
        services: SessionServices,
        observer: TurnObserver,
        *,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        remember: Callable[[dict[str, str]], Coroutine[Any, Any, None]],
    ) -> None:
        self.session = session
        self.machine = machine
        self.log = log_
        self.link = link
        self.voice_in = voice_in
        self.services = services
        self.observer = observer
        self._spawn = spawn
        self._remember = remember
        self.sid = log_.sid
        self.tools = ToolRuns(self.sid, services, log_, observer, lambda: session.setup)
        self._approval_asked: dict[str, float] = {}  # call id → when it began to wait
        self._wake = asyncio.Event()  # a command queued actions for the driver
        self._client_deadline = 0.0  # loop time when the client-side calls time out
        self._approval_deadline = 0.0  # loop time when undecided approvals are denied
        self.task: asyncio.Task[None] | None = None
        self._todo: deque[Action] = deque()  # actions the driver performs next, in order
        self._driving = False  # the driver task has started running
        self._interrupted = False  # a cancel interrupted the driver's await
        self._in_upstream_call = False  # the driver awaits a request to the upstream
        self._requested_at: float | None = None  # when the last response was requested
        link.silence.seconds = services.config.upstream_stall_timeout
        # The upstream handing deltas to ``_text_now``, and what that failed with.
        self._streaming_to: Upstream | None = None
        self._text_failure: Exception | None = None
        # The driver reads the upstream with nothing else to do (no turn, or a wait for
        # client results): a command interrupts that read (``wake``).
        self._listening_idle = False
        # Upstream events read while tools ran (``tool_runs.hear``), for the
        # driver's next reads, in order.
        self._heard: deque[UpstreamEvent | Gone] = deque()

    # ------------------------------------------------------------------ commands

    def command(self, actions: Sequence[Action], *, interrupt: bool) -> Error | None:
        """Hand a command's actions to the driver (starting it if no turn runs)."""
        if not actions:
            return None  # queued behind the closing turn
        first = actions[0]
        if type(first) is Refuse:
            return first.error
        driver = self.task
        if driver is None or driver.done():
            self._todo = deque(actions)
            self.task = asyncio.create_task(self._drive(), name=f"turn:{self.sid}")
        elif interrupt:
            # The awaits the driver had not performed yet are superseded (its
            # events and history items stay: they are decided); its current
            # await is interrupted and it performs these actions next.
            kept = [action for action in self._todo if type(action) not in _AWAITED]
            self._todo = deque([*kept, *actions])
            if self._driving and not self._interrupted:
                self._interrupted = True
                self._stop_text_now()
                driver.cancel()
        else:
            self._todo.extend(actions)
            self._wake.set()
            self.wake()
        return None

    def listen(self) -> None:
        """Make sure the driver runs (and reads the upstream between turns) if it should."""
        if not self.session.listening:
            return
        driver = self.task
        if driver is None or driver.done():
            self._todo = deque()
            self.task = asyncio.create_task(self._drive(), name=f"turn:{self.sid}")
        else:
            self.wake()

    def wake(self) -> None:
        """Interrupt the driver's between-turns read, so it looks at its work again."""
        driver = self.task
        if (
            self._listening_idle
            and driver is not None
            and self._driving
            and not self._interrupted
            and not driver.done()
        ):
            self._interrupted = True
            self._stop_text_now()
            driver.cancel()

    async def stop(self) -> None:
        """Cancel the running turn and the background calls, and wait for them to end."""
        driver = self.task
        if driver is not None and not driver.done():
            self._stop_text_now()
            driver.cancel()
            with contextlib.suppress(BaseException):
                await driver
        self._todo.clear()
        await self.tools.stop()

    # ------------------------------------------------------------------ the drive loop

    async def _drive(self) -> None:
        """Perform the machine's actions and feed it what the I/O brings, until no turn runs."""
        machine = self.machine
        session = self.session
        task = asyncio.current_task()
        assert task is not None
        self._driving = True
        try:
            while True:
                try:
                    await self._perform_pending()
                    if machine.idle:
                        self.link.turn_ended()
                    if machine.idle and not self._todo and not session.listening:
                        return
                    if machine.awaits_upstream or (session.listening and not self._todo):
                        await self._pump_upstream()
                    elif machine.awaits_client or machine.awaits_approval:
                        await self._await_answers()
                except asyncio.CancelledError:
                    if not self._interrupted or session.closed:
                        raise
                    # A cancel: the superseded action may have left the upstream
                    # mid-request, in a state nobody knows: let it go.
                    self._interrupted = False
                    task.uncancel()
                    if self._in_upstream_call:
                        self._in_upstream_call = False
                        self.drop_upstream(stop=True)
                except UpstreamClosed as exc:
                    idle = machine.idle
                    self._upstream_gone(exc.reason, retryable=exc.retryable)
                    if idle and session.listening and not self._todo:
                        await self._listen_later()
                except Exception as exc:
                    log.exception("session %s: turn failed", self.sid)
                    self._todo = deque(machine.feed(ShellFailed(type(exc).__name__)))
        finally:
            self.observer.turn_ended()
            self._driving = False
            self._interrupted = False
            self._listening_idle = False
            if self.task is task:
                self.task = None
            session.driver_stopped()

    async def _await_answers(self) -> None:
        """Wait for a command (a client's result, an approve, a cancel) or the deadline of
        the client-side calls or of the approvals, whichever comes first."""
        self._wake.clear()
        if self._todo:
            return
        remaining = self._answer_deadline() - asyncio.get_running_loop().time()
        if remaining > 0:
            try:
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
                return
            except TimeoutError:
                pass
        self._answers_timed_out()

    def _answer_deadline(self) -> float:
        machine = self.machine
        deadlines = []
        if machine.awaits_client:
            deadlines.append(self._client_deadline)
        if machine.awaits_approval:
            deadlines.append(self._approval_deadline)
        return min(deadlines, default=0.0)

    def _answers_timed_out(self) -> None:
        now = asyncio.get_running_loop().time()
        if self.machine.awaits_client and now >= self._client_deadline:
            self._client_timed_out()
        if self.machine.awaits_approval and now >= self._approval_deadline:
            seconds = self.services.config.approval_timeout
            log.info("session %s: approvals undecided after %gs: denied", self.sid, seconds)
            self._todo.extend(self.machine.feed(ApprovalTimeout(seconds)))

    def _client_timed_out(self) -> None:
        seconds = self.services.config.client_tool_timeout
        log.info("session %s: client-side calls unanswered after %gs", self.sid, seconds)
        self._todo.extend(self.machine.feed(ClientTimeout(seconds)))

    def _upstream_gone(self, reason: str, *, retryable: bool = True) -> None:
        self.observer.step_done(None, error=reason)
        self.drop_upstream(stop=False)
        self.services.metrics.upstream_errors.inc()
        log.warning("session %s: upstream lost (%s)", self.sid, reason)
        fatal = not retryable
        fallback = self._fallback(fatal=fatal)
        lost = UpstreamLost(_LOST_REASON, fatal=fatal, fallback=fallback)
        self._todo = deque(self.machine.feed(lost))

    async def _listen_later(self) -> None:
        """Wait before a listening voice session opens its upstream again.

        The first failure in a row is told to the client (``error`` code
        ``upstream``); the wait doubles up to a cap and ends early when a
        command comes (``wake`` cancels it)."""
        first, delay = self.voice_in.listen_failed()
        if first:
            self.log.emit(Error(code="upstream", content=_LISTEN_UNREACHABLE))
        self._listening_idle = True
        try:
            await asyncio.sleep(delay)
        finally:
            self._listening_idle = False
            self.voice_in.listen_again()

    def _fallback(self, *, fatal: bool) -> str:
        """Report the failure to the session's providers; the one to use next if it changes."""
        factory = self.session.setup.upstream_factory
        provider = self.link.provider or factory.provider
        chosen = factory.failed(provider, fatal=fatal)
        if chosen == provider:
            return ""
        log.warning("session %s: falling back from %s to %s", self.sid, provider, chosen)
        return chosen

    # ------------------------------------------------------------------ actions

    async def _perform_pending(self) -> None:
        """Perform queued actions in order; events and history first, awaits last."""
        todo = self._todo
        emit = self.log.emit
        while todo:
            action = todo.popleft()
            kind = type(action)
            if kind in EVENT_TYPES:
                if kind is Metric:
                    self.observer.fill(action)  # type: ignore[arg-type]
                elif kind is Error:
                    self.observer.turn_failed(action.code)  # type: ignore[union-attr]
                elif kind is Approval:
                    self._approval_decided(action)  # type: ignore[arg-type]
                elif kind is Interrupt and self.link.upstream is None:
                    await self._reopen_for(action, todo[0] if todo else None)  # type: ignore[arg-type]
                    continue
                emit(action)  # type: ignore[arg-type]
            elif kind is Persist:
                self.log.persist(action.items)  # type: ignore[union-attr]
            elif kind is Account:
                self._account(action.usage)  # type: ignore[union-attr]
            elif kind is TurnStarted:
                self.services.metrics.turns.inc()
                self._turn_started()
            elif kind is DropUpstream:
                self.drop_upstream(stop=action.stop)  # type: ignore[union-attr]
            elif kind is AwaitApproval:
                loop_time = asyncio.get_running_loop().time()
                self._approval_deadline = loop_time + self.services.config.approval_timeout
                for call_id in action.ids:  # type: ignore[union-attr]
                    self._approval_asked.setdefault(call_id, loop_time)
            elif kind is StartBackground:
                self.tools.start(action, self._background_finished)  # type: ignore[arg-type]
            elif kind is CancelBackground:
                self.tools.cancel(action.ids)  # type: ignore[union-attr]
            elif kind is AwaitClient:
                loop_time = asyncio.get_running_loop().time()
                self._client_deadline = loop_time + self.services.config.client_tool_timeout
                self.services.metrics.tools.calls.inc(len(action.ids))  # type: ignore[union-attr]
            elif kind is Request:
                await self._request(action.message, action.outputs)  # type: ignore[union-attr]
            elif kind is CommitAudio:
                upstream = self.link.upstream
                if upstream is None:
                    raise UpstreamClosed("the connection that heard the speech is gone")
                self._in_upstream_call = True
                self._requested_at = time.perf_counter()
                await upstream.commit_audio()
                self._in_upstream_call = False
            elif kind is StopResponse:
                upstream = self.link.upstream
                if upstream is None:
                    raise UpstreamClosed("no upstream connection to stop a response on")
                self._in_upstream_call = True
                await upstream.cancel_response()
                self._in_upstream_call = False
            elif kind is ReplaceResponse:
                await self._replace(action)  # type: ignore[arg-type]
            elif kind is RunTools:
                # The calls are in the log (and history) before any runs: a node
                # that takes over knows each one that may have run, and its key.
                results = await self._run_tools_hearing(action)  # type: ignore[arg-type]
                todo.extend(self.machine.feed(ToolsDone(tuple(results))))
            elif kind is Backoff:
                log.info(
                    "session %s: retrying the step (%d/%d)",
                    self.sid,
                    action.attempt,  # type: ignore[union-attr]
                    self.services.config.upstream_retries,
                )
                await asyncio.sleep(action.delay)  # type: ignore[union-attr]
                todo.extend(self.machine.feed(_RETRY_NOW))
            else:  # Refuse: only commands get it, and they answer it themselves
                log.warning("session %s: unexpected action %r", self.sid, action)

    async def _reopen_for(self, interrupt: Interrupt, then: Action | None) -> None:
        """An ``interrupt`` whose rerun opens a new connection says what the model keeps
        (``context``). Rerun at once (a takeover): the connection is opened first and
        the event says what happened; after a backoff (a lost connection): what will
        happen, by the resumption handle the session holds. Sent whether or not the
        open works (its failure is the rerun's own, reported as ever)."""
        try:
            if type(then) is Request:
                # The rerun's request goes first: audio the user sent meanwhile then
                # reaches the provider as live speech (it barges in), not before it.
                upstream = await self._open_upstream(flush=False)
                interrupt.context = "resumed" if upstream.resumed else "rebuilt"
            else:
                chosen = self.session.setup.upstream_factory.choose()
                interrupt.context = "resumed" if self.link.resume_for(chosen) else "rebuilt"
        finally:
            self.log.emit(interrupt)

    def _turn_started(self) -> None:
        traceparent = self.observer.turn_started()
        if traceparent:
            # Kept with the session so a node that takes it over links its rerun here.
            self._spawn(self._remember({"traceparent": traceparent}), f"meta:{self.sid}")

    async def _request(
        self, message: Message | None, outputs: Sequence[tuple[str, str]] = ()
    ) -> None:
        self._in_upstream_call = True
        self.observer.step_started()
        upstream = self.link.upstream
        setup = self.session.setup
        if upstream is not None and self.link.opened_with is not setup:
            # Configured since it was opened: reopen with the new prompt and provider.
            self.drop_upstream(stop=False)
            upstream = None
        if upstream is None:
            # Fresh connection: history already ends with the prompt message.
            upstream = await self._open_upstream(flush=False)
            self._in_upstream_call = True
        elif message is not None:
            await upstream.add_message(message)
        else:
            for call_id, output in outputs:
                await upstream.send_function_output(call_id, output)
        self._requested_at = time.perf_counter()
        await upstream.start_response()
        await self.voice_in.flush(upstream)  # speech held meanwhile barges in on it
        self._in_upstream_call = False

    async def _open_upstream(self, *, flush: bool = True) -> Upstream:
        """The open upstream, or a fresh one whose context is rebuilt from history;
        without ``flush``, audio held while it opened waits for the caller's request."""
        upstream = self.link.upstream
        if upstream is not None:
            return upstream
        self._in_upstream_call = True
        session = self.session
        setup = session.setup
        config = setup.config
        request = OpenRequest(
            setup.upstream_factory,
            setup.system_prompt,
            setup.instructions,
            session.voice,
            session.speaking_voice,
            ModelOptions(truncation=config.truncation, reasoning_effort=config.reasoning_effort),
        )
        upstream, voiced = await self.link.open(request, setup)
        self.machine.voice = voiced
        if not flush:
            self.voice_in.hold_until_flush()
            self._in_upstream_call = False
            return upstream  # the request's sender flushes (or the pump, if it was superseded)
        try:
            await self.voice_in.flush(upstream)
        except BaseException:
            self.link.upstream = None
            self.link.discard(upstream)
            raise
        self._in_upstream_call = False
        return upstream

    async def _replace(self, action: ReplaceResponse) -> None:
        upstream = self.link.upstream
        if upstream is None:
            return  # the next request reopens from history, which says the same
        self._in_upstream_call = True
        try:
            await upstream.replace_response(action.text, heard_ms=action.heard_ms)
        except UpstreamClosed:
            self.drop_upstream(stop=False)
        self._in_upstream_call = False

    def drop_upstream(self, *, stop: bool) -> None:
        """Let the upstream go (closed in the background); its events read early go too."""
        self._heard.clear()
        self.link.drop(stop=stop)

    # ------------------------------------------------------------------ the upstream's events

    async def _pump_upstream(self) -> None:
        """Feed the upstream's events to the machine until one calls for an action."""
        session = self.session
        upstream = self.link.upstream
        if upstream is None:
            if not session.listening:
                raise UpstreamClosed("no upstream connection")
            upstream = await self._open_upstream()
        elif self.voice_in.unflushed:
            await self.voice_in.flush(upstream)  # the request it waited for was superseded
        machine = self.machine
        text = machine.text
        emit = self.log.emit
        todo = self._todo
        first = self._requested_at is not None
        inline = upstream.stream_text_to(None)
        heard = self._heard
        ev: UpstreamEvent | None
        while machine.awaits_upstream or session.listening:
            if todo:
                return  # a command came while the connection was opening
            if heard:
                read = heard.popleft()
                if isinstance(read, Gone):
                    raise read.error
                ev = read
            elif machine.idle:
                self._listening_idle = True
                try:
                    ev = await upstream.recv()
                finally:
                    self._listening_idle = False
            elif machine.awaits_client or machine.awaits_approval:
                # Listening while the client works or the user decides: a command interrupts.
                remaining = self._answer_deadline() - asyncio.get_running_loop().time()
                self._listening_idle = True
                try:
                    async with asyncio.timeout(max(remaining, 0.0)):
                        ev = await upstream.recv()
                except TimeoutError:
                    self._answers_timed_out()
                    return
                finally:
                    self._listening_idle = False
            elif machine.state is TurnState.CANCELLING:
                try:
                    async with asyncio.timeout(_CANCEL_REPORT_WAIT):
                        ev = await upstream.recv()
                except TimeoutError:
                    raise UpstreamClosed(
                        f"no end of the cancelled response within {_CANCEL_REPORT_WAIT:g}s"
                    ) from None
            elif inline:
                # Deltas that arrive while this waits are handled in the read
                # callback (``_text_now``): no task resume per token.
                upstream.stream_text_to(self._text_now)
                self._streaming_to = upstream
                try:
                    ev = await self.link.silence.recv(upstream)
                finally:
                    self._stop_text_now()
            else:
                ev = await self.link.silence.recv(upstream)
            if ev is None:  # the provider went silent mid-response
                todo.extend(self._stalled())
                return
            kind = type(ev)
            if kind is TextDelta:
                if first:
                    first = False
                    self._first_delta()
                for action in text(ev.text):  # type: ignore[union-attr]
                    if type(action) is StopResponse:
                        todo.append(action)
                    else:
                        emit(action)  # type: ignore[arg-type]
                if todo:
                    return
            elif kind is Woken:
                failure, self._text_failure = self._text_failure, None
                if failure is not None:
                    raise failure
                if todo:
                    return
                first = self._requested_at is not None
            elif kind is ResponseDone:
                todo.extend(self._response_done(ev))  # type: ignore[arg-type]
                return
            elif kind is UpstreamError:
                todo.extend(self._upstream_error(ev))  # type: ignore[arg-type]
                if todo:
                    return
            elif kind is AudioDelta:
                self._audio_out(ev.pcm16)  # type: ignore[union-attr]
            elif kind is Spoken or kind is Thought:
                if first and kind is Spoken:
                    first = False
                    self._first_delta()
                for action in machine.feed(ev):  # type: ignore[arg-type]
                    emit(action)  # type: ignore[arg-type]
            elif kind is Resumable:
                self.link.resumable(ev)  # type: ignore[arg-type]
            else:
                if kind is SpeechEnded:
                    self._requested_at = time.perf_counter()  # speech end → first chunk
                todo.extend(machine.feed(ev))  # type: ignore[arg-type]
                first = self._requested_at is not None
                if todo:
                    return

    def _stalled(self) -> Sequence[Action]:
        seconds = self.services.config.upstream_stall_timeout
        log.warning("session %s: nothing from the upstream for %gs", self.sid, seconds)
        self.observer.step_done(None, error="upstream_timeout")
        self.services.metrics.upstream_errors.inc()
        return self.machine.feed(UpstreamStalled(seconds))

    def _response_done(self, ev: ResponseDone) -> Sequence[Action]:
        self.observer.step_done(ev.usage)
        if ev.status == "completed":
            self.session.setup.upstream_factory.succeeded(self.link.provider)
        detail = ev.detail
        if detail and not _IDENTIFIER.fullmatch(detail):
            log.warning("session %s: response %s: %s", self.sid, ev.status, detail)
            ev = msgspec.structs.replace(ev, detail="see the gateway's log")
        return self.machine.feed(ev)

    def _upstream_error(self, ev: UpstreamError) -> Sequence[Action]:
        log.warning("session %s: upstream error %s: %s", self.sid, ev.code, ev.message)
        self.observer.step_done(None, error=ev.code)
        code = ev.code if _IDENTIFIER.fullmatch(ev.code) else "error"
        fallback = "" if ev.retryable else self._fallback(fatal=True)
        return self.machine.feed(UpstreamFailed(code, _FAILED_MESSAGE, fallback))

    def _stop_text_now(self) -> None:
        """No more deltas to ``_text_now``: before the driver is cancelled, so
        none is handled between the cancel and the driver's next step."""
        upstream, self._streaming_to = self._streaming_to, None
        if upstream is not None:
            upstream.stream_text_to(None)

    def _text_now(self, text: str) -> bool:
        """A delta handed over by the read callback while ``_pump_upstream``
        waits (``Upstream.stream_text_to``): parsed and emitted here, as the
        pump would. True: the driver must wake (a marker asked to stop, or
        this failed: the pump raises it as its own)."""
        self.link.silence.heard += 1
        try:
            if self._requested_at is not None:
                self._first_delta()
            todo = self._todo
            emit = self.log.emit
            for action in self.machine.text(text):
                if type(action) is StopResponse:
                    todo.append(action)
                else:
                    emit(action)  # type: ignore[arg-type]
            return bool(todo)
        except Exception as exc:  # the driver's handler reports it, as for its own
            self._text_failure = exc
            return True

    def _first_delta(self) -> None:
        self.log.hurry_next()  # the first content does not wait for a round's company
        started, self._requested_at = self._requested_at, None
        if started is not None:
            seconds = time.perf_counter() - started
            self.services.metrics.first_delta.observe(seconds)
            self.observer.first_token(seconds)

    def _audio_out(self, pcm16: bytes) -> None:
        """The model's audio to the attached clients, tagged with the newest seq."""
        voice = self.session.voice
        if voice is None or voice.audio_out is None:
            return  # a text session on a model that only speaks: its transcript is the answer
        if self.machine.state is not TurnState.STREAMING:
            return  # the rest of a cancelled answer
        self.machine.audio_sent(len(pcm16) * 500 / OUTPUT_RATE)
        self.log.deliver_audio(audio_frame(self.log.last_seq, pcm16))

    def _account(self, usage: Usage) -> None:
        """Charge a step's usage: counters, its price and the owner's quotas (``metric`` follows)."""
        metrics = self.services.metrics
        metrics.tokens_input.inc(usage.input)
        metrics.tokens_output.inc(usage.output)
        cost = self.observer.charge(usage)
        self.services.limits.record_usage(self.sid, usage, cost)

    # ------------------------------------------------------------------ tools

    async def _run_tools_hearing(self, run: RunTools) -> list[ToolResult]:
        """Run a step's tools; a voice session hears its user meanwhile (``ToolRuns.run``:
        nothing else reads the upstream while the driver awaits them)."""
        voice, upstream = self.session.voice, self.link.upstream
        hears = voice is not None and voice.audio_in is not None and self.session.listening
        hearing = (upstream, self._heard, self._barge_in) if hears and upstream else None
        return await self.tools.run(run, self._call_done, hearing)

    def _barge_in(self, ev: SpeechBegan) -> None:
        self.command(self.machine.feed(ev), interrupt=True)

    def _call_done(self, call_id: str, result: ToolResult) -> None:
        # Logged as soon as the call finished: a takeover reuses it.
        for action in self.machine.feed(CallDone(call_id, result)):
            self.log.emit(action)  # type: ignore[arg-type]

    def _background_finished(self, call_id: str, result: ToolResult) -> None:
        """A background call's result: a command for the machine, like a client's answer."""
        self.command(self.machine.feed(BackgroundDone(call_id, result)), interrupt=False)

    def _approval_decided(self, approval: Approval) -> None:
        asked = self._approval_asked.pop(approval.id, None)
        if asked is not None:
            waited = asyncio.get_running_loop().time() - asked
            self.services.metrics.tools.approval_wait.labels(approval.decision).observe(waited)
