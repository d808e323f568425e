"""Benchmark of the voice path below the session: the adapters' append path and resampling.

Run: ``PYTHONPATH=. /work/venv/bin/python tests/bench/voice_bench.py [--quick]``

1. Audio frames relayed per CPU-second by an adapter: ``send_audio`` of 20 ms
   PCM16 frames (resample if the client's rate differs, base64 and JSON by
   msgspec, one WebSocket write). The simulator runs in a subprocess, so the
   CPU time measured (``time.process_time``) is the adapter's and the event
   loop's alone. A session streams 50 frames per second, so frames/CPU-s ÷ 50
   is how many talking users one core could relay.
2. Resampling cost per second of audio (soxr HQ, streamed in 20 ms chunks):
   CPU milliseconds per second of audio, for the conversions the gateway does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator

from gateway.common.pcm import tone
from gateway.upstream.audio import Resampler
from gateway.upstream.base import AudioIn, Upstream, VoiceConfig
from gateway.upstream.gemini import GeminiLive
from gateway.upstream.openai import OpenAIRealtime

FRAME_S = 0.02


@contextlib.asynccontextmanager
async def sim_process(flavor: str) -> AsyncIterator[str]:
    """``gateway sim`` in a subprocess (its VAD's CPU is not ours); yields its base URL.

    The VAD threshold is out of reach, so the sim only measures loudness and
    never answers while we stream.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "sim",
        "--flavor",
        flavor,
        "--port",
        "0",
        "--vad-threshold",
        "40000",
        stdout=subprocess.PIPE,
        env={**os.environ},
    )
    assert proc.stdout is not None
    line = (await proc.stdout.readline()).decode()
    endpoint = line.rsplit(" ", 1)[-1].strip()
    base = endpoint.split("/v1/")[0] + "/v1" if flavor == "openai" else endpoint.split("/ws/")[0]
    try:
        yield base
    finally:
        proc.terminate()
        await proc.wait()


async def relay(flavor: str, rate: int, frames: int) -> float:
    """Frames per CPU-second of ``send_audio`` at client ``rate``."""
    frame = tone(FRAME_S, rate)
    voice = VoiceConfig(audio_in=AudioIn(rate=rate, transcription=False))
    async with sim_process(flavor) as url:
        upstream: Upstream = (
            OpenAIRealtime(base_url=url, api_key="k")
            if flavor == "openai"
            else GeminiLive(base_url=url, api_key="k")
        )
        await upstream.open("", [], voice=voice)
        try:
            for _ in range(50):  # warm up
                await upstream.send_audio(frame)
            cpu = time.process_time()
            for index in range(frames):
                await upstream.send_audio(frame)
                if index % 64 == 63:
                    await asyncio.sleep(0)  # let the writes drain, as a real loop would
            cpu = time.process_time() - cpu
        finally:
            await upstream.close()
    return frames / cpu


def resample_cost(src: int, dst: int, seconds: float) -> float:
    """CPU milliseconds per second of audio, streamed in 20 ms chunks."""
    pcm = tone(seconds, src)
    size = round(src * FRAME_S) * 2
    resampler = Resampler(src, dst)
    cpu = time.process_time()
    for at in range(0, len(pcm), size):
        resampler.push(pcm[at : at + size])
    resampler.flush()
    return (time.process_time() - cpu) * 1000 / seconds


async def main(quick: bool) -> None:
    frames = 2000 if quick else 20000
    print(f"adapter append path: {frames} frames of 20 ms PCM16 (sim in a subprocess)")
    for flavor, rate in (
        ("openai", 24000),
        ("openai", 48000),
        ("gemini", 16000),
        ("gemini", 24000),
        ("gemini", 48000),
    ):
        per_cpu_s = await relay(flavor, rate, frames)
        print(
            f"  {flavor:6} client {rate // 1000:2} kHz: {per_cpu_s:9,.0f} frames/CPU-s"
            f"  = {per_cpu_s / 50:7,.0f} users talking per core"
        )
    seconds = 10.0 if quick else 60.0
    print(f"resampling (soxr HQ, 20 ms chunks, {seconds:g} s of audio)")
    for src, dst in ((48000, 24000), (48000, 16000), (24000, 16000), (16000, 24000)):
        print(
            f"  {src // 1000:2} -> {dst // 1000:2} kHz: {resample_cost(src, dst, seconds):6.3f} ms CPU per s of audio"
        )


if __name__ == "__main__":
    asyncio.run(main("--quick" in sys.argv))
