"""What a call measured: first audio in either order, barge-ins, what the call cost."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.phone.meter import CallMeter
from gateway.phone.metrics import PhoneMetrics
from protocol.events import Usage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def meter(clock: Clock) -> CallMeter:
    return CallMeter(
        PhoneMetrics(CollectorRegistry()), Usage(input=10, output=5), 0.5, clock, clock
    )


def test_first_audio_is_measured_whichever_comes_first() -> None:
    clock = Clock()
    call = meter(clock)
    call.speech_stopped(1000.0)
    clock.now = 1000.25
    call.answer_began()  # the event came first
    clock.now = 1005.0
    call.answer_began()  # audio overtook the next event…
    call.speech_stopped(1004.9)  # …that says the speech stopped 100 ms before it
    call.speech_stopped(1010.0)  # a speech end nothing answered: no figure
    assert call.first_audio_ms == [250, 100]


def test_the_end_says_what_the_call_cost_and_how_it_went() -> None:
    clock = Clock()
    call = meter(clock)
    call.barged_in(clock.now)
    clock.now += 62.5
    figures = call.ended(talk_ms=21_000, usage=Usage(input=110, output=25), cost=0.75)
    assert figures.duration_ms == 62_500
    assert figures.talk_ms == 21_000 and figures.barge_ins == 1
    assert figures.usage == Usage(input=100, output=20)
    assert figures.cost == 0.25
