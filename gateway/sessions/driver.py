"""The turn driver: performs the turn machine's actions, feeds it what I/O brings.

``protocol.turn.TurnMachine`` decides everything about a turn; this is its
I/O shell, and it decides nothing. Commands feed the machine and hand its
actions to the driver (``command``), one task per running turn, which performs
them through one ``match`` (``_perform``), then asks the machine what to wait
for (``TurnMachine.wait``: the upstream, read by ``gateway.sessions.reading``;
a command; nothing) and until when, and feeds it what came, or ``Tick`` at
the deadline. Requests to the upstream go through ``gateway.sessions.asking``.
A cancel interrupts the driver's current await; the actions it had not
performed yet are superseded. A voice session keeps its upstream open between
turns and the driver runs while a client is attached (``listening``): the
provider's VAD starts turns by itself, and speech barges in during tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from gateway.sessions.asking import DrivenSession, UpstreamAsker
from gateway.sessions.observer import TurnObserver
from gateway.sessions.reading import UpstreamReader
from gateway.sessions.session_log import SessionLog
from gateway.sessions.setup import SessionServices
from gateway.sessions.tool_runs import ToolRuns
from gateway.sessions.upstream_link import UpstreamLink
from gateway.sessions.voice import VoiceInput
from gateway.upstream.base import (
    UpstreamClosed,
)
from protocol.calls import ToolResult
from protocol.events import Approval, Error, Interrupt, Metric, Respond, Think, Usage
from protocol.turn import TurnMachine
from protocol.turn_events import (
    Account,
    Action,
    AddMessage,
    AddNote,
    AwaitApproval,
    AwaitClient,
    BackgroundDone,
    Backoff,
    CallDone,
    CancelBackground,
    CommitAudio,
    DropUpstream,
    Persist,
    Refuse,
    ReplaceResponse,
    Request,
    RetryNow,
    RunTools,
    ShellFailed,
    Source,
    SpeechBegan,
    StartBackground,
    StopResponse,
    Tick,
    ToolsDone,
    TurnStarted,
)

__all__ = ["DrivenSession", "TurnDriver"]

log = logging.getLogger("gateway.sessions.runtime")

# The actions the driver awaits; a cancel supersedes those not yet performed. Not an
# ``AddMessage``: its ``context`` is logged and in history, so the connection must have it.
_AWAITED: Final = frozenset(
    {
        Request,
        CommitAudio,
        StopResponse,
        ReplaceResponse,
        AddNote,
        RunTools,
        AwaitClient,
        AwaitApproval,
        Backoff,
    }
)
_RETRY_NOW: Final = RetryNow()


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
        self.task: asyncio.Task[None] | None = None
        self._todo: deque[Action] = deque()  # actions the driver performs next, in order
        self._driving = False  # the driver task has started running
        self._interrupted = False  # a cancel interrupted the driver's await
        link.silence.seconds = services.config.upstream_stall_timeout
        self.asker = UpstreamAsker(session, machine, log_, link, voice_in, observer, deque())
        self.reader = UpstreamReader(
            session,
            machine,
            log_,
            self.asker,
            voice_in,
            services,
            observer,
            self._todo,
            self._perform_now,
        )

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
            self._todo.clear()
            self._todo.extend(actions)
            self.task = asyncio.create_task(self._drive(), name=f"turn:{self.sid}")
        elif interrupt:
            # The awaits the driver had not performed yet are superseded (its
            # events and history items stay: they are decided); its current
            # await is interrupted and it performs these actions next.
            kept = [action for action in self._todo if type(action) not in _AWAITED]
            self._todo.clear()
            self._todo.extend([*kept, *actions])
            if self._driving and not self._interrupted:
                self._interrupted = True
                self.reader.stop_text_now()
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
            self._todo.clear()
            self.task = asyncio.create_task(self._drive(), name=f"turn:{self.sid}")
        else:
            self.wake()

    def wake(self) -> None:
        """Interrupt the driver's between-turns read, so it looks at its work again."""
        driver = self.task
        if (
            self.reader.listening_idle
            and driver is not None
            and self._driving
            and not self._interrupted
            and not driver.done()
        ):
            self._interrupted = True
            self.reader.stop_text_now()
            driver.cancel()

    async def stop(self) -> None:
        """Cancel the running turn and the background calls, and wait for them to end."""
        driver = self.task
        if driver is not None and not driver.done():
            self.reader.stop_text_now()
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
        loop = asyncio.get_running_loop()
        self._driving = True
        try:
            while True:
                try:
                    await self._perform_pending()
                    if machine.idle:
                        self.link.turn_ended()
                    wait = machine.wait(loop.time(), listening=session.listening)
                    match wait.source:
                        case Source.NOTHING:
                            return
                        case Source.COMMAND:
                            await self._await_command(wait.deadline)
                        case _:
                            await self.reader.pump()
                except asyncio.CancelledError:
                    if not self._interrupted or session.closed:
                        raise
                    # A cancel: the superseded action may have left the upstream
                    # mid-request, in a state nobody knows: let it go.
                    self._interrupted = False
                    task.uncancel()
                    if self.asker.in_call:
                        self.asker.in_call = False
                        self.asker.drop(stop=True)
                except UpstreamClosed as exc:
                    idle = machine.idle
                    self.reader.gone(exc.reason, retryable=exc.retryable)
                    if idle and session.listening and not self._todo:
                        await self.reader.listen_later()
                except Exception as exc:
                    log.exception("session %s: turn failed", self.sid)
                    self._todo.clear()
                    self._todo.extend(machine.feed(ShellFailed(type(exc).__name__)))
        finally:
            self.observer.turn_ended()
            self._driving = False
            self._interrupted = False
            self.reader.listening_idle = False
            if self.task is task:
                self.task = None
            session.driver_stopped()

    async def _await_command(self, deadline: float | None) -> None:
        """Wait for a command (a client's result, an approve, a cancel) until ``deadline``,
        then tell the machine the time."""
        self._wake.clear()
        if self._todo:
            return
        try:
            async with asyncio.timeout_at(deadline):
                await self._wake.wait()
        except TimeoutError:
            self._todo.extend(self.machine.feed(Tick(asyncio.get_running_loop().time())))

    # ------------------------------------------------------------------ actions

    async def _perform_pending(self) -> None:
        """Perform queued actions in order; events and history first, awaits last."""
        todo = self._todo
        while todo:
            waiting = self._perform(todo.popleft())
            if waiting is not None:
                await waiting

    def _perform_now(self, actions: Sequence[Action]) -> None:
        """Perform what can be at once (events as a response streams, a call's outcome);
        an action that waits goes to the driver's queue, after what it holds."""
        for action in actions:
            waiting = self._perform(action)
            if waiting is not None:
                waiting.close()
                self._todo.append(action)

    def _perform(self, action: Action) -> Coroutine[Any, Any, None] | None:
        """Do one action of the machine's: the one place the driver looks at what it asked
        for. An action that waits comes back as the coroutine that performs it."""
        match action:
            case Respond() | Think():  # the hot path: a response's chunks
                self.log.emit(action)
            case Metric():
                self.observer.fill(action)
                self.log.emit(action)
            case Error():
                self.observer.turn_failed(action.code)
                self.log.emit(action)
            case Approval():
                self._approval_decided(action)
                self.log.emit(action)
            case Interrupt() if self.link.upstream is None:
                return self.asker.reopen_for(action, self._todo[0] if self._todo else None)
            case Persist(items=items, firsts=firsts):
                self.log.persist(items, firsts)
            case Account(usage=usage):
                self._account(usage)
            case TurnStarted():
                self.services.metrics.turns.inc()
                self._turn_started()
            case DropUpstream(stop=stop):
                self.asker.drop(stop=stop)
            case AwaitApproval(ids=ids):
                loop_time = asyncio.get_running_loop().time()
                for call_id in ids:
                    self._approval_asked.setdefault(call_id, loop_time)
                self._todo.extend(self.machine.feed(Tick(loop_time)))
            case StartBackground():
                self.tools.start(action, self._background_finished)
            case CancelBackground(ids=ids):
                self.tools.cancel(ids)
            case AwaitClient(ids=ids):
                self.services.metrics.tools.calls.inc(len(ids))
                self._todo.extend(self.machine.feed(Tick(asyncio.get_running_loop().time())))
            case Request(message=message, outputs=outputs, fresh=fresh):
                return self.asker.request(message, outputs, fresh=fresh)
            case CommitAudio():
                return self.asker.commit_audio()
            case StopResponse():
                return self.asker.stop_response()
            case ReplaceResponse(text=text, heard_ms=heard_ms):
                guard = self.log.guard  # the provider is told what the clients got
                return self.asker.replace(guard.answer(text) if guard else text, heard_ms)
            case AddNote(content=content):
                return self.asker.add_note(content)
            case AddMessage(message=message):
                return self.asker.add_message(message)
            case RunTools():
                return self._run_tools(action)
            case Backoff(attempt=attempt, delay=delay):
                return self._backoff(attempt, delay)
            case Refuse():  # only commands get it, and they answer it themselves
                log.warning("session %s: unexpected action %r", self.sid, action)
            case _:  # every other event: log it, then send it
                self.log.emit(action)
        return None

    async def _run_tools(self, run: RunTools) -> None:
        """Run a step's tools; a voice session hears its user meanwhile (``ToolRuns.run``:
        nothing else reads the upstream while the driver awaits them). The calls are in
        the log (and history) before any runs: a node that takes over knows each one
        that may have run, and its key."""
        voice, upstream = self.session.voice, self.link.upstream
        hears = voice is not None and voice.audio_in is not None and self.session.listening
        hearing = (upstream, self.asker.heard, self._barge_in) if hears and upstream else None
        results = await self.tools.run(run, self._call_done, hearing)
        self._todo.extend(self.machine.feed(ToolsDone(tuple(results))))

    async def _backoff(self, attempt: int, delay: float) -> None:
        retries = self.services.config.upstream_retries
        log.info("session %s: retrying the step (%d/%d)", self.sid, attempt, retries)
        await asyncio.sleep(delay)
        self._todo.extend(self.machine.feed(_RETRY_NOW))

    def _turn_started(self) -> None:
        traceparent = self.observer.turn_started()
        if traceparent:
            # Kept with the session so a node that takes it over links its rerun here.
            self._spawn(self._remember({"traceparent": traceparent}), f"meta:{self.sid}")

    def _account(self, usage: Usage) -> None:
        """Charge a step's usage: counters, its price and the owner's quotas (``metric`` follows)."""
        metrics = self.services.metrics
        metrics.usage.tokens_input.inc(usage.input)
        metrics.usage.tokens_output.inc(usage.output)
        cost = self.observer.charge(usage)
        self.services.limits.record_usage(self.sid, usage, cost)

    # ------------------------------------------------------------------ tools

    def _barge_in(self, ev: SpeechBegan) -> None:
        self.voice_in.speech_began()
        self.command(self.machine.feed(ev), interrupt=True)

    def _call_done(self, call_id: str, result: ToolResult) -> None:
        # Logged as soon as the call finished: a takeover reuses it.
        self._perform_now(self.machine.feed(CallDone(call_id, result)))

    def _background_finished(self, call_id: str, result: ToolResult) -> None:
        """A background call's result: a command for the machine, like a client's answer."""
        self.command(self.machine.feed(BackgroundDone(call_id, result)), interrupt=False)

    def _approval_decided(self, approval: Approval) -> None:
        asked = self._approval_asked.pop(approval.id, None)
        if asked is not None:
            waited = asyncio.get_running_loop().time() - asked
            self.services.metrics.tools.approval_wait.labels(approval.decision).observe(waited)
