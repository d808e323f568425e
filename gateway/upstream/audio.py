"""Resampling PCM16 between a client's rate and the provider's (see ``gateway.common.pcm``).

Resampling is ``soxr`` (libsoxr, the SoX resampler): a ``Resampler`` keeps the
filter state between chunks, so a stream resampled chunk by chunk equals the
stream resampled whole (no clicks at chunk edges), and one 20 ms chunk costs a
few microseconds (``tests/bench/voice_bench.py`` prints the figure).

numpy and soxr are imported on first use, not with this module: together
they cost ~0.3 s of import time (measured with ``python -X importtime``), and
every node, simulator and test subprocess imports the adapters while most
never touch audio.
"""

from __future__ import annotations

from typing import Any

from gateway.common.pcm import SAMPLE_DTYPE

__all__ = ["Resampler"]


class Resampler:
    """Streaming PCM16 rate conversion (one per audio stream: it keeps filter state).

    ``Resampler(48000, 24000).push(chunk)`` returns the chunk at the new rate;
    ``flush()`` returns what the filter still holds at the end of a stream.
    The same rate in and out is a pass-through that copies nothing.
    """

    __slots__ = ("_carry", "_stream", "in_rate", "out_rate")

    def __init__(self, in_rate: int, out_rate: int, *, quality: str = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream: Any = None
        # A client's frame may end mid-sample (a JSON frame cut at an odd byte
        # count): that byte waits for the next frame instead of failing the stream.
        self._carry = b""
        if in_rate != out_rate:
            import soxr

            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16", quality=quality)

    def push(self, pcm16: bytes) -> bytes:
        """``pcm16`` at ``out_rate`` (possibly a few samples short: the filter's delay).

        Whole samples only: an odd byte at the end is kept and goes in front
        of the next chunk, so the provider always gets 16-bit samples in step.
        """
        if self._carry:
            pcm16 = self._carry + pcm16
            self._carry = b""
        if len(pcm16) & 1:
            self._carry = pcm16[-1:]
            pcm16 = pcm16[:-1]
        stream = self._stream
        if stream is None:
            return pcm16
        import numpy as np

        samples = np.frombuffer(pcm16, dtype=SAMPLE_DTYPE)
        out: Any = stream.resample_chunk(samples, last=False)
        return bytes(out.tobytes())

    def flush(self) -> bytes:
        """The samples the filter still holds (call once, at the end of the stream)."""
        stream = self._stream
        if stream is None:
            return b""
        import numpy as np

        out: Any = stream.resample_chunk(np.zeros(0, dtype=SAMPLE_DTYPE), last=True)
        return bytes(out.tobytes())
