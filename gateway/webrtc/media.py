"""A WebRTC call's audio: the model's speech as an outgoing track, the microphone as PCM.

aiortc's own codec work stays off the event loop: the receiver decodes Opus
in its own thread (``RTCRtpReceiver``'s decoder thread) and the sender
encodes in the loop's default executor (``RTCRtpSender``). What runs on the
loop here is per 20 ms frame: one soxr resampling of the model's 24 kHz
speech to 48 kHz (microseconds) and slicing bytes; the microphone's 48 kHz
goes into the session as it is, so the gateway converts it once, to the
provider's rate. tests/webrtc/test_calls.py measures the loop's stall.

Barge-in at the media layer: ``cut()`` drops what is queued at once, and
says how much of the answer went out on the track (the played position is
what was sent, not what a client reports).
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from gateway.upstream.audio import Resampler
from protocol.audio import OUTPUT_RATE
from protocol.events import Played

__all__ = ["RATE", "Speaker", "microphone"]

RATE: Final = 48000  # Opus's clock: the track's rate both ways
_PTIME: Final = 0.020
_SAMPLES: Final = int(RATE * _PTIME)  # 960 per 20 ms frame
_FRAME_BYTES: Final = _SAMPLES * 2
_TIME_BASE: Final = fractions.Fraction(1, RATE)


class Speaker(MediaStreamTrack):
    """The outgoing track: the model's speech, paced at real time, silence between."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._resampler = Resampler(OUTPUT_RATE, RATE)
        self._queue: collections.deque[tuple[int, memoryview]] = collections.deque()
        self._queued = 0  # bytes in the queue
        self._start = 0.0
        self._pts = -1
        self._tag = 0  # the tag of the newest answer audio sent
        self._answer_bytes = 0  # of the current answer, sent on the track
        self._reported = 0  # _answer_bytes last reported by progress()
        self.sent_frames = 0
        self.speech_frames = 0

    @property
    def queued_ms(self) -> int:
        return self._queued * 1000 // (RATE * 2)

    def answer_started(self) -> None:
        """A new response: its played position counts from zero."""
        self._answer_bytes = self._reported = 0

    def progress(self) -> Played | None:
        """The answer's played position if it moved 100 ms or more since the last report."""
        if self._answer_bytes - self._reported < RATE * 2 // 10:
            return None
        self._reported = self._answer_bytes
        return Played(seq=self._tag, ms=self._answer_bytes * 1000 // (RATE * 2))

    def play(self, tag: int, pcm16: bytes) -> None:
        """Queue the model's speech (24 kHz PCM16), tagged as the gateway tagged it."""
        out = self._resampler.push(pcm16)
        if out:
            self._queue.append((tag, memoryview(out)))
            self._queued += len(out)

    def cut(self) -> Played | None:
        """Drop what is queued now; what of the answer went out, if any did."""
        self._queue.clear()
        self._queued = 0
        if self._answer_bytes == 0:
            return None
        ms = self._answer_bytes * 1000 // (RATE * 2)
        self._answer_bytes = self._reported = 0
        return Played(seq=self._tag, ms=ms)

    def _take(self) -> bytes:
        out = bytearray()
        queue = self._queue
        while queue and len(out) < _FRAME_BYTES:
            tag, chunk = queue[0]
            n = min(_FRAME_BYTES - len(out), len(chunk))
            out += chunk[:n]
            self._tag = tag
            if n == len(chunk):
                queue.popleft()
            else:
                queue[0] = (tag, chunk[n:])
        self._queued -= len(out)
        if out:
            self._answer_bytes += len(out)
            self.speech_frames += 1
        if len(out) < _FRAME_BYTES:
            out += bytes(_FRAME_BYTES - len(out))
        return bytes(out)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._pts < 0:
            self._start = time.monotonic()
            self._pts = 0
        else:
            self._pts += _SAMPLES
            wait = self._start + self._pts / RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        frame = AudioFrame(format="s16", layout="mono", samples=_SAMPLES)
        frame.planes[0].update(self._take())
        frame.pts = self._pts
        frame.sample_rate = RATE
        frame.time_base = _TIME_BASE
        self.sent_frames += 1
        return frame


async def microphone(track: MediaStreamTrack) -> AsyncIterator[bytes]:
    """The remote audio track as 48 kHz mono PCM16, frame by frame, until it ends.

    aiortc's Opus decoder gives packed s16 stereo at 48 kHz: the left channel
    is taken (a browser's microphone is mono, sent as two equal channels). A
    track at another rate (a G.711 offer) is converted to 48 kHz.
    """
    resampler: Resampler | None = None
    while True:
        try:
            frame: Any = await track.recv()
        except MediaStreamError:
            return
        samples = frame.to_ndarray()
        channels = len(frame.layout.channels)
        if frame.format.name != "s16":
            continue  # aiortc's decoders give s16; anything else is not audio we know
        pcm = samples[0, ::channels].tobytes() if channels > 1 else samples.tobytes()
        if frame.sample_rate != RATE:
            if resampler is None or resampler.in_rate != frame.sample_rate:
                resampler = Resampler(frame.sample_rate, RATE)
            pcm = resampler.push(pcm)
        yield pcm
