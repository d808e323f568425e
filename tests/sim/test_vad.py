"""The simulator's VAD and transcript, without sockets."""

from __future__ import annotations

import tracemalloc

from gateway.common.pcm import silence, tone
from gateway.sim.model import SimCall, speech_transcript, spoken_reply
from gateway.sim.vad import SpeechSpan, Vad, VadStart, VadStop

RATE = 16000


def run(vad: Vad, pcm: bytes, chunk: int) -> list[VadStart | VadStop]:
    events: list[VadStart | VadStop] = []
    for at in range(0, len(pcm), chunk):
        events += vad.feed(pcm[at : at + chunk])
    return events


def test_speech_between_silences_in_any_chunking() -> None:
    pcm = silence(0.5, RATE) + tone(1.2, RATE) + silence(0.7, RATE)
    expected = [VadStart(500), VadStop(2200, 1200)]
    for chunk in (2, 320, 999, 4000, len(pcm)):
        assert run(Vad(RATE, threshold=500), pcm, chunk) == expected


def test_short_blips_and_quiet_sound_are_not_speech() -> None:
    blip = silence(0.3, RATE) + tone(0.06, RATE) + silence(0.6, RATE)
    quiet = tone(1.0, RATE, amplitude=300)  # RMS ~212
    assert Vad(RATE, threshold=500).feed(blip + quiet) == []


def test_a_short_pause_does_not_end_speech() -> None:
    pcm = tone(0.5, RATE) + silence(0.3, RATE) + tone(0.5, RATE) + silence(0.6, RATE)
    assert Vad(RATE, threshold=500, silence_ms=500).feed(pcm) == [
        VadStart(0),
        VadStop(1800, 1300),
    ]


def test_knobs_change_what_counts() -> None:
    pcm = tone(0.15, RATE) + silence(0.3, RATE)
    assert Vad(RATE, threshold=500, min_speech_ms=200).feed(pcm) == []
    assert Vad(RATE, threshold=500, silence_ms=200).feed(pcm) == [VadStart(0), VadStop(360, 160)]


def speech_ms(pcm: bytes, rate: int, *, threshold: float) -> int:
    span = SpeechSpan(rate, threshold=threshold)
    span.feed(pcm)
    return span.speech_ms


def test_manual_buffer_measure_and_transcript() -> None:
    pcm = silence(0.2, RATE) + tone(0.74, RATE) + silence(0.2, RATE)
    assert speech_ms(pcm, RATE, threshold=500) == 740
    assert speech_transcript(740) == "(speech 0.7 s)"
    assert speech_transcript(760) == "(speech 0.8 s)"
    assert speech_transcript(1200) == "(speech 1.2 s)"
    assert speech_ms(silence(1, RATE), RATE, threshold=500) == 0


def test_spoken_replies() -> None:
    assert spoken_reply("hi") == "Echo: hi"
    assert spoken_reply("/raw Just this.") == "Just this."
    assert spoken_reply('/tool w {"a": 1}', frozenset({"w"})) == SimCall("w", '{"a": 1}')
    assert spoken_reply("/tool w {}") == "I have no tool named w."


def test_a_manual_buffer_is_measured_the_same_however_it_is_cut() -> None:
    pcm = silence(0.2, RATE) + tone(0.74, RATE) + silence(0.2, RATE)
    for step in (7, 333, 960, 4801):
        span = SpeechSpan(RATE, threshold=500)
        for at in range(0, len(pcm), step):
            span.feed(pcm[at : at + step])
        assert span.speech_ms == 740, step
        assert span.heard_ms == len(pcm) // 2 / (RATE / 1000)
    span.clear()
    assert (span.speech_ms, span.heard_ms) == (0, 0)


def test_a_manual_buffer_never_committed_keeps_no_audio() -> None:
    # A client with turn detection off that appends and never commits: the
    # simulator (inside the README's node) kept all of it, 300 MB, until it left.
    second = tone(1.0, RATE)
    span = SpeechSpan(RATE, threshold=500)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(600):  # ten minutes of speech
            span.feed(second)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert span.speech_ms == 600_000
    assert grown < 100_000, f"{grown} bytes kept for ten minutes of appends"
