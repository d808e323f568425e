"""Benchmark of a call's audio: CPU per 20 ms frame, each way, through the converter.

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/phone_audio_bench.py [--quick]``

A call sends the gateway 50 ``media`` frames a second (160 bytes of μ-law,
base64 in JSON) and gets the session's speech back as ``media`` + ``mark``.
Per 20 ms frame, with ``time.process_time`` over many frames (median of 5
runs):

- in: the carrier's JSON frame decoded (``MediaStreamWire.decode_inbound``,
  base64 by msgspec), μ-law → PCM16 (``CallAudio.heard``), and the adapter's
  resampling to the provider's rate (``Resampler``: 8 → 24 kHz for OpenAI,
  8 → 16 kHz for Gemini), which the adapter does for any client's rate;
- out: a 20 ms chunk of speech (PCM16 24 kHz) → 8 kHz μ-law
  (``CallAudio.spoken``: streamed soxr HQ, then the μ-law table), then its
  ``media`` and ``mark`` frames encoded.

The figures go to docs/phone.md ("Measured").
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from gateway.common.pcm import mulaw_encode, tone
from gateway.phone.audio import CALL_RATE, CallAudio
from gateway.phone.playback import Playback
from gateway.upstream.audio import Resampler
from protocol.audio import OUTPUT_RATE
from protocol.media_stream import TWILIO, MarkOut, Media, MediaStreamWire, Play

FRAMES = 50_000


def per_frame_us(run: Callable[[int], None], frames: int, repeats: int = 5) -> float:
    """Median CPU µs per frame of ``run(frames)``."""
    results = []
    for _ in range(repeats):
        start = time.process_time()
        run(frames)
        results.append((time.process_time() - start) / frames * 1e6)
    return statistics.median(results)


def main() -> None:
    frames = 5_000 if "--quick" in sys.argv else FRAMES
    wire = MediaStreamWire(TWILIO)
    speech8 = tone(1.0, CALL_RATE)
    mulaw = mulaw_encode(speech8)
    inbound = [
        wire.encode_inbound(
            Media(payload=mulaw[at : at + 160], stream="MZ1", track="inbound", chunk=i, sequence=i)
        )
        for i, at in enumerate(range(0, len(mulaw), 160))
    ]
    speech24 = tone(1.0, OUTPUT_RATE)
    chunks24 = [speech24[at : at + 960] for at in range(0, len(speech24), 960)]

    def inbound_path(rate: int | None) -> Callable[[int], None]:
        def run(n: int) -> None:
            resampler = Resampler(CALL_RATE, rate) if rate is not None else None
            decode = wire.decode_inbound
            heard = CallAudio.heard
            count = len(inbound)
            for i in range(n):
                message = decode(inbound[i % count])
                assert isinstance(message, Media)
                pcm = heard(message.payload)
                if resampler is not None:
                    resampler.push(pcm)

        return run

    def outbound(n: int) -> None:
        audio = CallAudio()
        playback = Playback()
        encode = wire.encode_outbound
        count = len(chunks24)
        for i in range(n):
            out = audio.spoken(chunks24[i % count])
            name = playback.sent(i, len(out) // 8)
            encode(Play("MZ1", out))
            encode(MarkOut("MZ1", name))
            if i % 50 == 49:
                playback.clear()

    rows = [
        ("in: JSON + base64 + μ-law → PCM16 8 kHz", per_frame_us(inbound_path(None), frames)),
        ("in: … + resample to 24 kHz (OpenAI)", per_frame_us(inbound_path(24000), frames)),
        ("in: … + resample to 16 kHz (Gemini)", per_frame_us(inbound_path(16000), frames)),
        ("out: 24 kHz → 8 kHz μ-law + media + mark", per_frame_us(outbound, frames)),
    ]
    print(f"CPU per 20 ms frame (median of 5 runs of {frames:,} frames)")
    for name, us in rows:
        print(f"  {name:<44}{us:>8.1f} µs   ({us / 20_000 * 100:.2f}% of a core per call)")
    both = rows[1][1] + rows[3][1]
    print(f"  a call both ways (OpenAI): {both:.1f} µs per 20 ms (the conversions and frames only;")
    print("  the sockets, the session and the provider relay are measured by phone_bench.py)")


if __name__ == "__main__":
    main()
