"""What one call measured: its length, its barge-ins, each answer's first audio, its cost.

The figures a ``phone_call`` ``ended`` event carries (``PhoneCallMetrics``)
and the phone edge's Prometheus metrics observe. Speech end → first audio
is taken from the logged ``speech_stopped`` event's timestamp to the
answer's first audio sent to the carrier: audio is not logged, so it may
reach the call before the event does, and either order is measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from gateway.phone.metrics import PhoneMetrics
from protocol.events import PhoneCallMetrics, Usage

__all__ = ["CallMeter"]

MAX_FIRST_AUDIO_SAMPLES: Final = 200
"""At most this many answers' first-audio figures are kept in a call's event."""


class CallMeter:
    """One call's figures (see the module docstring)."""

    __slots__ = (
        "_answer_began",
        "_clock",
        "_cost",
        "_metrics",
        "_started",
        "_stopped",
        "_usage",
        "_wall",
        "barge_ins",
        "first_audio_ms",
    )

    def __init__(
        self,
        metrics: PhoneMetrics,
        usage: Usage,
        cost: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._metrics = metrics
        self._usage = usage  # the session's at the call's start
        self._cost = cost
        self._clock = clock
        self._wall = wall
        self._started = clock()
        self._stopped: float | None = None  # the caller's speech end not answered yet
        self._answer_began: float | None = None  # this answer's first audio (wall time)
        self.barge_ins = 0
        self.first_audio_ms: list[int] = []

    def speech_stopped(self, stamp: float) -> None:
        """The caller stopped speaking (the event's wall-clock ``stamp``)."""
        began = self._answer_began
        if began is not None and began >= stamp:
            self._first_audio(began - stamp)  # the answer's audio overtook the event
        else:
            self._stopped = stamp

    def answer_began(self) -> None:
        """An answer's first audio goes to the carrier now."""
        now = self._wall()
        self._answer_began = now
        stopped, self._stopped = self._stopped, None
        if stopped is not None:
            self._first_audio(now - stopped)

    def barged_in(self, stamp: float) -> None:
        """The caller spoke over an answer (``speech_started`` at ``stamp``): cleared now."""
        self.barge_ins += 1
        self._metrics.barge_ins.inc()
        self._metrics.clear_after.observe(max(0.0, self._wall() - stamp))

    def _first_audio(self, seconds: float) -> None:
        self._metrics.first_audio.observe(seconds)
        if len(self.first_audio_ms) < MAX_FIRST_AUDIO_SAMPLES:
            self.first_audio_ms.append(round(seconds * 1000))

    def ended(self, talk_ms: int, usage: Usage, cost: float) -> PhoneCallMetrics:
        """The call's figures at its end (``usage``, ``cost``: the session's now)."""
        duration = self._clock() - self._started
        self._metrics.duration.observe(duration)
        self._metrics.talk.inc(talk_ms / 1000)
        before = self._usage
        return PhoneCallMetrics(
            duration_ms=round(duration * 1000),
            talk_ms=talk_ms,
            barge_ins=self.barge_ins,
            first_audio_ms=self.first_audio_ms,
            usage=Usage(
                input=usage.input - before.input,
                output=usage.output - before.output,
                cached=usage.cached - before.cached,
                input_audio=usage.input_audio - before.input_audio,
                output_audio=usage.output_audio - before.output_audio,
            ),
            cost=round(cost - self._cost, 9),
        )
