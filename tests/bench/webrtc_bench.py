"""WebRTC calls' cost and added latency (simulator upstream).

``cpu N[,N…] SECONDS``: N aiortc peers hold calls for SECONDS (microphones sending
20 ms Opus frames, the gateway's track sending 20 ms frames) against a ``gateway
serve`` subprocess; prints that process's CPU per call (``/proc/PID/stat``: its
threads too, where aiortc decodes), so the gateway is measured alone: the peers and
the simulator run in this process. Also printed: the frames per second each peer
received (50 when nobody is starved) and the load average (the machine is shared).
Default: 1, 10 and 50 calls.

``events TURNS``: one call against the same subprocess runs TURNS text turns (about
200 ``response.output_text.delta`` each) on its data channel; prints the gateway's CPU
per event the peer received, less what the idle call costs over the same time.

``latency ROUNDS``: a spoken turn (0.3 s silence, 0.5 s tone, 0.8 s silence), timed
from the end of the speech to the first audible frame of the answer: on a WebRTC call
(the frame decoded by the peer) and on the door's WebSocket (the first
``response.output_audio.delta``), on the same simulator; prints the medians.

Usage: python -m tests.bench.webrtc_bench cpu 1,10,50 20 | events 20 | latency 5
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from tests.openai_door.conftest import RawClient
from tests.openai_door.test_voice import AUDIO_SESSION as WS_SESSION
from tests.support.procs import NodeProcess
from tests.voice.conftest import CHUNK_S, KEY, utterance, voice_gateway
from tests.webrtc.conftest import RATE, Peer
from tests.webrtc.test_calls import AUDIO_SESSION, MODEL, calls_url

SPEECH_END_S = 0.8  # utterance(0.5): 0.3 s silence, then 0.5 s of tone


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def _node() -> AsyncIterator[NodeProcess]:
    """A ``gateway serve`` subprocess on a simulator in this process."""
    with tempfile.TemporaryDirectory() as tmp:
        async with serve_sim(SimConfig(flavor="openai", api_key=KEY)) as sim:
            args = ["serve", "--port", "0", "--provider", "openai", "--openai-base-url", sim.url]
            args += ["--model", "sim", "--workspace-root", tmp, "--log-level", "WARNING"]
            node = NodeProcess(args, env={"OPENAI_API_KEY": KEY})
            await asyncio.to_thread(node.start)
            try:
                yield node
            finally:
                node.kill()


async def events(turns: int) -> None:
    async with _node() as node:
        assert node.proc is not None
        pid = node.proc.pid
        peer = Peer()
        try:
            assert (await peer.call(calls_url(node.url))).status == 201
            await peer.until("session.created")
            peer.send(
                type="session.update", session={"type": "realtime", "output_modalities": ["text"]}
            )
            await peer.until("session.updated")
            await asyncio.sleep(2)  # settle: DTLS done, tracks flowing both ways
            idle, wall = _cpu_seconds(pid), time.monotonic()
            await asyncio.sleep(3)
            idle_rate = (_cpu_seconds(pid) - idle) / (time.monotonic() - wall)
            used, wall, count = _cpu_seconds(pid), time.monotonic(), 0
            for _ in range(turns):
                peer.send(
                    type="conversation.item.create",
                    item={
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "/raw " + "word " * 160}],
                    },
                )
                peer.send(type="response.create")
                count += len(await peer.until("response.done"))
            wall = time.monotonic() - wall
            used = _cpu_seconds(pid) - used - idle_rate * wall
        finally:
            await peer.close()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"events: {turns} turns, {count} events in {wall:.1f} s: the gateway "
        f"{used / count * 1e6:.0f} µs of CPU per event (the idle call's "
        f"{idle_rate * 100:.1f}% of a core taken off); load average {load}",
        flush=True,
    )


async def cpu(n: int, seconds: float) -> None:
    async with _node() as node:
        assert node.proc is not None
        peers = [Peer() for _ in range(n)]
        try:
            for peer in peers:
                assert (await peer.call(calls_url(node.url))).status == 201
            await asyncio.sleep(2)  # settle: DTLS done, tracks flowing both ways
            frames = sum(p.frames for p in peers)
            used, mine = _cpu_seconds(node.proc.pid), time.process_time()
            wall = time.monotonic()
            await asyncio.sleep(seconds)
            used = _cpu_seconds(node.proc.pid) - used
            mine = time.process_time() - mine
            wall = time.monotonic() - wall
            frames = sum(p.frames for p in peers) - frames
        finally:
            for peer in peers:
                await peer.close()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"cpu: {n} calls, {wall:.1f} s: the gateway {used / (n * wall) * 100:.2f}% of a core "
        f"per call ({used:.2f} CPU s); {frames / (n * wall):.1f} frames/s received per call; "
        f"peers and simulator {mine / wall * 100:.0f}% of a core; load average {load}",
        flush=True,
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
    elif mode == "events":
        asyncio.run(events(int(sys.argv[2]) if len(sys.argv) > 2 else 20))
    else:
        counts = sys.argv[2] if len(sys.argv) > 2 else "1,10,50"
        for count in counts.split(","):
            asyncio.run(cpu(int(count), float(sys.argv[3]) if len(sys.argv) > 3 else 10))
