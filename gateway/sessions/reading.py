"""The turn driver's reads of the upstream: its events fed to the machine, the hot path.

``gateway.sessions.driver.TurnDriver`` calls ``pump`` when the machine's
``wait`` names the upstream (``RESPONSE``, ``UPSTREAM`` or ``LISTEN``): the
events are fed to the machine until one calls for an action (queued in the
driver's ``todo``) or the machine waits for something else.

**The hot path**: while the driver waits for a response's next delta, the
adapter hands deltas to ``_text_now`` in its read callback (no task resumed
per token); a marker that asks the session to act wakes the driver.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from gateway.sessions.asking import DrivenSession, UpstreamAsker
from gateway.sessions.guard import EventGuard
from gateway.sessions.observer import TurnObserver
from gateway.sessions.session_log import SessionLog
from gateway.sessions.setup import SessionServices
from gateway.sessions.tool_runs import Gone
from gateway.sessions.upstream_link import UpstreamLink
from gateway.sessions.voice import VoiceInput
from gateway.upstream.base import (
    AudioDelta,
    Resumable,
    Upstream,
    UpstreamClosed,
    UpstreamError,
    UpstreamEvent,
    Woken,
)
from protocol.audio import OUTPUT_RATE, audio_frame
from protocol.events import Error
from protocol.turn import TurnMachine
from protocol.turn_events import (
    Action,
    GuardrailCut,
    ResponseDone,
    Source,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    TextDelta,
    Thought,
    Tick,
    UpstreamFailed,
    UpstreamLost,
    UpstreamStalled,
)

__all__ = ["UpstreamReader"]

log = logging.getLogger("gateway.sessions.runtime")

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


class UpstreamReader:
    """Reads one session's upstream for its driver (see the module docstring)."""

    def __init__(
        self,
        session: DrivenSession,
        machine: TurnMachine,
        log_: SessionLog,
        asker: UpstreamAsker,
        voice_in: VoiceInput,
        services: SessionServices,
        observer: TurnObserver,
        todo: deque[Action],
        perform_now: Callable[[Sequence[Action]], None],
    ) -> None:
        self.session = session
        self.machine = machine
        self.log = log_
        self.asker = asker
        self.link: UpstreamLink = asker.link
        self.voice_in = voice_in
        self.services = services
        self.observer = observer
        self.sid = log_.sid
        self.todo = todo  # the driver's queue: what the events read call for
        self.perform_now = perform_now
        self.heard: deque[UpstreamEvent | Gone] = asker.heard
        # The upstream handing deltas to ``_text_now``, and what that failed with.
        self._streaming_to: Upstream | None = None
        self._text_failure: Exception | None = None
        # The driver reads the upstream with nothing else to do (no turn, or a wait for
        # client results): a command interrupts that read (``TurnDriver.wake``).
        self.listening_idle = False

    def gone(self, reason: str, *, retryable: bool = True) -> None:
        self.observer.step_done(None, error=reason)
        self.asker.drop(stop=False)
        self.services.metrics.upstream_errors.inc()
        log.warning("session %s: upstream lost (%s)", self.sid, reason)
        fatal = not retryable
        fallback = self.fallback(fatal=fatal)
        lost = UpstreamLost(_LOST_REASON, fatal=fatal, fallback=fallback)
        self.todo.clear()
        self.todo.extend(self.machine.feed(lost))

    async def listen_later(self) -> None:
        """Wait before a listening voice session opens its upstream again.

        The first failure in a row is told to the client (``error`` code
        ``upstream``); the wait doubles up to a cap and ends early when a
        command comes (``wake`` cancels it)."""
        first, delay = self.voice_in.listen_failed()
        if first:
            self.log.emit(Error(code="upstream", content=_LISTEN_UNREACHABLE))
        self.listening_idle = True
        try:
            await asyncio.sleep(delay)
        finally:
            self.listening_idle = False
            self.voice_in.listen_again()

    def fallback(self, *, fatal: bool) -> str:
        """Report the failure to the session's providers; the one to use next if it changes."""
        factory = self.session.setup.upstream_factory
        provider = self.link.provider or factory.provider
        chosen = factory.failed(provider, fatal=fatal)
        if chosen == provider:
            return ""
        log.warning("session %s: falling back from %s to %s", self.sid, provider, chosen)
        return chosen

    async def pump(self) -> None:
        """Feed the upstream's events to the machine until one calls for an action."""
        session = self.session
        upstream = self.link.upstream
        if session.listening and self.asker.gives_way():
            # Reconfigured while the turn ran: the next one is heard and answered by
            # a connection opened for the new setup.
            self.asker.replace_connection()
            upstream = None
        if upstream is None:
            if not session.listening:
                raise UpstreamClosed("no upstream connection")
            upstream = await self.asker.open()
        elif self.voice_in.unflushed:
            await self.voice_in.flush(
                upstream, hears=self.link.hears
            )  # the request it waited for was superseded
        try:
            await self._feed(upstream)
        except UpstreamClosed:
            if upstream is not self.link.upstream:
                # Let go on purpose while read (a new setup between turns: ``gives_way``),
                # not lost: no "upstream lost", no error counted; the next read opens one.
                return
            raise

    async def _feed(self, upstream: Upstream) -> None:
        """``pump``'s reads of ``upstream``."""
        session = self.session
        machine = self.machine
        text = machine.text
        todo = self.todo
        first = self.asker.requested_at is not None
        inline = upstream.stream_text_to(None)
        heard = self.heard
        loop = asyncio.get_running_loop()
        ev: UpstreamEvent | None
        guard = self.log.guard
        while True:
            if guard is not None and guard.cut_ms is not None and self._cut(guard, done=False):
                return
            wait = machine.wait(loop.time(), listening=session.listening)
            source = wait.source
            if source is Source.NOTHING or source is Source.COMMAND or todo:
                return  # not the upstream's turn, or a command came while it opened
            if heard:
                read = heard.popleft()
                if isinstance(read, Gone):
                    raise read.error
                ev = read
            elif source is Source.LISTEN:
                # Between turns, or while the client works or the user decides:
                # a command interrupts the read (``wake``).
                self.listening_idle = True
                deadline = wait.deadline
                deferred = self.asker.reopen_deferred_to  # an outdated connection's end
                if deferred is not None and (deadline is None or deferred < deadline):
                    deadline = deferred
                try:
                    async with asyncio.timeout_at(deadline):
                        ev = await upstream.recv()
                except TimeoutError:
                    self.todo.extend(machine.feed(Tick(loop.time())))
                    return
                finally:
                    self.listening_idle = False
            elif source is Source.UPSTREAM:
                try:
                    async with asyncio.timeout_at(wait.deadline):
                        ev = await upstream.recv()
                except TimeoutError:
                    raise UpstreamClosed("nothing from the upstream by its deadline") from None
            elif inline:
                # Deltas that arrive while this waits are handled in the read
                # callback (``_text_now``): no task resume per token.
                upstream.stream_text_to(self._text_now)
                self._streaming_to = upstream
                try:
                    ev = await self.link.silence.recv(upstream)
                finally:
                    self.stop_text_now()
            else:
                ev = await self.link.silence.recv(upstream)
            if ev is None:  # the provider went silent mid-response
                todo.extend(self._stalled())
                return
            match ev:
                case TextDelta(text=delta):
                    if first:
                        first = False
                        self._first_delta()
                    self.perform_now(text(delta))
                    if todo:
                        return
                case Woken():
                    failure, self._text_failure = self._text_failure, None
                    if failure is not None:
                        raise failure
                    if todo:
                        return
                    first = self.asker.requested_at is not None
                case ResponseDone():
                    if guard is not None and guard.gates_audio:
                        self.log.answer_done()
                        if guard.cut_ms is not None:
                            self._cut(guard, done=True)
                    todo.extend(self._response_done(ev))
                    return
                case UpstreamError():
                    todo.extend(self._upstream_error(ev))
                    if todo:
                        return
                case AudioDelta(pcm16=pcm16):
                    self._audio_out(pcm16)
                case Spoken() | Thought():
                    if first and type(ev) is Spoken:
                        first = False
                        self._first_delta()
                    self.perform_now(machine.feed(ev))
                case Resumable():
                    self.link.resumable(ev)
                case _:
                    if type(ev) is SpeechEnded:
                        self.asker.requested_at = time.perf_counter()  # speech end → first chunk
                        self.voice_in.consumed()
                    elif type(ev) is SpeechBegan:
                        self.voice_in.speech_began()
                    todo.extend(machine.feed(ev))
                    first = self.asker.requested_at is not None
                    if todo:
                        return

    def _cut(self, guard: EventGuard, *, done: bool) -> bool:
        """A guardrail cut the spoken answer: the machine cancels it, and the provider
        keeps the audio sent of it. True: there is something to do now."""
        heard = guard.take_cut()
        assert heard is not None
        self.todo.extend(self.machine.feed(GuardrailCut(heard, done=done)))
        return bool(self.todo)

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
        fallback = "" if ev.retryable else self.fallback(fatal=True)
        return self.machine.feed(UpstreamFailed(code, _FAILED_MESSAGE, fallback))

    def stop_text_now(self) -> None:
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
            if self.asker.requested_at is not None:
                self._first_delta()
            self.perform_now(self.machine.text(text))
            return bool(self.todo)
        except Exception as exc:  # the driver's handler reports it, as for its own
            self._text_failure = exc
            return True

    def _first_delta(self) -> None:
        self.log.hurry_next()  # the first content does not wait for a round's company
        started, self.asker.requested_at = self.asker.requested_at, None
        if started is not None:
            seconds = time.perf_counter() - started
            self.services.metrics.first_delta.observe(seconds)
            self.observer.first_token(seconds)

    def _audio_out(self, pcm16: bytes) -> None:
        """The model's audio to the attached clients, tagged with the newest seq."""
        voice = self.session.voice
        if voice is None or voice.audio_out is None:
            return  # a text session on a model that only speaks: its transcript is the answer
        if self.machine.audio_sent(len(pcm16) * 500 / OUTPUT_RATE):
            guard = self.log.guard
            if guard is not None and guard.gates_audio:
                guard.hold_audio(pcm16)  # it waits for its transcript to be judged
            else:
                self.log.deliver_audio(audio_frame(self.log.last_seq, pcm16))
