"""The simulator's voice activity detector: loudness over time, nothing cleverer.

Speech starts when 20 ms frames stay louder than a threshold (RMS of the
PCM16 samples) for ``min_speech_ms``; it stops after ``silence_ms`` of quieter
frames. Deterministic and sans-I/O: ``Vad.feed`` takes audio in any chunking
and returns what it detected, with offsets in milliseconds of all audio fed
(so a test that streams a 1.2 s tone between silences gets the same events
however it cuts the stream). Both providers' simulated server VAD run it.
"""

from __future__ import annotations

from typing import Final

import msgspec

from gateway.common.pcm import SAMPLE_WIDTH, frame_energy, rms

__all__ = ["FRAME_MS", "SpeechSpan", "Vad", "VadStart", "VadStop"]

FRAME_MS: Final = 20


class VadStart(msgspec.Struct, frozen=True):
    """Speech began ``offset_ms`` into the audio (the start of its first loud frame)."""

    offset_ms: int


class VadStop(msgspec.Struct, frozen=True):
    """Speech ended: detected at ``offset_ms`` (after the silence), ``speech_ms`` long."""

    offset_ms: int
    speech_ms: int


class Vad:
    """Energy-based speech detection over one PCM16 stream at ``rate``."""

    __slots__ = (
        "_frame_bytes",
        "_loud_run",
        "_min_speech",
        "_pending",
        "_quiet_run",
        "_silence",
        "frames",
        "last_loud_end",
        "rate",
        "speaking",
        "start_frame",
        "threshold",
    )

    def __init__(
        self, rate: int, *, threshold: float, min_speech_ms: int = 100, silence_ms: int = 500
    ) -> None:
        self.rate = rate
        self._frame_bytes = rate * FRAME_MS // 1000 * SAMPLE_WIDTH
        self.threshold = threshold
        self._min_speech = max(1, -(-min_speech_ms // FRAME_MS))
        self._silence = max(1, -(-silence_ms // FRAME_MS))
        self._pending = bytearray()
        self.frames = 0  # frames analysed so far
        self.speaking = False
        self._loud_run = 0
        self._quiet_run = 0
        self.start_frame = 0
        self.last_loud_end = 0  # frame number after the last loud frame

    def feed(self, pcm16: bytes) -> list[VadStart | VadStop]:
        """Analyse ``pcm16`` (any length); the events it completed, in order."""
        self._pending += pcm16
        size = self._frame_bytes
        events: list[VadStart | VadStop] = []
        whole = len(self._pending) // size
        if whole == 1:  # a microphone's frame: the common case
            self._frame(rms(self._pending[:size]) > self.threshold, events)
        elif whole:  # a recording sent whole: every frame's loudness in one numpy pass
            # rms > threshold, without a square root per frame: sum of squares > threshold² × n
            n = size // SAMPLE_WIDTH
            floor = _loud_floor(self.threshold, n)
            for loud in (frame_energy(self._pending, n) > floor).tolist():
                self._frame(loud, events)
        del self._pending[: whole * size]
        return events

    def _frame(self, loud: bool, events: list[VadStart | VadStop]) -> None:
        self.frames += 1
        if loud:
            self._loud_run += 1
            self._quiet_run = 0
            self.last_loud_end = self.frames
            if not self.speaking and self._loud_run >= self._min_speech:
                self.speaking = True
                self.start_frame = self.frames - self._loud_run
                events.append(VadStart(self.start_frame * FRAME_MS))
            return
        self._loud_run = 0
        if self.speaking:
            self._quiet_run += 1
            if self._quiet_run >= self._silence:
                self.speaking = False
                self._quiet_run = 0
                speech = (self.last_loud_end - self.start_frame) * FRAME_MS
                events.append(VadStop(self.frames * FRAME_MS, speech))

    def end_after(self, silence_ms: int) -> None:
        """Speech ends after ``silence_ms`` of quiet from now on (a session's VAD setting)."""
        self._silence = max(1, -(-silence_ms // FRAME_MS))

    def reset(self) -> None:
        """Forget any speech in progress (the buffer was committed or cleared); offsets go on."""
        self._pending.clear()
        self.speaking = False
        self._loud_run = 0
        self._quiet_run = 0


class SpeechSpan:
    """How much audio a manual buffer holds and the speech in it, without keeping the audio.

    What a manually committed buffer (no server VAD) is heard as: from its first
    loud frame to the end of its last one. Measured as the audio comes, so a
    client that appends and never commits costs a few counters, not the audio
    (it kept 300 MB, all of a client's appends, until the connection ended), and
    a commit measures nothing (the whole buffer at once held the loop).
    """

    __slots__ = (
        "_floor",
        "_frame_bytes",
        "_pending",
        "first_loud",
        "frames",
        "last_loud_end",
        "rate",
        "size",
    )

    def __init__(self, rate: int, *, threshold: float) -> None:
        self.rate = rate
        samples = rate * FRAME_MS // 1000
        self._frame_bytes = samples * SAMPLE_WIDTH
        self._floor = _loud_floor(threshold, samples)
        self._pending = bytearray()  # less than a frame, waiting for the rest of it
        self.size = 0  # bytes heard
        self.frames = 0  # whole frames measured
        self.first_loud: int | None = None
        self.last_loud_end = 0  # frame number after the last loud frame

    def feed(self, pcm16: bytes) -> None:
        self.size += len(pcm16)
        self._pending += pcm16
        whole = len(self._pending) // self._frame_bytes
        if not whole:
            return
        import numpy as np

        samples = self._frame_bytes // SAMPLE_WIDTH
        loud = np.flatnonzero(frame_energy(self._pending, samples) > self._floor)
        if loud.size:
            if self.first_loud is None:
                self.first_loud = self.frames + int(loud[0])
            self.last_loud_end = self.frames + int(loud[-1]) + 1
        self.frames += whole
        del self._pending[: whole * self._frame_bytes]

    @property
    def heard_ms(self) -> float:
        """The audio's length, whole frames or not."""
        return self.size // SAMPLE_WIDTH / (self.rate / 1000)

    @property
    def speech_ms(self) -> int:
        """First loud frame to the end of the last one; 0 if no frame was loud."""
        if self.first_loud is None:
            return 0
        return (self.last_loud_end - self.first_loud) * FRAME_MS

    def clear(self) -> None:
        self._pending.clear()
        self.size = self.frames = self.last_loud_end = 0
        self.first_loud = None


def _loud_floor(threshold: float, samples: int) -> float:
    """A frame of ``samples`` is loud when its sum of squares passes this: rms >
    threshold without a square root per frame (-1: every frame is)."""
    return threshold * threshold * samples if threshold >= 0 else -1.0
