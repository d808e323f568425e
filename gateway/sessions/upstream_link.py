"""A session's connection to its provider: opened, resumed, told, let go.

The turn driver (``gateway.sessions.driver``) asks for the connection and
the link decides how it is made: which provider of the session's setup
answers (a fallback chain chooses), what the model is told (the text
protocol's prompt, or — for a model that only speaks — its instructions
with the tools declared natively), what it is given of the history (cut to
``context_tokens``), and whether the provider's own copy of the
conversation can be continued instead (``Resume``, by the handle the
session keeps: ``gateway.sessions.resumption``). A connection is let go in
the background, so a turn never waits for a close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.sessions.observer import TurnObserver
from gateway.sessions.recorder import SessionRecorder
from gateway.sessions.resumption import META_KEY, ResumePoint
from gateway.upstream.base import (
    ModelOptions,
    Resumable,
    Resume,
    Upstream,
    UpstreamEvent,
    UpstreamFactory,
    VoiceConfig,
)
from gateway.upstream.providers import facts
from protocol.assembly import HistoryItem, Message, assemble
from protocol.budget import context_tokens_estimate, fit
from protocol.prompt import native_prompt

__all__ = ["OpenRequest", "SilenceWatch", "UpstreamLink"]

log = logging.getLogger("gateway.sessions.runtime")

Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class OpenRequest:
    """What a connection is opened with: the provider's factory, the prompt of the text
    protocol, the session's instructions, and its voice (with and without speech out)."""

    __slots__ = ("factory", "instructions", "options", "speaking", "system_prompt", "voice")

    def __init__(
        self,
        factory: UpstreamFactory,
        system_prompt: str,
        instructions: str,
        voice: VoiceConfig | None,
        speaking: Callable[[], VoiceConfig | None],
        options: ModelOptions | None = None,
    ) -> None:
        self.factory = factory
        self.options = options
        self.system_prompt = system_prompt
        self.instructions = instructions
        self.voice = voice
        self.speaking = speaking  # the voice for a model that only speaks

    def voice_for(self, factory: UpstreamFactory) -> VoiceConfig | None:
        """The voice a connection to ``factory``'s model is opened with. A model that
        only speaks answers a text session with the transcript of its speech; it is
        told no text protocol and calls its tools natively (``speaking``)."""
        voice = self.voice
        if facts(factory.wire, factory.model).answers == "audio" and (
            voice is None or voice.audio_out is None
        ):
            return self.speaking()
        return voice

    @property
    def opens_as(self) -> tuple[object, ...]:
        """What the provider is told at open: two requests equal here open the same
        connection (a configure that changes none of it keeps the open one)."""
        factory = self.factory
        return (
            factory.provider,
            factory.model,
            self.system_prompt,
            self.instructions,
            self.voice_for(factory),
            self.options,
        )


class UpstreamLink:
    """The session's upstream connection (see the module docstring)."""

    def __init__(
        self,
        sid: str,
        history: list[HistoryItem],
        *,
        observer: TurnObserver,
        context_tokens: int,
        spawn: Spawn,
        remember: Callable[[dict[str, str]], Coroutine[Any, Any, None]],
        clock: Callable[[], float],
        resume: ResumePoint | None = None,
    ) -> None:
        self.sid = sid
        self._history = history
        self._observer = observer
        self._context_tokens = context_tokens
        self._spawn = spawn
        self._remember = remember
        self._clock = clock
        self.upstream: Upstream | None = None
        self.provider = ""  # the provider of the connection opened last
        self.opened_as: tuple[object, ...] = ()  # what the connection was opened as
        self.hears = False  # the open connection takes the user's audio (VoiceConfig.audio_in)
        # The provider's own copy of the conversation, to continue on the next connection,
        # and where its positions are in the history (position at a turn's end → items).
        self._resume_point = resume
        self._positions: dict[int, int] = {}
        self.recorder: SessionRecorder | None = None  # the session records its frames
        # A running response's reads (the driver sets the session's upstream_stall_timeout).
        self.silence = SilenceWatch(30.0)

    # ------------------------------------------------------------------ opening

    async def open(self, request: OpenRequest) -> tuple[Upstream, bool]:
        """A new connection (its context rebuilt from history, or resumed); returns it and
        whether it carries the user's voice or the model's (the turn machine's ``voice``)."""
        chosen = request.factory.choose()
        self.provider = chosen.provider
        # Priced and traced as the provider that answers (after a fallback: not the primary).
        self._observer.provider = chosen.provider
        self._observer.model = chosen.model
        upstream = chosen.create()
        if self.recorder is not None:
            upstream.tap_frames(self.recorder.connected(chosen.provider, chosen.model))
        voice = request.voice_for(chosen)
        speaks = voice is not None and voice.audio_out is not None
        prompt = native_prompt(request.instructions) if speaks else request.system_prompt
        resume = self.resume_for(chosen)
        with self._observer.connect():
            await upstream.open(
                prompt, self._context(prompt), voice=voice, resume=resume, options=request.options
            )
        point = self._resume_point
        # What the provider holds now, in history items: its position's anchor.
        held = point.items if resume is not None and upstream.resumed and point else 0
        self._positions = {upstream.position: held}
        self.upstream = upstream
        self.opened_as = self.opening_as(request)
        self.hears = voice is not None and voice.audio_in is not None
        return upstream, voice is not None

    def opening_as(self, request: OpenRequest) -> tuple[object, ...]:
        """What a connection opened now for ``request`` would be: what the provider is
        told, and whether the session's recorder taps its frames (tapped at open)."""
        return (*request.opens_as, self.recorder is not None)

    def resume_for(self, chosen: UpstreamFactory) -> Resume | None:
        """How a connection to ``chosen`` continues the provider's copy; None: from history."""
        point = self._resume_point
        if point is None:
            return None
        return point.resume(chosen.provider, chosen.model, self._history, self._clock())

    def _context(self, system_prompt: str) -> list[Message]:
        """The history a new upstream connection is given, cut to ``context_tokens``.

        A long session replayed whole on every reconnect or takeover costs time
        and tokens and may not fit the model's context at all (``protocol.budget``).
        """
        messages = assemble(self._history)
        budget = self._context_tokens
        if not budget:
            return messages
        prompt = context_tokens_estimate(system_prompt)
        kept = fit(messages, max(0, budget - prompt))
        if len(kept) < len(messages):
            log.info(
                "session %s: replaying %d of %d messages (context budget %d tokens)",
                self.sid,
                len(kept),
                len(messages),
                budget,
            )
        return kept

    # ------------------------------------------------------------------ resumption

    def turn_ended(self) -> None:
        """A turn's end: the provider's position now holds the whole history."""
        upstream = self.upstream
        if upstream is not None:
            self._positions[upstream.position] = len(self._history)
            while len(self._positions) > 16:
                self._positions.pop(next(iter(self._positions)))

    def resumable(self, offer: Resumable) -> None:
        """The provider offers a handle to its copy of the conversation: kept with the
        session, if it was given at the end of a turn (its history items are known)."""
        items = self._positions.get(offer.position)
        if items is None:
            return  # given between two steps of a turn: the next turn's end brings another
        point = ResumePoint(self.provider, self._observer.model, offer.handle, items, self._clock())
        self._resume_point = point
        self._spawn(self._remember({META_KEY: point.encode()}), f"meta:{self.sid}")

    # ------------------------------------------------------------------ letting go

    def drop(self, *, stop: bool) -> Upstream | None:
        """Let the connection go; it is closed in the background, so the turn does not wait.
        Returns the connection let go (None: there was none)."""
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            self._spawn(_discard(upstream, stop=stop), f"discard-upstream:{self.sid}")
        return upstream

    async def close(self) -> None:
        self.silence.close()
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            await _discard(upstream, stop=True)


async def _discard(upstream: Upstream, *, stop: bool) -> None:
    """Close an upstream we let go; ``stop``: first stop its response (so it stops billing)."""
    if stop:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(upstream.cancel_response(), 2.0)
    with contextlib.suppress(Exception):
        await upstream.close()


class SilenceWatch:
    """A running response's reads, watched for a provider gone silent (a hung or
    dripping connection: ``upstream_stall_timeout``).

    One timer per watch, re-armed lazily: a read only notes the loop time it
    started (a voice answer reads fifty frames a second, and a fresh
    ``asyncio.timeout`` per read cost 4 µs of each); the timer, when it fires,
    looks whether anything came since and moves itself to the new deadline, or
    cuts the read that has waited ``seconds``. ``heard`` counts output taken
    outside ``recv`` (the text fast path's deltas, ``Upstream.stream_text_to``):
    a read during which those came is not silence. A cut read loses nothing:
    the adapters' reads are cancellation-safe (the wait for a cancelled
    response's end relies on it too).
    """

    __slots__ = ("_cut", "_heard_at_check", "_reader", "_since", "_timer", "heard", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.heard = 0
        self._since = 0.0  # loop time the current read started, or output was last heard
        self._reader: asyncio.Task[Any] | None = None  # the task in ``recv``, if any
        self._timer: asyncio.TimerHandle | None = None
        self._heard_at_check = 0
        self._cut = False  # the timer cancelled the reader

    async def recv(self, upstream: Upstream) -> UpstreamEvent | None:
        """The upstream's next event; None: nothing came for ``seconds``."""
        loop = asyncio.get_running_loop()
        reader = asyncio.current_task()
        assert reader is not None
        self._since = loop.time()
        self._reader = reader
        if self._timer is None:
            self._timer = loop.call_at(self._since + self.seconds, self._check)
        try:
            return await upstream.recv()
        except asyncio.CancelledError:
            if self._cut:
                self._cut = False
                if reader.uncancel() == 0:  # only the timer asked: the read timed out
                    return None
            raise
        finally:
            self._reader = None

    def _check(self) -> None:
        """The timer: cut a read that has heard nothing for ``seconds``, or re-arm."""
        self._timer = None
        reader = self._reader
        if reader is None or reader.done():
            return  # no read waits: the next one arms the timer again
        loop = reader.get_loop()
        now = loop.time()
        if self.heard != self._heard_at_check:  # the fast path took output meanwhile
            self._heard_at_check = self.heard
            self._since = max(self._since, now)
        deadline = self._since + self.seconds
        if now < deadline:
            self._timer = loop.call_at(deadline, self._check)
            return
        self._cut = True
        reader.cancel()

    def close(self) -> None:
        """No more reads: the timer goes (a session that ended holds no handle)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
