"""A call's audio both ways: the one place μ-law meets the session's PCM16.

Carriers stream G.711 μ-law at 8 kHz (``protocol.media_stream``). In: each
``media`` payload is decoded to PCM16 at 8 kHz and handed to the session as
a client's audio (its ``input_audio.rate`` is ``CALL_RATE``), and the
upstream adapter resamples it to its provider's rate, as it does for any
client (``gateway.upstream.audio.Resampler``). Out: the session's speech
(PCM16 at ``protocol.audio.OUTPUT_RATE``) is resampled to 8 kHz, streamed
(the filter's state is kept between chunks, and dropped when the caller
stops hearing an answer), and encoded to μ-law.

``tests/bench/phone_audio_bench.py`` measures the CPU of a 20 ms frame each
way, the adapter's resampling included (docs/phone.md).

``dtmf_tones``: keys as the tones a telephone makes (ITU-T Q.23: a row and
a column frequency together), for ``send_dtmf``, which plays them into the
call: a media stream has no message that sends keys.
"""

from __future__ import annotations

from typing import Final

from gateway.common.pcm import mulaw_decode, mulaw_encode, silence
from gateway.upstream.audio import Resampler
from protocol.audio import OUTPUT_RATE

__all__ = ["CALL_RATE", "DTMF_KEYS", "CallAudio", "dtmf_tones"]

CALL_RATE: Final = 8000
"""Hz of a carrier's μ-law audio, both ways."""


class CallAudio:
    """One call's converter: the caller's μ-law to PCM16, the session's speech to μ-law."""

    __slots__ = ("_down",)

    def __init__(self) -> None:
        self._down = Resampler(OUTPUT_RATE, CALL_RATE)

    @staticmethod
    def heard(mulaw: bytes) -> bytes:
        """The caller's audio as PCM16 at ``CALL_RATE`` (what the session takes)."""
        return mulaw_decode(mulaw)

    def spoken(self, pcm16: bytes) -> bytes:
        """A chunk of the session's speech (PCM16 at ``OUTPUT_RATE``) as μ-law at 8 kHz."""
        return mulaw_encode(self._down.push(pcm16))

    @staticmethod
    def keys(keys: str) -> bytes:
        """Telephone keys as μ-law tones (``dtmf_tones``; ``ValueError`` if not keys)."""
        return mulaw_encode(dtmf_tones(keys))

    def cut(self) -> None:
        """The caller stopped hearing the answer (``clear``): the next starts afresh."""
        self._down = Resampler(OUTPUT_RATE, CALL_RATE)


# ITU-T Q.23: each key is its row's low tone with its column's high tone.
_ROWS: Final = (697.0, 770.0, 852.0, 941.0)
_COLUMNS: Final = (1209.0, 1336.0, 1477.0, 1633.0)
_KEYPAD: Final = ("123A", "456B", "789C", "*0#D")
DTMF_KEYS: Final = frozenset("".join(_KEYPAD))
"""The keys ``dtmf_tones`` plays (and ``w``, a half-second pause)."""
TONE_S: Final = 0.1
GAP_S: Final = 0.1
PAUSE_S: Final = 0.5  # "w", as Twilio's <Play digits> reads it


def dtmf_tones(keys: str, rate: int = CALL_RATE) -> bytes:
    """``keys`` as PCM16 at ``rate``: 100 ms of each key's two tones, 100 ms apart;
    ``w`` is a half-second pause. Raises ``ValueError`` naming a key it cannot play."""
    import numpy as np

    parts: list[bytes] = []
    t = np.arange(round(TONE_S * rate)) / rate
    for key in keys.upper():
        if key == "W":
            parts.append(silence(PAUSE_S, rate))
            continue
        row = next((i for i, line in enumerate(_KEYPAD) if key in line), None)
        if row is None:
            raise ValueError(f"{key!r} is not a telephone key: use 0-9, *, #, A-D and w (a pause)")
        low, high = _ROWS[row], _COLUMNS[_KEYPAD[row].index(key)]
        wave = (np.sin(2 * np.pi * low * t) + np.sin(2 * np.pi * high * t)) * 6000
        parts.append(wave.astype("<i2").tobytes())
        parts.append(silence(GAP_S, rate))
    return b"".join(parts)
