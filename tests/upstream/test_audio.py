"""PCM16 helpers: resampling keeps length and pitch, WAV files read as mono PCM16."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from gateway.common.pcm import duration_ms, last_loud_frame, read_wav, rms, silence, tone
from gateway.upstream.audio import Resampler


def peak_hz(pcm: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[int(np.argmax(spectrum))])


@pytest.mark.parametrize(("src", "dst"), [(48000, 24000), (24000, 16000), (16000, 24000)])
def test_streamed_resampling_keeps_duration_and_pitch(src: int, dst: int) -> None:
    pcm = tone(1.0, src, frequency=440)
    resampler = Resampler(src, dst)
    size = src // 50 * 2  # 20 ms
    out = b"".join(resampler.push(pcm[at : at + size]) for at in range(0, len(pcm), size))
    out += resampler.flush()
    assert duration_ms(out, dst) == pytest.approx(1000, abs=1)
    assert peak_hz(out, dst) == pytest.approx(440, abs=2)
    assert rms(out) == pytest.approx(rms(pcm), rel=0.02)


def test_same_rate_is_a_pass_through() -> None:
    pcm = tone(0.1, 16000)
    assert Resampler(16000, 16000).push(pcm) is pcm


@pytest.mark.parametrize(("src", "dst"), [(16000, 24000), (24000, 24000)])
def test_frames_cut_mid_sample_keep_the_samples_in_step(src: int, dst: int) -> None:
    """A client frame of an odd byte count: the stray byte joins the next frame."""
    pcm = tone(1.0, src, frequency=440)
    resampler = Resampler(src, dst)
    size = src // 50 * 2 + 1  # 20 ms and one byte: every other frame ends mid-sample
    pieces = [resampler.push(pcm[at : at + size]) for at in range(0, len(pcm), size)]
    assert all(len(piece) % 2 == 0 for piece in pieces)
    out = b"".join(pieces) + resampler.flush()
    assert duration_ms(out, dst) == pytest.approx(1000, abs=1)
    assert peak_hz(out, dst) == pytest.approx(440, abs=2)  # misaligned samples would be noise


def test_rms() -> None:
    assert rms(silence(0.1, 16000)) == 0
    assert rms(tone(0.1, 16000, amplitude=1000)) == pytest.approx(1000 / 2**0.5, rel=0.01)
    assert rms(b"") == 0


def test_read_wav_mixes_stereo_down(tmp_path: Path) -> None:
    left = np.frombuffer(tone(0.1, 8000), dtype="<i2")
    stereo = np.stack([left, np.zeros_like(left)], axis=1).astype("<i2").tobytes()
    path = tmp_path / "s.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(stereo)
    pcm, rate = read_wav(path)
    assert rate == 8000
    assert duration_ms(pcm, rate) == 100
    assert rms(pcm) == pytest.approx(rms(left.tobytes()) / 2, rel=0.01)


def test_read_wav_refuses_8_bit(tmp_path: Path) -> None:
    path = tmp_path / "b.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(1)
        wav.setframerate(8000)
        wav.writeframes(bytes(800))
    with pytest.raises(ValueError, match="16-bit"):
        read_wav(path)


def test_the_speech_of_a_recording_ends_at_its_last_loud_frame() -> None:
    rate = 16000
    noise = (np.random.default_rng(1).normal(0, 30, rate).astype("<i2")).tobytes()  # 1 s of room
    speech = silence(0.3, rate) + tone(0.5, rate) + noise
    assert last_loud_frame(speech, rate) == (300 + 500) // 20 - 1
    assert last_loud_frame(tone(0.1, rate), rate) == 4
    assert last_loud_frame(silence(1.0, rate), rate) == -1
    assert last_loud_frame(b"", rate) == -1
