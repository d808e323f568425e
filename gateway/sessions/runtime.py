"""One session driven by this node: its rooms, and the commands its clients send.

A ``SessionRuntime`` exists on the node that holds the session's lease. It
is a thin facade over one room per job:

- ``session_log.SessionLog``: numbers every event (``seq``), logs it, and
  only then hands it to the attached clients (**log, then send**);
- ``driver.TurnDriver``: the turn machine's I/O shell (commands in, actions
  performed, the upstream's events fed back);
- ``upstream_link.UpstreamLink``: the connection to the provider (opened,
  resumed, let go);
- ``voice.VoiceInput``: the user's audio on its way to the provider;
- ``recorder.SessionRecorder``: the flight recorder, while the session records
  (its taps in the log, the link, the driver and here).

This module holds what ties them: clients attach and detach, commands come
in (``start_turn``, ``cancel_turn``, ``tool_result``, ``approve``, ``configure``,
``commit_audio``), the configuration changes, and the session closes. The
node is reached through ``SessionHost`` only. After a takeover the node goes
on with a cut turn through the driver (``takeover.rerun_interrupted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import msgspec

from gateway.sessions.commands import CLOSING
from gateway.sessions.commands import run as run_command
from gateway.sessions.driver import TurnDriver
from gateway.sessions.guard import EventGuard, judged_input
from gateway.sessions.guardrail_check import screened
from gateway.sessions.observer import TurnObserver
from gateway.sessions.recorder import SessionRecorder
from gateway.sessions.resumption import ResumePoint
from gateway.sessions.session_log import SessionLog
from gateway.sessions.setup import ConfigProblem, SessionServices, SessionSetup
from gateway.sessions.subscriber import Subscriber
from gateway.sessions.upstream_link import UpstreamLink
from gateway.sessions.voice import VoiceInput, voice_config
from gateway.store.base import StoreError
from gateway.upstream.base import Upstream, VoiceConfig
from protocol.assembly import HistoryItem, forgetting
from protocol.audio import audio_frame
from protocol.configuration import ConfigChange, apply_change
from protocol.events import (
    Cancel,
    Configured,
    ContextMessage,
    Dtmf,
    Error,
    Event,
    Forget,
    PhoneCall,
    Usage,
    UserMessage,
)
from protocol.recording import Header, NodeJoined
from protocol.turn import TurnMachine
from protocol.turn_events import (
    GUARDRAIL_CANCEL,
    Action,
    Reconfigured,
    Shutdown,
    TurnInput,
)
from tools.client import prepare
from tools.registry import Registry

__all__ = ["SessionHost", "SessionRuntime", "SessionServices", "SessionSetup"]

log = logging.getLogger("gateway.sessions.runtime")


class SessionHost(Protocol):
    """How a runtime calls up to the node that drives it: four calls, no node object."""

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` in the background, owned (and cancelled on stop) by the node."""

    def runtime_idle(self, runtime: SessionRuntime) -> None:
        """The runtime may have no client and no turn left: the node may let it go."""

    def runtime_closed(self, runtime: SessionRuntime, *, release: bool) -> None:
        """The runtime stopped: forget it and, if ``release``, free its lease."""

    def runtime_configured(self, runtime: SessionRuntime) -> None:
        """The session's configuration changed: store it with the session."""


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
        cost: float = 0.0,
        setup: SessionSetup,
        owner: str = "",
        clock: Callable[[], float] = time.time,
        resume: ResumePoint | None = None,
        recording: str = "",
    ) -> None:
        """``recording``: the session's recording as the store has it (its meta's
        ``recording``: "" none yet, "on", "cut" at its limit)."""
        self.host = host
        self.services = services
        self.sid = sid
        self.owner = owner  # the key id that owns the session (its policy applies)
        self.setup = setup
        self.closed = False
        cfg = services.config
        factory = setup.upstream_factory
        # Cost and spans of the turns: what each Account costs, and the traces.
        self.observer = TurnObserver(
            services.tracing,
            services.prices,
            services.metrics,
            sid=sid,
            provider=factory.provider,
            model=factory.model,
            owner=owner,
            cost_total=cost,
        )
        self.log = SessionLog(
            sid,
            last_seq=last_seq,
            history=history,
            writer=services.log_writer,
            metrics=services.metrics,
            retry_delay=services.store_retry_delay,
            clock=clock,
            on_lost=self.lose,
        )
        machine = TurnMachine(
            total=usage,
            max_steps=cfg.max_steps,
            upstream_retries=cfg.upstream_retries,
            client_tools=setup.client_tools,
            call_number=last_seq,
            client_tool_timeout=cfg.client_tool_timeout,
            approval_timeout=cfg.approval_timeout,
        )
        machine.batch.needs_approval = setup.approvals
        machine.batch.background = setup.background
        machine.cancel_background = cfg.cancel_background
        machine.background.limit = cfg.background_max_running
        # Audio in and/or out, from the stored configuration (_install_voice changes it).
        self.voice: VoiceConfig | None = _voice_of(setup, services.executor.registry)
        machine.voice = self.voice is not None
        self.voice_in = VoiceInput(sid, self.voice.audio_in if self.voice else None)
        self.link = UpstreamLink(
            sid,
            history,
            observer=self.observer,
            context_tokens=cfg.context_tokens,
            spawn=host.spawn,
            remember=self._remember,
            clock=clock,
            resume=resume,
        )
        self.driver = TurnDriver(
            self,
            machine,
            self.log,
            self.link,
            self.voice_in,
            services,
            self.observer,
            spawn=host.spawn,
            remember=self._remember,
        )
        self.recorder: SessionRecorder | None = None
        self._recording = recording
        _install_guard(self, setup)
        if setup.record:
            _switch_recording(self, True)

    # ------------------------------------------------------------------ views

    @property
    def machine(self) -> TurnMachine:
        return self.driver.machine

    @property
    def history(self) -> list[HistoryItem]:
        return self.log.history

    @property
    def last_seq(self) -> int:
        """The seq of the newest event emitted (logged or about to be)."""
        return self.log.last_seq

    @property
    def provider(self) -> str:
        """The provider its upstream uses now (its configuration's, or the node's)."""
        return self.setup.upstream_factory.provider

    @property
    def subscribers(self) -> set[Subscriber]:
        return self.log.subscribers

    @property
    def turn(self) -> asyncio.Task[None] | None:
        """The driver's task while a turn runs (or a voice session listens); else None."""
        return self.driver.task

    @property
    def upstream(self) -> Upstream | None:
        return self.link.upstream

    @property
    def usage(self) -> Usage:
        """The session's token usage so far (the turn machine's total)."""
        return self.machine.meter.total

    @property
    def listening(self) -> bool:
        """The driver keeps reading the upstream between turns (a voice session with a client)."""
        return self.voice is not None and bool(self.log.subscribers) and not self.closed

    async def flushed(self) -> None:
        """Wait until everything emitted so far is logged and delivered."""
        await self.log.flushed()

    # ------------------------------------------------------------------ subscribers

    def attach(self, sub: Subscriber) -> None:
        self.log.subscribers.add(sub)
        if self.voice is not None:
            self.driver.listen()

    def detach(self, sub: Subscriber) -> None:
        self.log.subscribers.discard(sub)
        if not self.log.subscribers:
            self.driver.wake()  # a voice driver with nobody to listen to stops
        self.host.runtime_idle(self)

    # ------------------------------------- commands (``gateway.sessions.commands``)

    @property
    def tool_max_output(self) -> int:
        return self.services.config.tool_max_output

    def feed(self, given: TurnInput) -> Sequence[Action]:
        """The machine's actions for a command (``commands.run`` performs them), after
        the session's input guardrails: a blocked message feeds nothing (no turn)."""
        guard = self.log.guard
        if guard is not None and guard.guardrails.input:
            judged = judged_input(guard, given, self.log.emit)
            if judged is None:
                return ()
            given = judged
        return self.machine.feed(given)

    def perform(self, actions: Sequence[Action], *, interrupt: bool) -> Error | None:
        """Hand a command's actions to the driver; the machine's refusal among them."""
        return self.driver.command(actions, interrupt=interrupt)

    async def screen(self, message: Any) -> Any:
        """A typed message or a tool's result as the HTTP checkers leave it (awaited
        before it reaches the model: ``guardrail_check.screened``)."""

        def emit(event: Event) -> None:
            if not self.closed:  # a check may outlive the session
                self.log.emit(event)

        guard = self.log.guard
        if guard is not None and isinstance(message, UserMessage | ContextMessage):
            await guard.prejudge(message.content)  # a large one, off the loop
        return await screened(message, guard, self.services.checkers, self.sid, emit)

    def heard(self, message: Any, refused: Error | None) -> None:
        """A client's command ran (``commands.dispatch``): recorded if the session records."""
        guard = self.log.guard
        if self.recorder is not None:
            if (
                guard is not None
                and isinstance(message, UserMessage | ContextMessage)
                and guard.guardrails.input
            ):
                # Recorded as the model got it (or, blocked, as nothing).
                verdict = guard.judge_input(message.content)
                text = "" if verdict.blocked else verdict.text
                message = msgspec.structs.replace(message, content=text)
            self.recorder.heard(message, refused, self.log.delivered_seq)
        if guard is not None:
            guard.judged = None  # a large input's verdict, not held past its command

    def record(self, event: Dtmf | PhoneCall) -> None:
        """Something of the session's phone call (a key pressed, the call's start and
        end): logged and sent to every client of the session, outside any turn."""
        if not self.closed:
            self.log.emit(event)

    # ------------------------------------------------------------------ configuration

    async def configure(self, change: ConfigChange) -> Error | None:
        """Apply a ``configure``: checked, logged (``configured``), stored; an ``Error`` if refused.

        The one place a session's configuration changes. Takes effect at the
        next model step: the upstream is reopened from history with the new
        prompt (and provider) then. Client tools change at once for calls the
        model makes from then on; calls already sent to the client still wait
        for their results. Their schemas are compiled off the loop (``prepare``)
        after the size limits passed (``apply_change``).
        """
        if self.closed:
            return Error(code="internal", content=CLOSING)
        updated = apply_change(self.setup.config, change)
        if isinstance(updated, str):
            return Error(code="bad_frame", content=updated)
        problem = await prepare(updated.tools)
        if problem is not None:
            return Error(code="bad_frame", content=problem)
        if self.closed:
            return Error(code="internal", content=CLOSING)
        updated = apply_change(self.setup.config, change)  # as it is now, after the wait
        if isinstance(updated, str):
            return Error(code="bad_frame", content=updated)
        setup = self.services.session_setup(self.owner, updated, self.setup.key_tools)
        if isinstance(setup, str):
            code = "bad_frame" if isinstance(setup, ConfigProblem) else "forbidden"
            return Error(code=code, content=str(setup))
        _apply_setup(self, setup, reply_to=getattr(change, "id", msgspec.UNSET))
        return None

    def forget(self, message: Forget) -> Error | None:
        """Apply a ``forget`` (``assembly.forgetting``); the upstream reopens from history."""
        made = forgetting(self.history, message, idle=self.machine.idle and not self.closed)
        if not isinstance(made, Error):
            self.log.emit(msgspec.structs.replace(made, reply_to=message.id))
            self.log.persist((made,))
            self.driver.asker.replace_connection()
            self.driver.listen()
        return made if isinstance(made, Error) else None

    def rights_changed(self, setup: SessionSetup, *, reopen_at: float = 0.0) -> None:
        """The owner's rights changed (the operator's key policy): ``setup`` from the
        next model step, as ``configure`` applies a change, told to every client
        as ``configured`` and stored. Calls already sent to a client still wait;
        a server tool no longer allowed fails when it would run. A listening
        session's provider connection is replaced at ``reopen_at`` (the loop's clock)
        at the soonest (the node spreads them)."""
        if self.closed:
            return
        self.driver.asker.reopens.postpone(reopen_at)
        _apply_setup(self, setup)

    def speaking_voice(self) -> VoiceConfig | None:
        """The voice a model that only speaks is opened with for this session."""
        return _voice_of(self.setup, self.services.executor.registry, speaks_only=True)

    # ------------------------------------------------------------------ voice

    async def send_audio(self, pcm16: bytes) -> None:
        """User audio (PCM16 at ``AudioIn.rate``) to the provider. Audio that arrives
        while the connection is being opened is held and sent first once it is
        open; audio that arrives while a failed open is waited out is dropped
        (the client was told: ``error`` code ``upstream``)."""
        if not self.closed:
            if self.recorder is not None:
                _heard_audio(self, self.recorder, pcm16)
            await self.voice_in.send(self.link.upstream, pcm16, hears=self.link.hears)

    def send_audio_now(self, pcm16: bytes) -> bool:
        """``send_audio`` without awaiting when the upstream socket takes it at once
        (or the audio is held); False: nothing was sent, await ``send_audio``."""
        if self.closed:
            return False
        if self.recorder is not None:  # first: the frame it goes out in refers to it
            _heard_audio(self, self.recorder, pcm16)
        link = self.link
        return self.voice_in.send_now(link.upstream, pcm16, link.hears)  # positional: cheaper

    async def clear_audio(self) -> Error | None:
        return await self.voice_in.clear(self.link.upstream, self.setup.upstream_factory)

    def quiet_for(self, seconds: float) -> bool:
        """No audio from this node's clients for ``seconds`` (no live microphone here)."""
        return self.voice_in.quiet_for(seconds)

    # ------------------------------------------------------------------ the node's side

    def driver_stopped(self) -> None:
        self.host.runtime_idle(self)

    async def _remember(self, fields: dict[str, str]) -> None:
        """Keep ``fields`` with the session's meta (best effort: a trace link, a handle)."""
        try:
            await self.services.store.set_meta(self.sid, fields)
        except StoreError as exc:
            log.info("session %s: could not store %s: %s", self.sid, ", ".join(fields), exc)

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
        self.voice_in.stop()
        await self.driver.stop()
        if not lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flushed(), 5.0)
        self.log.stop()  # whatever could not be written by now is dropped
        recorder, self.recorder = self.recorder, None
        if recorder is not None and self.services.recorders is not None:
            if lost:
                recorder.stop()  # another node records it now (or it was deleted)
            else:
                await self.services.recorders.finish(recorder)
        # Free the lease before the slow part (closing the upstream socket), so
        # another node can pick the session up at once.
        self.host.runtime_closed(self, release=not lost)
        self.log.session_lost(reason)
        self.machine.feed(Shutdown())
        await self.link.close()
        # A closed runtime is garbage in cycles (its parts refer to each other), freed by
        # a full collection only, which ``gateway serve``'s thresholds make rare: its
        # history (the whole conversation: 36 MB for 20 messages of 900 kB) went with it
        # only then. The store keeps the history; a new runtime reads it from there.
        self.log.history.clear()


def _heard_audio(runtime: SessionRuntime, recorder: SessionRecorder, pcm16: bytes) -> None:
    """A chunk of the user's audio, for the session's flight recorder (the caller
    tests ``runtime.recorder``: a session that does not record pays one test a frame)."""
    voice = runtime.voice
    if voice is not None and voice.audio_in is not None:
        recorder.audio_in(pcm16, voice.audio_in.rate, runtime.log.delivered_seq)


def _switch_recording(runtime: SessionRuntime, on: bool) -> None:
    """Start the flight recorder (a header, or a node's record when the session was
    recorded before), or stop it (what it holds is written first)."""
    recorders = runtime.services.recorders
    if recorders is None:
        return
    recorder = runtime.recorder
    if not on:
        runtime.recorder = runtime.log.recorder = runtime.link.recorder = (
            runtime.driver.tools.recorder
        ) = None
        if recorder is not None:
            runtime.host.spawn(recorders.finish(recorder), f"recording:{runtime.sid}")
        return
    if runtime._recording == "cut":
        return  # nothing more would be kept
    factory = runtime.setup.upstream_factory
    node, config = runtime.services.config.node_id, runtime.setup.config
    first: Header | NodeJoined
    if runtime._recording:
        first = NodeJoined(node=node, provider=factory.provider, model=factory.model, config=config)
    else:
        first = Header(
            session_id=runtime.sid,
            node=node,
            provider=factory.provider,
            model=factory.model,
            config=config,
            audio=recorders.audio,
            limit=recorders.limit,
        )
    runtime._recording = "on"
    recorder = recorders.start(runtime.sid, first)
    recorder.guarded = bool(runtime.setup.guardrails)
    runtime.recorder = runtime.log.recorder = runtime.link.recorder = (
        runtime.driver.tools.recorder
    ) = recorder


def _install_guard(runtime: SessionRuntime, setup: SessionSetup) -> None:
    """The session's guardrails at its log (``gateway.sessions.guard``): new rules hold
    from the next block of text on; the recording keeps upstream frames as sizes only."""
    log_ = runtime.log
    if not setup.guardrails:
        log_.guard = None
    elif log_.guard is None:

        def end_turn() -> None:
            # An end_turn rule tripped inside an emit (the driver is mid-step): soon. (A
            # spoken answer's cut goes to the machine through the reader: ``GuardrailCut``.)
            asyncio.get_running_loop().call_soon(
                lambda: (
                    None if runtime.closed else run_command(Cancel(id=GUARDRAIL_CANCEL), runtime)
                )
            )

        def send_audio(pcm16: bytes) -> None:
            log_.deliver_audio(audio_frame(log_.last_seq, pcm16))

        log_.guard = EventGuard(setup.guardrails, runtime.services.metrics, end_turn, send_audio)
    else:
        log_.guard.guardrails = setup.guardrails
    if log_.guard is not None:
        log_.guard.speaks = _speaks(runtime.voice)
    if runtime.recorder is not None:
        runtime.recorder.guarded = bool(setup.guardrails)


def _speaks(voice: VoiceConfig | None) -> bool:
    """The session's answers are spoken to its clients (their audio is cut with their
    transcript when a guardrail trips)."""
    return voice is not None and voice.audio_out is not None and voice.audio_out.to_client


def _apply_setup(
    runtime: SessionRuntime,
    setup: SessionSetup,
    *,
    reply_to: str | msgspec.UnsetType = msgspec.UNSET,
) -> None:
    """A new setup from the next model step: logged as ``configured`` (answering the
    ``configure`` whose ``id`` is ``reply_to``), stored."""
    runtime.setup = setup
    runtime.machine.feed(Reconfigured())  # the next step reopens (nothing to do now)
    _install_guard(runtime, setup)
    runtime.machine.batch.router = setup.client_tools
    runtime.machine.batch.needs_approval = setup.approvals
    runtime.machine.batch.background = setup.background
    runtime.log.emit(Configured(config=setup.config, reply_to=reply_to))
    runtime.host.runtime_configured(runtime)
    _install_voice(runtime, _voice_of(setup, runtime.services.executor.registry))
    if setup.record != (runtime.recorder is not None):
        _switch_recording(runtime, setup.record)
    # The provider takes a setup when a connection opens. Between turns an open one
    # told something else goes now: a listening session's next spoken turn is answered
    # with the new instructions, tools and voice, not the ones it opened with. A turn
    # running now, speech under way or an answer still playing keeps it until over
    # (``UpstreamReader.pump`` reopens it then); one opened alike is kept
    # (``UpstreamAsker.gives_way``). Usage stays priced as the connection's provider
    # (``UpstreamLink.open`` sets it).
    if runtime.driver.asker.gives_way():
        runtime.driver.asker.replace_connection()
    runtime.driver.listen()


def _install_voice(runtime: SessionRuntime, voice: VoiceConfig | None) -> None:
    """A new setup's audio (``None``: text only), as ``_install_guard`` its guardrails;
    ``_apply_setup`` reopens the upstream with it."""
    if voice == runtime.voice:
        return
    runtime.voice_in.reconfigure(
        voice.audio_in if voice is not None else None,
        speech=runtime.machine.spoken.speech_open,
    )
    runtime.voice = voice
    if runtime.log.guard is not None:
        runtime.log.guard.speaks = _speaks(voice)
    runtime.machine.voice = voice is not None


def _voice_of(
    setup: SessionSetup, registry: Registry, *, speaks_only: bool = False
) -> VoiceConfig | None:
    """The audio a configuration asks for, with the tools the session may call
    (server tools, then its client tools: both are declared natively).
    ``speaks_only``: the upstream's model answers in audio only (see ``voice_config``)."""
    allowed = setup.server_tools
    specs = [s for s in registry.specs() if allowed is None or s.name in allowed]
    client = setup.client_tools.specs()
    return voice_config(
        setup.config,
        [*specs, *client],
        speaks_only=speaks_only,
        background=setup.background,
        client=frozenset(s.name for s in client),
    )
