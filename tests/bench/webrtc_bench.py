"""WebRTC calls' cost and added latency, against an in-process gateway (simulator upstream).

``cpu N SECONDS``: N aiortc peers hold calls for SECONDS (microphones sending 20 ms
Opus frames, the gateway's track sending 20 ms frames); prints process CPU per call.
Both ends run in this one process (the peers' Opus, DTLS/SRTP and ICE cost about what
the gateway's do), so the gateway's share is about half of the figure printed.

``latency ROUNDS``: a spoken turn (0.3 s silence, 0.5 s tone, 0.8 s silence), timed
from the end of the speech to the first audible frame of the answer: on a WebRTC call
(the frame decoded by the peer) and on the door's WebSocket (the first
``response.output_audio.delta``), on the same simulator; prints the medians.

Usage: python -m tests.bench.webrtc_bench cpu 10 10 | latency 5
"""

from __future__ import annotations

import asyncio
import base64
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tests.openai_door.conftest import RawClient
from tests.openai_door.test_voice import AUDIO_SESSION as WS_SESSION
from tests.voice.conftest import CHUNK_S, utterance, voice_gateway
from tests.webrtc.conftest import RATE, Peer
from tests.webrtc.test_calls import AUDIO_SESSION, MODEL, calls_url

SPEECH_END_S = 0.8  # utterance(0.5): 0.3 s silence, then 0.5 s of tone


async def cpu(n: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with voice_gateway("openai", Path(tmp)) as gw:
            peers = [Peer() for _ in range(n)]
            for peer in peers:
                assert (await peer.call(calls_url(gw.url))).status == 201
            await asyncio.sleep(1)  # settle: DTLS done, tracks flowing
            used, wall = time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            used, wall = time.process_time() - used, time.monotonic() - wall
            frames = sum(p.frames for p in peers)
            for peer in peers:
                await peer.close()
    print(
        f"cpu: {n} calls, {wall:.1f} s: {used:.2f} CPU s, {used / (n * wall) * 100:.1f}% of a "
        f"core per call (both ends); {frames / (n * wall):.1f} frames/s received per call"
    )


async def webrtc_turn(url: str) -> float:
    peer = Peer()
    try:
        assert (await peer.call(url)).status == 201
        await peer.until("session.created")
        peer.send(type="session.update", session=AUDIO_SESSION)
        await peer.until("session.updated")
        peer.mic.say(utterance(0.5, RATE))
        await peer.heard(1, timeout=30)
        return peer.loud[0] - (peer.mic.started_at + SPEECH_END_S)
    finally:
        await peer.close()


async def websocket_turn(url: str) -> float:
    client = await RawClient.open(url, max_size=None)
    try:
        await client.send(type="session.update", session=WS_SESSION)
        await client.until("session.updated")
        pcm = utterance(0.5, 24000)
        size = round(24000 * CHUNK_S) * 2
        start = time.monotonic()
        for index, at in enumerate(range(0, len(pcm), size)):
            delay = start + index * CHUNK_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            chunk = base64.b64encode(pcm[at : at + size]).decode()
            await client.send(type="input_audio_buffer.append", audio=chunk)
        while True:
            event = await client.next()
            if event["type"] == "response.output_audio.delta":
                samples = np.frombuffer(base64.b64decode(event["delta"]), dtype=np.int16)
                if samples.size and int(np.abs(samples.astype(np.int32)).max()) > 500:
                    return time.monotonic() - (start + SPEECH_END_S)
    finally:
        await client.close()


async def latency(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with voice_gateway("openai", Path(tmp)) as gw:
            door = gw.url.replace("/v1/realtime", "/openai/v1/realtime") + f"?model={MODEL}"
            rtc = [await webrtc_turn(calls_url(gw.url)) for _ in range(rounds)]
            ws = [await websocket_turn(door) for _ in range(rounds)]
    a, b = statistics.median(rtc), statistics.median(ws)
    print(
        f"latency, speech end to the answer's first audible audio, median of {rounds}: "
        f"WebRTC {a * 1000:.0f} ms, WebSocket {b * 1000:.0f} ms: WebRTC adds {(a - b) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    if mode == "latency":
        asyncio.run(latency(int(sys.argv[2]) if len(sys.argv) > 2 else 5))
    else:
        asyncio.run(
            cpu(
                int(sys.argv[2]) if len(sys.argv) > 2 else 1,
                float(sys.argv[3]) if len(sys.argv) > 3 else 10,
            )
        )
