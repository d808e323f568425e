"""What the turn driver asks of the upstream: open it, request, commit, stop, replace.

``gateway.sessions.driver.TurnDriver`` performs the machine's ``Request``,
``CommitAudio``, ``StopResponse``, ``ReplaceResponse``, ``AddNote``, ``AddMessage`` and ``DropUpstream``
actions here. ``in_call``: one of these is under way, so a cancel that
interrupts it leaves the connection mid-request (the driver then lets it go);
``requested_at``: when the last response was asked for (the first delta's
latency counts from it, ``gateway.sessions.reading``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Protocol

from gateway.sessions.observer import TurnObserver
from gateway.sessions.session_log import SessionLog
from gateway.sessions.setup import SessionSetup
from gateway.sessions.tool_runs import Gone
from gateway.sessions.upstream_link import OpenRequest, UpstreamLink
from gateway.sessions.voice import VoiceInput
from gateway.upstream.base import ModelOptions, Upstream, UpstreamClosed, UpstreamEvent, VoiceConfig
from protocol.assembly import Message
from protocol.events import Interrupt
from protocol.turn import TurnMachine
from protocol.turn_events import Action, Opened, Request

__all__ = ["DrivenSession", "ReopenBudget", "UpstreamAsker"]

REOPEN_BURST: Final = 4
REOPEN_EVERY: Final = 2.0
"""An outdated connection is replaced at once ``REOPEN_BURST`` times, then once per
``REOPEN_EVERY`` seconds (``ReopenBudget``)."""


class ReopenBudget:
    """How soon a session may open a provider connection to replace an outdated one.

    Each configure (an OpenAI-door ``session.update``) that changes what the provider
    is told replaces an idle listening session's connection. A client pacing updates
    under the frame limit made the node open one provider connection per update
    (101 for 100 at 20 a second): the deployment's key opening connections as fast
    as one tenant sends frames. A token bucket (pure: the caller passes the loop
    time) lets the honest cases go at once (the first updates after connecting, a
    handoff) and holds a flood to one every ``REOPEN_EVERY`` seconds. Meanwhile the
    outdated connection is kept; what it was sent and had not consumed is replayed
    to the next (``VoiceInput.replay_unconsumed``). A typed turn's reopen is never
    held back (the turn needs the new setup), but it spends the budget too.
    ``postponed_to``: none before this time either (``postpone``).
    """

    __slots__ = ("_last", "_tokens", "postponed_to")

    def __init__(self, now: float) -> None:
        self._tokens = float(REOPEN_BURST)
        self._last = now
        self.postponed_to = -math.inf

    def _refilled(self, now: float) -> float:
        return min(float(REOPEN_BURST), self._tokens + (now - self._last) / REOPEN_EVERY)

    def due(self, now: float) -> float:
        """When the next replacement may be opened: ``now``, or later."""
        tokens = self._refilled(now)
        due = now if tokens >= 1.0 else now + (1.0 - tokens) * REOPEN_EVERY
        return max(due, self.postponed_to)

    def postpone(self, until: float) -> None:
        """No replacement before ``until`` (``Node.policies_changed`` spreads the ones a
        key policy edit makes)."""
        self.postponed_to = until

    def spend(self, now: float) -> None:
        self._tokens = self._refilled(now) - 1.0
        self._last = now


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


class UpstreamAsker:
    """The driver's requests to its session's upstream (see the module docstring)."""

    def __init__(
        self,
        session: DrivenSession,
        machine: TurnMachine,
        log_: SessionLog,
        link: UpstreamLink,
        voice_in: VoiceInput,
        observer: TurnObserver,
        heard: deque[UpstreamEvent | Gone],
    ) -> None:
        self.session = session
        self.machine = machine
        self.log = log_
        self.link = link
        self.voice_in = voice_in
        self.observer = observer
        self.heard = heard  # upstream events read while tools ran (``tool_runs.hear``)
        self.in_call = False
        self.requested_at: float | None = None
        self.reopens = ReopenBudget(-math.inf)
        # An outdated connection ``gives_way`` would let go but for ``reopens``: the
        # loop time it may (the reader's idle wait ends then).
        self.reopen_deferred_to: float | None = None

    async def request(
        self, message: Message | None, outputs: Sequence[tuple[str, str]], *, fresh: bool
    ) -> None:
        self.in_call = True
        self.observer.step_started()
        upstream = self.link.upstream
        if upstream is not None and fresh and self.outdated():
            # Configured since it was opened: reopen with the new prompt and provider.
            self.replace_connection()
            upstream = None
        if upstream is None:
            # Fresh connection: history already ends with the prompt message.
            upstream = await self.open(flush=False)
            self.in_call = True
        elif message is not None:
            await upstream.add_message(message)
        else:
            for call_id, output in outputs:
                await upstream.send_function_output(call_id, output)
        self.requested_at = time.perf_counter()
        await upstream.start_response()
        await self.voice_in.flush(
            upstream, hears=self.link.hears
        )  # speech held meanwhile barges in on it
        self.in_call = False

    async def open(self, *, flush: bool = True) -> Upstream:
        """The open upstream, or a fresh one whose context is rebuilt from history;
        without ``flush``, audio held while it opened waits for the caller's request."""
        upstream = self.link.upstream
        if upstream is not None:
            return upstream
        self.in_call = True
        upstream = await self._open_current()
        # A listening session reconfigured while it opened (a WebRTC call's first
        # ``session.update`` turning its microphone on) would keep hearing with the
        # old setup until a turn of its own reopened it: opened again, as
        # ``_apply_setup`` reopens an idle one. Audio held meanwhile waits for it.
        while flush and self.gives_way():
            self.replace_connection()
            upstream = await self._open_current()
        if not flush:
            self.voice_in.hold_until_flush()
            self.in_call = False
            return upstream  # the request's sender flushes (or the pump, if it was superseded)
        try:
            await self.voice_in.flush(upstream, hears=self.link.hears)
        except BaseException:
            self.drop(stop=False)
            raise
        self.in_call = False
        return upstream

    def _request(self) -> OpenRequest:
        """How a connection for the session's setup as it is now is opened."""
        session = self.session
        setup = session.setup
        config = setup.config
        return OpenRequest(
            setup.upstream_factory,
            setup.system_prompt,
            setup.instructions,
            session.voice,
            session.speaking_voice,
            ModelOptions(truncation=config.truncation, reasoning_effort=config.reasoning_effort),
        )

    def outdated(self) -> bool:
        """The open connection was opened for an earlier setup and told the provider
        something the session's setup no longer says (instructions, tools, voice,
        model). One that would be opened alike now serves the new setup: the machine
        notes it, so neither a listening session nor the next request reopens it (the
        audio the provider holds stays heard; the Agents SDK sends its session.update
        twice, the second while a recording is already in)."""
        machine = self.machine
        if self.link.upstream is None or not machine.opened_stale:
            return False
        if self.link.opened_as != self.link.opening_as(self._request()):
            return True
        machine.feed(Opened(machine.setup, kept=True))
        return False

    def gives_way(self) -> bool:
        """Between turns, the open connection is ``outdated`` and a new one would lose
        nothing it holds (``SpokenAnswer.reopen_loses``: speech under way, an answer
        still playing): let it go, and the next read opens one for the setup. Else
        it waits for the turn that speech starts, or for the answer to be played; or,
        when updates come faster than ``ReopenBudget`` allows, until
        ``reopen_deferred_to``."""
        machine = self.machine
        self.reopen_deferred_to = None
        if not (machine.idle and not machine.spoken.reopen_loses and self.outdated()):
            return False
        now = asyncio.get_running_loop().time()
        due = self.reopens.due(now)
        if due > now:
            self.reopen_deferred_to = due  # a flood of updates: one replacement per while
            return False
        return True

    def replace_connection(self) -> None:
        """Let the open connection go for a new one (it is ``outdated``, or the history it
        was given changed); what it was sent of the user's audio and had not consumed
        is held for the next (``VoiceInput.replay_unconsumed``): the start of an
        utterance its VAD had not reported, or an utterance under way when a typed
        turn needs the new setup, is heard by the new connection."""
        if self.link.upstream is not None:  # none open (a forget after a loss): no cost
            self.reopens.spend(asyncio.get_running_loop().time())
        self.voice_in.replay_unconsumed()
        self.drop(stop=False)

    async def _open_current(self) -> Upstream:
        """A connection opened for the session's setup as it is now."""
        opened_for = self.machine.setup
        upstream, voiced = await self.link.open(self._request())
        self.voice_in.consumed()  # it has heard nothing yet; what is held is flushed to it
        # Nothing to do: the machine notes it (and where its speech offsets start).
        self.machine.feed(Opened(opened_for, audio_ms=self.voice_in.opened_at_ms))
        self.machine.voice = voiced
        return upstream

    async def commit_audio(self) -> None:
        upstream = self.link.upstream
        if upstream is None:
            raise UpstreamClosed("the connection that heard the speech is gone")
        self.in_call = True
        self.requested_at = time.perf_counter()
        await upstream.commit_audio()
        self.voice_in.consumed()
        self.in_call = False

    async def stop_response(self) -> None:
        upstream = self.link.upstream
        if upstream is None:
            raise UpstreamClosed("no upstream connection to stop a response on")
        self.in_call = True
        await upstream.cancel_response()
        self.in_call = False

    async def replace(self, text: str, heard_ms: int | None) -> None:
        await self._tell(lambda upstream: upstream.replace_response(text, heard_ms=heard_ms))

    async def add_note(self, content: str) -> None:
        await self._tell(lambda upstream: upstream.add_note(content))

    async def add_message(self, message: Message) -> None:
        await self._tell(lambda upstream: upstream.add_context(message))

    async def _tell(self, call: Callable[[Upstream], Awaitable[bool | None]]) -> None:
        """Best effort, no response asked for: with no connection open, nothing (the
        next request reopens from history, which says the same); one that is gone, or
        answers False (it cannot take this where it stands), is let go for that reason."""
        upstream = self.link.upstream
        if upstream is None:
            return
        self.in_call = True
        try:
            if await call(upstream) is False:
                self.drop(stop=False)
        except UpstreamClosed:
            self.drop(stop=False)
        self.in_call = False

    async def reopen_for(self, interrupt: Interrupt, then: Action | None) -> None:
        """An ``interrupt`` whose rerun opens a new connection says what the model keeps
        (``context``). Rerun at once (a takeover): the connection is opened first and
        the event says what happened; after a backoff (a lost connection): what will
        happen, by the resumption handle the session holds. Sent whether or not the
        open works (its failure is the rerun's own, reported as ever)."""
        try:
            if type(then) is Request:
                # The rerun's request goes first: audio the user sent meanwhile then
                # reaches the provider as live speech (it barges in), not before it.
                upstream = await self.open(flush=False)
                interrupt.context = "resumed" if upstream.resumed else "rebuilt"
            else:
                chosen = self.session.setup.upstream_factory.choose()
                interrupt.context = "resumed" if self.link.resume_for(chosen) else "rebuilt"
        finally:
            self.log.emit(interrupt)

    def drop(self, *, stop: bool) -> None:
        """Let the upstream go (closed in the background); its events read early go too."""
        self.heard.clear()
        self.link.drop(stop=stop)
