"""Voice input: what a session's configuration asks of the upstream for audio, and
the user's audio on its way there.

``voice_config`` (pure): a ``SessionConfig`` (``input_audio``, ``output``,
``voice``) and the session's tools become the adapters' ``VoiceConfig``, or
``None`` for a text session. ``VoiceInput``: the user's audio sent to the
upstream, held while it opens (``HeldAudio``), let go while a failed open
is waited out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import Final

from gateway.upstream.base import (
    AudioIn,
    AudioOut,
    FunctionTool,
    Upstream,
    UpstreamClosed,
    UpstreamFactory,
    VoiceConfig,
)
from gateway.upstream.providers import SIM
from protocol.configuration import SessionConfig
from protocol.events import Error
from protocol.prompt import ToolSpec

__all__ = ["HELD_AUDIO_SECONDS", "HeldAudio", "VoiceInput", "voice_config"]

log = logging.getLogger("gateway.sessions.runtime")

# A voice session listening between turns whose upstream cannot be opened
# retries after these many seconds (doubling from the first, up to the cap):
# at once in a loop it held a core at 100% and told the client nothing.
LISTEN_RETRY_FIRST: Final = 0.5
LISTEN_RETRY_CAP: Final = 10.0

HELD_AUDIO_SECONDS = 5.0
"""At most this much of the user's audio is held while the upstream opens
(a provider answers an open in well under a second)."""

UNCONSUMED_AUDIO_SECONDS: Final = 0.5
"""The newest audio a connection was sent that its provider has not consumed (no
speech ended or commit since) is kept this long, and as long as
``HELD_AUDIO_SECONDS`` while the provider reports speech under way or the client
commits its turns (push-to-talk). A connection replaced for a new setup
(``VoiceInput.replay_unconsumed``) then loses nothing of an utterance whose start
its VAD had not reported yet (OpenAI's default prefix padding, 300 ms, and the
detection itself), nor (up to the longer bound) of one it had. Not longer: the
frames are kept by reference, about 24 KB per listening 24 kHz session, and a
second of them cost the node 4-10% more CPU per frame (voice_cost_bench, 50
sessions, interleaved: the frames' memory no longer reused while hot)."""

RECORDING_WAIT: Final = 15.0
"""Seconds a recording's chunk held while the upstream opens waits to be sent,
its sender's reading with it, before only its newest ``HELD_AUDIO_SECONDS`` stay."""


def _unconsumed_kept(audio_in: AudioIn | None, *, speech: bool) -> int:
    """Bytes of unconsumed audio kept for a replacing connection: ``HELD_AUDIO_SECONDS``
    while speech is under way, or when the client commits (push-to-talk: the whole
    buffer waits for its commit); ``UNCONSUMED_AUDIO_SECONDS`` otherwise."""
    if audio_in is None:
        return 0
    long = speech or audio_in.turn_detection == "none"
    return int(audio_in.rate * (HELD_AUDIO_SECONDS if long else UNCONSUMED_AUDIO_SECONDS)) * 2


def voice_config(
    config: SessionConfig,
    tools: Sequence[ToolSpec],
    *,
    speaks_only: bool = False,
    background: frozenset[str] = frozenset(),
    client: frozenset[str] = frozenset(),
) -> VoiceConfig | None:
    """The upstream's voice configuration for ``config``; ``None``: no audio either way.

    In audio output the text protocol's markers would be spoken, so the
    session's tools are declared natively (``FunctionTool``) and the model's
    calls come back as function calls. ``speaks_only``: the model answers in
    audio only (``gateway.upstream.models``), so a text session asks for
    audio too and takes its transcript as the answer (the audio is dropped).
    ``background``, ``client``: the names of the tools that run in the background,
    and of those the session's client declared.
    """
    audio = config.input_audio
    client_hears = config.output == "audio"
    speaks = client_hears or speaks_only
    if audio is None and not speaks:
        return None
    return VoiceConfig(
        audio_in=None
        if audio is None
        else AudioIn(
            rate=audio.rate,
            turn_detection=audio.turn_detection,
            eagerness=audio.eagerness,
            idle_timeout_ms=audio.idle_timeout_ms,
            threshold=audio.threshold,
            prefix_padding_ms=audio.prefix_padding_ms,
            silence_duration_ms=audio.silence_duration_ms,
            noise_reduction=audio.noise_reduction,
        ),
        audio_out=AudioOut(voice=config.voice, speed=config.speed, to_client=client_hears)
        if speaks
        else None,
        tools=tuple(
            FunctionTool(
                name=t.name,
                description=t.description,
                parameters=t.parameters,
                background=t.name in background,
                client=t.name in client,
            )
            for t in tools
        )
        if speaks
        else (),
    )


class HeldAudio:
    """The user's audio that came while the session's upstream was being opened.

    A client starts talking as soon as it has sent ``configure``, and the
    provider's connection takes a moment to open (after ``configure``, after
    a reconnect or a takeover): audio dropped meanwhile was the start of the
    user's sentence. It is held here in order, and sent before any newer
    audio once the connection is open. Past ``limit`` bytes the oldest goes:
    the provider's VAD needs the newest audio most.

    A chunk of ``whole_from`` bytes or more (a second of audio: a recording's
    slice, not a microphone's frame) is held ``whole``: a recording sent right
    after connecting is heard from its start, not only its last five seconds.
    Its sender waits until it is sent (``VoiceInput.send``), so at most one is
    held per connection sending; ``trim`` lets it go to the limit when the wait
    ends otherwise.

    ``replayed``: of the oldest bytes held, how many a connection replaced for a new
    setup was sent already (``replay``); they count once in the session's audio.
    """

    __slots__ = ("_chunks", "dropped", "held", "limit", "replayed", "whole", "whole_from")

    def __init__(self, limit: int, whole_from: int | None = None) -> None:
        self._chunks: deque[tuple[bytes, bool]] = deque()  # (PCM16, held whole)
        self.limit = limit
        self.whole_from = whole_from if whole_from is not None else limit + 1
        self.held = 0  # bytes held now
        self.whole = 0  # of them, in chunks held whole
        self.dropped = 0  # bytes let go for the limit since the last ``clear``
        self.replayed = 0  # the oldest bytes held, sent to a connection before

    @classmethod
    def for_rate(cls, rate: int, seconds: float = HELD_AUDIO_SECONDS) -> HeldAudio:
        """Room for ``seconds`` of PCM16 mono at ``rate``; a second's chunk is held whole."""
        return cls(int(rate * seconds) * 2, whole_from=rate * 2)

    def hold(self, pcm16: bytes, *, whole: bool = False) -> None:
        if whole:
            self._chunks.append((pcm16, True))
            self.held += len(pcm16)
            self.whole += len(pcm16)
            return
        room = self.limit - self.limit % 2  # whole PCM16 samples
        if len(pcm16) > room:  # a recording's slice: its newest part, not none of it
            self.dropped += len(pcm16) - room
            pcm16 = pcm16[len(pcm16) - room :]
        self._chunks.append((pcm16, False))
        self.held += len(pcm16)
        self._fit()

    def replay(self, chunks: Sequence[bytes]) -> None:
        """``chunks``, sent to a connection before, held ahead of what is held (the
        oldest of them go first if they do not fit)."""
        size = sum(map(len, chunks))
        self._chunks.extendleft((chunk, False) for chunk in reversed(chunks))
        self.held += size
        self.replayed += size
        room = self.limit - self.limit % 2
        if self.held - self.whole > room and len(self._chunks[0][0]) > room:
            # One chunk past the limit alone (a recording's slice): its newest part.
            oldest = self._chunks.popleft()[0]
            cut = len(oldest) - room
            self._chunks.appendleft((oldest[cut:], False))
            self.held -= cut
            self.replayed -= cut
            self.dropped += cut
        self._fit()

    def _fit(self) -> None:
        """Let the oldest audio not held whole go until the rest fits the limit."""
        chunks = self._chunks
        while self.held - self.whole > self.limit:
            index = next(i for i, (_, whole) in enumerate(chunks) if not whole)
            oldest = chunks[index][0]
            del chunks[index]
            self.held -= len(oldest)
            self.dropped += len(oldest)
            # Replayed chunks are the oldest held, and never whole: they go first.
            self.replayed -= min(self.replayed, len(oldest))

    def trim(self) -> None:
        """What was held whole is held as any audio is: only the newest fits."""
        if self.whole:
            chunks, self._chunks = self._chunks, deque()
            self.held = self.whole = 0
            replayed, self.replayed = self.replayed, 0
            for chunk, _ in chunks:
                self.hold(chunk)
            # What was dropped for the limit went from the oldest: the replayed first.
            self.replayed = max(0, replayed - (sum(map(len, (c for c, _ in chunks))) - self.held))

    def take(self) -> bytes | None:
        """The oldest chunk held, or ``None`` when none is left."""
        if not self._chunks:
            return None
        chunk, whole = self._chunks.popleft()
        self.held -= len(chunk)
        if whole:
            self.whole -= len(chunk)
        self.replayed -= min(self.replayed, len(chunk))
        return chunk

    def clear(self) -> None:
        self._chunks.clear()
        self.held = 0
        self.whole = 0
        self.dropped = 0
        self.replayed = 0


class VoiceInput:
    """The user's audio on its way to the session's upstream: sent, held, or let go.

    Audio goes straight to the provider when a connection is open (without
    awaiting when the socket takes it at once: the relay's fast path). While
    one is being opened it is held (``HeldAudio``) and sent first once it is
    open. While a failed open is waited out (``listen_failed``'s backoff:
    the one wait a listening voice session keeps outside the turn machine,
    because no turn runs), audio is not held: the client was told it is not
    heard. ``audio_in`` is the configuration of the audio taken (None: the
    session takes none).
    """

    __slots__ = (
        "_failures",
        "_heard_at",
        "_held",
        "_holding",
        "_sent_bytes",
        "_sent_ms_before",
        "_sent_whole",
        "_unconsumed",
        "_unconsumed_bytes",
        "_unconsumed_limit",
        "_unflushed",
        "_waited_out",
        "audio_in",
        "sid",
    )

    def __init__(self, sid: str, audio_in: AudioIn | None) -> None:
        self.sid = sid
        self.audio_in = audio_in
        self._held = HeldAudio.for_rate(audio_in.rate) if audio_in is not None else None
        self._holding = True
        self._sent_whole = asyncio.Event()  # set: no chunk is held whole
        self._sent_whole.set()
        # A recording's chunk waited ``RECORDING_WAIT`` in vain: until the next flush,
        # its later chunks do not wait each in turn (a 250 s append is 16 of them).
        self._waited_out = False
        # An open upstream that must not hear the user yet (``hold_until_flush``).
        self._unflushed = False
        self._heard_at = -math.inf  # time.monotonic() of the user's last audio
        self._failures = 0  # opens of a listening session's upstream that failed in a row
        # The audio the session's connections were sent (``sent_ms``): bytes at the
        # current rate, and ms at the rates before it.
        self._sent_bytes = 0
        self._sent_ms_before = 0
        # What the open connection was sent since its provider last consumed its input
        # (a speech end, a commit), newest ``_unconsumed_limit`` bytes, for
        # ``replay_unconsumed``.
        self._unconsumed: deque[bytes] = deque()
        self._unconsumed_bytes = 0
        self._unconsumed_limit = _unconsumed_kept(audio_in, speech=False)

    @property
    def sent_ms(self) -> int:
        """Milliseconds of the user's audio the session's upstream connections were sent
        (on this node), each byte once."""
        audio_in = self.audio_in
        rate_ms = self._sent_bytes * 500 // audio_in.rate if audio_in is not None else 0
        return self._sent_ms_before + rate_ms

    @property
    def opened_at_ms(self) -> int:
        """Where a connection opened now hears from in the session's audio
        (``sent_ms``, less what is held to be sent to it again: ``replay_unconsumed``)."""
        audio_in = self.audio_in
        held = self._held
        if audio_in is None or held is None:
            return self.sent_ms
        return self._sent_ms_before + (self._sent_bytes - held.replayed) * 500 // audio_in.rate

    def reconfigure(self, audio_in: AudioIn | None, *, speech: bool = False) -> None:
        """Another input configuration: audio held (or kept unconsumed) at another rate
        is gone. ``speech``: the provider reported speech it has not ended
        (``SpokenAnswer.speech_open``), which keeps its longer bound at the same rate."""
        before = self.audio_in
        if audio_in is None or before is None or audio_in.rate != before.rate:
            self._sent_ms_before, self._sent_bytes = self.sent_ms, 0
            self._held = HeldAudio.for_rate(audio_in.rate) if audio_in is not None else None
            self._sent_whole.set()
            self._consumed()
            speech = False  # what is heard at the new rate is heard anew
        self.audio_in = audio_in
        self._unconsumed_limit = _unconsumed_kept(audio_in, speech=speech)

    def speech_began(self) -> None:
        """The provider hears speech: its audio is kept until the speech ends (up to
        ``HELD_AUDIO_SECONDS``), so a connection replaced meanwhile hears it whole."""
        self._unconsumed_limit = _unconsumed_kept(self.audio_in, speech=True)

    def consumed(self) -> None:
        """The provider took what it was sent (a speech end, a commit), or a new
        connection opened: a connection replaced from now on needs none of it."""
        self._consumed()
        self._unconsumed_limit = _unconsumed_kept(self.audio_in, speech=False)

    def _consumed(self) -> None:
        self._unconsumed.clear()
        self._unconsumed_bytes = 0

    def replay_unconsumed(self) -> None:
        """The open connection is about to be replaced for a new setup: what it was sent
        and has not consumed (the start of speech its VAD has not reported yet, speech
        under way, an uncommitted push-to-talk buffer) is held for the next one, before
        anything held already. Its speech offsets start that much earlier
        (``opened_at_ms``); what is not sent to it again still counts once."""
        held = self._held
        if held is not None and self._unconsumed:
            held.replay(self._unconsumed)
        self._consumed()

    def quiet_for(self, seconds: float) -> bool:
        """No audio from this node's clients for ``seconds`` (no live microphone here)."""
        return time.monotonic() - self._heard_at >= seconds

    async def send(self, upstream: Upstream | None, pcm16: bytes, *, hears: bool = True) -> None:
        """User audio to ``upstream``, or held while none is open. An open upstream that
        does not ``hear`` (opened before the session took audio, for the turn running
        then) gets none: the audio is dropped, as ``flush`` drops it for one."""
        if self.audio_in is None:
            return
        self._heard_at = time.monotonic()
        if upstream is None or self._unflushed:
            if self._is_whole(pcm16):
                await self._hold_whole(pcm16)
            else:
                self._hold(pcm16)
            return
        if not hears:
            return
        try:
            await upstream.send_audio(pcm16)
        except UpstreamClosed:
            return  # the driver's recv sees the loss and reopens
        self._sent(pcm16)

    def send_now(self, upstream: Upstream | None, pcm16: bytes, hears: bool = True) -> bool:
        """``send`` without awaiting when the socket takes it at once (or the audio is
        held, or dropped); False: nothing was sent, await ``send``."""
        if self.audio_in is None:
            return False
        self._heard_at = time.monotonic()
        if upstream is None or self._unflushed:
            if self._is_whole(pcm16):
                return False  # held by ``send``, which waits until it is sent
            self._hold(pcm16)
            return True
        if not hears:
            return True
        if upstream.send_audio_now(pcm16):
            # ``_sent``, inlined: this is every microphone frame's path. Once a second is
            # kept, each frame lets the oldest go (frames are alike: one is enough).
            size = len(pcm16)
            self._sent_bytes += size
            unconsumed = self._unconsumed
            unconsumed.append(pcm16)
            kept = self._unconsumed_bytes + size
            limit = self._unconsumed_limit
            if kept > limit and len(unconsumed) > 1:
                kept -= len(unconsumed.popleft())
            self._unconsumed_bytes = kept
            if kept > limit:
                self._forget_oldest()
            return True
        return False

    def _sent(self, pcm16: bytes) -> None:
        """``pcm16`` went to the open connection: counted, and kept until consumed."""
        self._sent_bytes += len(pcm16)
        self._unconsumed.append(pcm16)
        self._unconsumed_bytes += len(pcm16)
        if self._unconsumed_bytes > self._unconsumed_limit:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        unconsumed = self._unconsumed
        while self._unconsumed_bytes > self._unconsumed_limit and len(unconsumed) > 1:
            self._unconsumed_bytes -= len(unconsumed.popleft())
        if self._unconsumed_bytes <= self._unconsumed_limit:
            return
        most = _unconsumed_kept(self.audio_in, speech=True)
        if self._unconsumed_bytes > most:
            # One chunk past all a new connection could be sent (a recording's slice):
            # its newest part, not the whole slice kept until the next frame.
            unconsumed[0] = unconsumed[0][-most:]
            self._unconsumed_bytes = most

    def _is_whole(self, pcm16: bytes) -> bool:
        held = self._held
        return (
            held is not None
            and self._holding
            and not self._waited_out
            and len(pcm16) >= held.whole_from
        )

    async def _hold_whole(self, pcm16: bytes) -> None:
        """A recording's chunk while the upstream opens: held whole, and its sender (the
        connection's reader) waits until it is sent, so the next waits in the socket,
        not in memory. Past ``RECORDING_WAIT`` only the newest audio stays held."""
        held = self._held
        assert held is not None
        held.hold(pcm16, whole=True)
        self._sent_whole.clear()
        try:
            async with asyncio.timeout(RECORDING_WAIT):
                await self._sent_whole.wait()
        except TimeoutError:
            self._waited_out = True  # the rest of the recording is held as a microphone's
        finally:
            # Not sent: waited out, or its sender went away. Held whole no longer.
            if not self._sent_whole.is_set() and held is self._held:
                was_full = held.dropped
                held.trim()
                self._sent_whole.set()
                self._warn_dropped(held, was_full)

    def _warn_dropped(self, held: HeldAudio, was_full: int) -> None:
        if held.dropped and not was_full:
            log.warning(
                "session %s: the upstream is still opening; only the newest %gs of the "
                "user's audio is held for it",
                self.sid,
                HELD_AUDIO_SECONDS,
                extra={"sid": self.sid},
            )

    async def clear(self, upstream: Upstream | None, factory: UpstreamFactory) -> Error | None:
        """Discard the audio not yet committed: held here, and buffered by the provider
        where its API can (the ``clear_audio`` control); why not, otherwise."""
        if self.audio_in is None:
            return Error(
                code="bad_frame",
                content="clear_audio discards the user's audio: configure input_audio first",
            )
        if "clear_audio" not in factory.controls:
            name = factory.provider
            if name == SIM:
                name = f"{SIM} (its {factory.wire} flavour)"
            return Error(
                code="bad_frame",
                content=f"provider {name} cannot discard audio it was sent (the API has no "
                "clear of its input): stop sending the audio instead, or pick a provider "
                'that has it (docs/providers.md, "Session controls")',
            )
        self._let_go()
        self._consumed()
        if upstream is not None and not self._unflushed:
            with contextlib.suppress(UpstreamClosed):  # a new connection heard none of it
                await upstream.clear_audio()
        return None

    def _hold(self, pcm16: bytes) -> None:
        held = self._held
        if held is None or not self._holding:
            return
        was_full = held.dropped
        held.hold(pcm16)
        self._warn_dropped(held, was_full)

    @property
    def unflushed(self) -> bool:
        """An open upstream waits for the audio held for it (``hold_until_flush``)."""
        return self._unflushed

    def hold_until_flush(self) -> None:
        """An upstream is open but must not hear the user yet (a rerun's request goes
        first): audio is held for it, as while it opened, until ``flush``."""
        self._unflushed = True

    async def flush(self, upstream: Upstream, *, hears: bool = True) -> None:
        """The audio held while ``upstream`` was opened, oldest first; audio that comes
        meanwhile is held behind it, so the order holds. An upstream that does not
        ``hear`` (reopened for a configuration without input audio while the user still
        spoke) gets none: what was held is dropped, as speech to a text session is."""
        held = self._held
        if held is None or not hears:
            self._let_go()
            self._unflushed = False
            return
        self._unflushed = True  # what comes during an await below queues behind
        try:
            while True:
                replayed = held.replayed
                chunk = held.take()
                if chunk is None:
                    break
                again = replayed - held.replayed  # of it, counted when first sent
                if not upstream.send_audio_now(chunk):
                    await upstream.send_audio(chunk)
                self._sent(chunk)
                self._sent_bytes -= again
        finally:
            self._unflushed = False
        self._let_go()
        self._waited_out = False
        self._failures = 0

    def listen_failed(self) -> tuple[bool, float]:
        """A listening session's upstream could not be opened: ``(first failure in a
        row, seconds to wait)``. Audio of the wait is not held (the client is told)."""
        self._failures += 1
        failures = self._failures
        self._let_go()
        self._holding = False
        return failures == 1, min(LISTEN_RETRY_FIRST * 2 ** (failures - 1), LISTEN_RETRY_CAP)

    def _let_go(self) -> None:
        """What is held goes (sent, or dropped): a recording's sender waits no more."""
        if self._held is not None:
            self._held.clear()
        self._sent_whole.set()

    def listen_again(self) -> None:
        """The wait after a failed open is over: audio is held again."""
        self._holding = True

    def stop(self) -> None:
        self._holding = False
        self._sent_whole.set()  # the session is over: a recording's sender waits no more
