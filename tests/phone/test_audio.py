"""The call's audio: G.711 μ-law both ways, the converter, the keys' tones."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gateway.common.pcm import mulaw_decode, mulaw_encode, rms, tone
from gateway.phone.audio import CALL_RATE, CallAudio, dtmf_tones
from protocol.audio import OUTPUT_RATE

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # CPython's G.711, removed in 3.13: the reference the tables must equal


def test_mulaw_decoding_equals_cpythons_on_every_code() -> None:
    codes = bytes(range(256))
    assert mulaw_decode(codes) == audioop.ulaw2lin(codes, 2)


def test_mulaw_encoding_equals_cpythons_on_every_sample() -> None:
    every = np.arange(-32768, 32768, dtype="<i2").tobytes()
    assert mulaw_encode(every) == audioop.lin2ulaw(every, 2)


def test_mulaw_is_one_byte_a_sample_and_survives_a_round_trip() -> None:
    speech = tone(0.1, CALL_RATE, amplitude=8000)
    coded = mulaw_encode(speech)
    assert len(coded) == len(speech) // 2
    back = np.frombuffer(mulaw_decode(coded), dtype="<i2").astype(float)
    original = np.frombuffer(speech, dtype="<i2").astype(float)
    # μ-law keeps about 2-3% of the magnitude: the tone is the same tone.
    assert np.abs(back - original).max() < 0.05 * 8000


def test_the_sessions_speech_becomes_8khz_mulaw_of_the_same_length() -> None:
    audio = CallAudio()
    second = tone(1.0, OUTPUT_RATE)
    out = b"".join(audio.spoken(second[at : at + 960]) for at in range(0, len(second), 960))
    # 1 s at 8 kHz, but for the samples the resampler's filter still holds (~21 ms).
    assert 7800 <= len(out) <= 8000
    assert rms(mulaw_decode(out[800:])) == pytest.approx(rms(second), rel=0.05)


def test_a_cut_drops_what_the_filter_held() -> None:
    audio = CallAudio()
    audio.spoken(tone(0.1, OUTPUT_RATE))
    audio.cut()
    silent = audio.spoken(bytes(960))
    assert rms(mulaw_decode(silent)) == 0


def test_keys_are_two_tones_then_a_gap_and_w_waits() -> None:
    one = dtmf_tones("1")
    assert len(one) == 2 * round(0.2 * CALL_RATE)
    samples = np.frombuffer(one[: round(0.1 * CALL_RATE) * 2], dtype="<i2").astype(float)
    spectrum = np.abs(np.fft.rfft(samples))
    freqs = np.fft.rfftfreq(len(samples), 1 / CALL_RATE)
    peaks = sorted(freqs[np.argsort(spectrum)[-2:]])
    assert peaks == pytest.approx([697, 1209], abs=15)  # "1": row 697 Hz, column 1209 Hz
    assert len(dtmf_tones("1w2")) == len(one) * 2 + 2 * round(0.5 * CALL_RATE)
    with pytest.raises(ValueError, match="'X' is not a telephone key"):
        dtmf_tones("1X")
    assert len(CallAudio.keys("#")) == len(one) // 2
