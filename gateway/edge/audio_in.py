"""A client's microphone: the user's audio from one connection to its session.

A microphone sends 50 frames a second. The common frame is handed to the
session's upstream without awaiting (``now``), from the socket's read callback
when the reader waits (``take``: no task resumed per 20 ms frame, which was a
third of the node's CPU per frame); the rest go through ``send``, which may
have to drive the session here first. A refusal (no input audio configured,
the session driven by another node) is answered at most every
``AUDIO_REFUSAL_EVERY`` seconds, not once per frame, and a connection whose
session is driven elsewhere asks for it at most every ``AUDIO_RETRY_EVERY``.

Audio is not counted against the connection's frame limit (a 20 ms microphone
alone sends 50 frames a second, that limit), but against a limit of its own
(``AUDIO_FRAMES_PER_SECOND``), checked before any other work on the frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Final, Protocol

import msgspec

from gateway.edge.frame_rate import FrameRate, Verdict, over_limit
from gateway.sessions.port import NodePort
from gateway.sessions.subscriber import DrivenSession
from gateway.store.base import StoreError
from protocol.client_frames import decode_client
from protocol.events import AudioChunk, Error

__all__ = [
    "AUDIO_FRAMES_PER_SECOND",
    "AUDIO_FRAME_BURST",
    "AUDIO_REFUSAL_EVERY",
    "AUDIO_RETRY_EVERY",
    "DRIVEN_ELSEWHERE",
    "AudioIn",
]

AUDIO_FRAMES_PER_SECOND: Final = 500
"""Audio frames a connection may send a second: a microphone sends 50 (20 ms frames) to
375 (each 128-sample quantum of an AudioWorklet at 48 kHz). Before it, one client sending
80,000 two-byte frames a second took a core and kept /healthz waiting over a second."""
AUDIO_FRAME_BURST: Final = 1000
"""Audio frames a connection may send at once: 20 s of 20 ms frames held back by a stall."""

AUDIO_REFUSAL_EVERY: Final = 2.0
AUDIO_RETRY_EVERY: Final = 0.25
DRIVEN_ELSEWHERE: Final = (
    "audio and configure need the session driven by the node this connection is on, and "
    "another node drives it; reconnect (with session_id and after) and send again"
)
_NEEDS_INPUT: Final = (
    "audio needs input audio configured first: send "
    '{"type": "configure", "input_audio": {"format": "pcm16", "rate": 24000}}'
)


class Microphoned(Protocol):
    """What the microphone needs of its connection (``ClientConnection``)."""

    node: NodePort
    driven: DrivenSession | None
    _close: tuple[int, str] | None  # a close is decided: its frames are not processed

    @property
    def sid(self) -> str: ...

    async def _runtime_for_command(self) -> DrivenSession | None: ...

    def _reply(self, error: Error) -> None: ...


class AudioIn:
    """One connection's microphone (see the module docstring)."""

    __slots__ = ("conn", "over", "rate", "refused_at", "retry_at")

    def __init__(self, conn: Microphoned) -> None:
        self.conn = conn
        self.refused_at = -math.inf  # monotonic time of the last audio refusal sent
        self.retry_at = -math.inf  # no drive attempt for audio before this
        self.rate = FrameRate(AUDIO_FRAMES_PER_SECOND, AUDIO_FRAME_BURST, time.monotonic())
        self.over: Verdict | None = None  # the read callback's verdict, left for the reader

    def verdict(self) -> Verdict:
        """The audio limit's verdict on the frame at hand (the read callback's, if it
        gave one for it)."""
        over, self.over = self.over, None
        return over if over is not None else self.rate.check(time.monotonic())

    def refusal(self) -> Error:
        advice = "send 20 ms of audio or more a frame"
        return Error(
            code="rate_limited", content=over_limit("audio frames", self.rate, advice, sized=False)
        )

    async def binary(self, pcm16: bytes) -> Verdict:
        """A binary frame of audio, relayed if the audio limit takes it."""
        verdict = self.verdict()
        if verdict is Verdict.ACCEPT and not self.now(pcm16):
            await self.send(pcm16)
        return verdict

    def now(self, pcm16: bytes) -> bool:
        """Handed to the session's upstream without awaiting (a runtime here, input
        audio on, the upstream socket able to take it); False leaves it to ``send``."""
        runtime = self.conn.driven
        return runtime is not None and runtime.send_audio_now(pcm16)  # False when closed

    async def send(self, pcm16: bytes, ref: str | msgspec.UnsetType = msgspec.UNSET) -> None:
        """User audio (a binary frame, or an ``audio`` frame's bytes and ``id``)."""
        conn = self.conn
        runtime = conn.driven
        if runtime is None or runtime.closed or runtime.voice is None:
            if time.monotonic() < self.retry_at:
                return  # refused a moment ago: not a store round trip per frame
            runtime = await conn._runtime_for_command()
            if runtime is None:
                self.retry_at = time.monotonic() + AUDIO_RETRY_EVERY
                with contextlib.suppress(StoreError):
                    # Voice is driven where the microphone is: ask for the session.
                    await conn.node.ask_to_hand_over(conn.sid)
                self.refuse(Error(code="turn_active", content=DRIVEN_ELSEWHERE, reply_to=ref))
                return
        voice = runtime.voice
        if voice is None or voice.audio_in is None:
            self.refuse(Error(code="bad_frame", content=_NEEDS_INPUT, reply_to=ref))
            return
        await runtime.send_audio(pcm16)

    def refuse(self, error: Error) -> None:
        """Answer refused audio once per ``AUDIO_REFUSAL_EVERY``, not once per frame
        (a microphone's 50 errors a second say nothing more than the first)."""
        now = time.monotonic()
        if now - self.refused_at >= AUDIO_REFUSAL_EVERY:
            self.refused_at = now
            self.conn._reply(error)

    def take(self, data: bytes, text: bool) -> bool:
        """The read callback's offer of a frame while the reader waits (``wsfast``'s
        intercept): audio the session's upstream takes at once is relayed from here;
        anything else (and audio the fast path cannot take) goes to the reader. Only
        an empty queue is offered, so frames keep their order."""
        conn = self.conn
        if conn._close is not None:
            return False
        if not text:  # a binary frame: ``now``, inlined (50 a second per microphone)
            runtime = conn.driven
            if runtime is None or not self.within():
                return False
            if runtime.send_audio_now(data):
                self.over = None  # the frame is done with: its verdict is not the next one's
                return True
            return False
        if b'"audio"' not in data:
            return False
        message = decode_client(data)
        return (
            isinstance(message, AudioChunk)
            and self.within()
            and self.taken(self.now(message.audio))
        )

    def within(self) -> bool:
        """Within the audio limit (the reader is left the verdict, so a frame is
        counted once: refused, or not taken at once and sent by the reader)."""
        verdict = self.over = self.rate.check(time.monotonic())
        return verdict is Verdict.ACCEPT

    def taken(self, relayed: bool) -> bool:
        if relayed:
            self.over = None  # the frame is done with: its verdict is not the next one's
        return relayed

    async def json(self, frame: str) -> Verdict | None:
        """Handle an ``{"type": "audio"}`` text frame (the audio limit's verdict); None
        for any other frame. Only frames that name ``"audio"`` are decoded first."""
        message = decode_client(frame)
        if not isinstance(message, AudioChunk):
            return None
        verdict = self.verdict()
        if verdict is Verdict.ACCEPT and not self.now(message.audio):
            await self.send(message.audio, message.id)
        await asyncio.sleep(0)
        return verdict
