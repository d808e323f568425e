"""PCM16 helpers: loudness, durations, test signals, WAV files.

Every audio buffer in the gateway is raw PCM16: signed 16-bit little-endian
samples, mono, at a rate carried beside it (the providers' wire format: OpenAI
Realtime takes and gives 24 kHz, Gemini Live takes 16 kHz and gives 24 kHz).
``bytes`` rather than arrays at the seams, so a frame can go from a client
socket to a provider (base64) with no conversion when the rates agree.

The clients (``gateway.client``: chat, loadtest), the simulator and the
upstream adapters all use these, so they import nothing of ours and sit on
the lowest floor; resampling, which only the upstream side does, is
``gateway.upstream.audio.Resampler``.

G.711 μ-law (``mulaw_decode``, ``mulaw_encode``) is here too: it is how
telephone carriers send PCM (8-bit companded samples at 8 kHz), and both the
gateway's phone edge and the carrier simulator of the client package use it.
Two lookup tables, built once with numpy on first use: 256 entries to
decode, 65,536 (one per PCM16 sample) to encode, so a 20 ms frame is one
numpy ``take`` each way. They equal CPython's ``audioop.ulaw2lin`` /
``lin2ulaw`` (removed in Python 3.13) on every input
(``tests/phone/test_audio.py``).

numpy is imported on first use, not with this module: numpy and soxr
together cost ~0.3 s of import time (measured with ``python -X importtime``),
and every node, simulator, client and test subprocess imports this module
while most never touch audio.
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any, Final

__all__ = [
    "SAMPLE_DTYPE",
    "SAMPLE_WIDTH",
    "duration_ms",
    "frame_energy",
    "last_loud_frame",
    "mulaw_decode",
    "mulaw_encode",
    "read_wav",
    "resample",
    "rms",
    "silence",
    "tone",
]

SAMPLE_WIDTH: Final = 2  # bytes per PCM16 sample

SAMPLE_DTYPE: Final = "<i2"  # PCM16 little-endian, as a numpy dtype


def duration_ms(pcm16: bytes | bytearray | memoryview, rate: int) -> float:
    """How long ``pcm16`` plays at ``rate`` samples per second, in milliseconds."""
    return len(pcm16) // SAMPLE_WIDTH * 1000.0 / rate


def rms(pcm16: bytes | bytearray | memoryview) -> float:
    """Root mean square of the samples (0 for silence, 32767 at most): the loudness a VAD uses."""
    import numpy as np

    samples = np.frombuffer(pcm16, dtype=SAMPLE_DTYPE, count=len(pcm16) // SAMPLE_WIDTH)
    if not samples.size:
        return 0.0
    values = samples.astype(np.float64)
    return float(np.sqrt(np.dot(values, values) / samples.size))


def frame_energy(pcm16: bytes | bytearray | memoryview, size: int) -> Any:
    """Each whole ``size``-sample frame's sum of squared samples (exact integers, a
    numpy array), a few thousand frames at a time. A frame at a time (``rms``), five
    minutes of audio (one 15 MiB append) held the loop ~36 ms; in float64 at once,
    ~30 ms and a 60 MB copy; squared in int32 (32768² fits) and summed in int64, ~9."""
    import numpy as np

    count = len(pcm16) // SAMPLE_WIDTH // size if size > 0 else 0
    samples = np.frombuffer(pcm16, dtype=SAMPLE_DTYPE, count=count * size).reshape(count, size)
    out = np.empty(count, dtype=np.int64)
    for at in range(0, count, 4096):
        block = samples[at : at + 4096]
        out[at : at + 4096] = np.square(block, dtype=np.int32).sum(axis=1, dtype=np.int64)
    return out


def last_loud_frame(pcm16: bytes, rate: int, *, frame_ms: int = 20, floor: float = 0.1) -> int:
    """The index of the last ``frame_ms`` frame louder than ``floor`` × the loudest
    frame's RMS (−20 dB by default): where a recording's speech ends, whatever
    silence or room noise follows it; -1 when every frame is silent.

    Relative to the recording's own loudness, not to a provider's VAD
    threshold, which the client does not know.
    """
    import numpy as np

    size = rate * frame_ms // 1000
    samples = np.frombuffer(pcm16, dtype=SAMPLE_DTYPE, count=len(pcm16) // SAMPLE_WIDTH)
    count = -(-samples.size // size) if size else 0
    if not count:
        return -1
    padded = np.zeros(count * size, dtype=np.float64)
    padded[: samples.size] = samples
    frames = padded.reshape(count, size)
    loudness = np.sqrt((frames * frames).mean(axis=1))
    peak = float(loudness.max())
    if peak <= 0.0:
        return -1
    return int(np.flatnonzero(loudness > peak * floor)[-1])


def tone(duration_s: float, rate: int, *, frequency: float = 440.0, amplitude: int = 8000) -> bytes:
    """A sine tone: the simulator's "voice", and the tests' "speech"."""
    import numpy as np

    count = round(duration_s * rate)
    phase = 2.0 * np.pi * frequency * np.arange(count) / rate
    return (np.sin(phase) * amplitude).astype(SAMPLE_DTYPE).tobytes()


def silence(duration_s: float, rate: int) -> bytes:
    """``duration_s`` seconds of zero samples."""
    return bytes(round(duration_s * rate) * SAMPLE_WIDTH)


def read_wav(path: str | Path) -> tuple[bytes, int]:
    """A WAV file's audio as mono PCM16 and its rate.

    Stereo (or more) is mixed down to mono; only 16-bit PCM files are read —
    convert others first (e.g. ``sox in.wav -b 16 out.wav``).
    """
    with wave.open(str(path), "rb") as wav:
        width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
        if width != SAMPLE_WIDTH or wav.getcomptype() != "NONE":
            raise ValueError(
                f"{path}: only 16-bit PCM WAV files are read (this one has {8 * width}-bit "
                f"samples, compression {wav.getcomptype()!r}); convert it to 16-bit PCM first"
            )
        data = wav.readframes(wav.getnframes())
    if channels > 1:
        import numpy as np

        frames = np.frombuffer(data, dtype=SAMPLE_DTYPE).reshape(-1, channels)
        data = frames.mean(axis=1).round().astype(SAMPLE_DTYPE).tobytes()
    return data, rate


# --- G.711 μ-law ---------------------------------------------------------------------

_MULAW_BIAS: Final = 0x84 >> 2  # added to a 14-bit magnitude before the segment search
_MULAW_CLIP: Final = 8159  # the largest 14-bit magnitude encoded
_MULAW_SEGMENT_ENDS: Final = (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF)
_mulaw_tables: tuple[Any, Any] | None = None


def _tables() -> tuple[Any, Any]:
    """(decode: 256 int16, encode: 65,536 uint8 indexed by the sample's uint16 bits)."""
    global _mulaw_tables
    if _mulaw_tables is None:
        import numpy as np

        codes = np.arange(256, dtype=np.int32)
        inverted = ~codes & 0xFF
        exponent = (inverted >> 4) & 0x07
        mantissa = inverted & 0x0F
        magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
        decode = np.where(inverted & 0x80, -magnitude, magnitude).astype(SAMPLE_DTYPE)

        # Encoding works on 14-bit samples, as G.711's reference code (and audioop) does.
        samples = np.arange(65536, dtype=np.int32)
        samples = np.where(samples >= 32768, samples - 65536, samples) >> 2
        negative = samples < 0
        value = np.minimum(np.where(negative, -samples, samples), _MULAW_CLIP) + _MULAW_BIAS
        # The segment: the first end (0x3F, 0x7F, … 0x1FFF) at or above the value.
        segment = np.searchsorted(_MULAW_SEGMENT_ENDS, value, side="left")
        nibble = (value >> (np.minimum(segment, 7) + 1)) & 0x0F
        code = np.where(segment >= 8, 0x7F, (segment << 4) | nibble)
        encode = (code ^ np.where(negative, 0x7F, 0xFF)).astype(np.uint8)
        _mulaw_tables = (decode, encode)
    return _mulaw_tables


def mulaw_decode(mulaw: bytes | bytearray | memoryview) -> bytes:
    """G.711 μ-law bytes (one a sample) as PCM16 at the same rate."""
    import numpy as np

    decode, _ = _tables()
    return bytes(decode.take(np.frombuffer(mulaw, dtype=np.uint8)).tobytes())


def mulaw_encode(pcm16: bytes | bytearray | memoryview) -> bytes:
    """PCM16 as G.711 μ-law bytes (one a sample; an odd last byte is dropped)."""
    import numpy as np

    _, encode = _tables()
    samples = np.frombuffer(pcm16, dtype="<u2", count=len(pcm16) // SAMPLE_WIDTH)
    return bytes(encode.take(samples).tobytes())


def resample(pcm16: bytes, in_rate: int, out_rate: int) -> bytes:
    """A whole recording at another rate (soxr, one call): for files and test signals.

    A stream cut in chunks needs the filter's state between them:
    ``gateway.upstream.audio.Resampler`` keeps it.
    """
    if in_rate == out_rate:
        return pcm16
    import numpy as np
    import soxr

    samples = np.frombuffer(pcm16, dtype=SAMPLE_DTYPE, count=len(pcm16) // SAMPLE_WIDTH)
    out: Any = soxr.resample(samples, in_rate, out_rate)
    return bytes(out.astype(SAMPLE_DTYPE).tobytes())
