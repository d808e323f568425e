"""A WebRTC peer as an app would be one: aiortc's RTCPeerConnection with a microphone
track and an ``oai-events`` channel, posting its offer to the gateway's calls endpoint."""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from typing import Any

import aiohttp
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from tests.openai_door.conftest import SERVER_EVENT

RATE = 48000
FRAME = 960  # 20 ms


class Mic(MediaStreamTrack):
    """A microphone: plays what ``say`` queues (48 kHz PCM16), silence otherwise."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.queue = bytearray()
        self.started_at = 0.0  # when the first frame of what was said went out
        self._pts = -1
        self._start = 0.0

    def say(self, pcm: bytes) -> None:
        self.queue += pcm

    async def recv(self) -> AudioFrame:
        if self._pts < 0:
            self._start, self._pts = time.monotonic(), 0
        else:
            self._pts += FRAME
            wait = self._start + self._pts / RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        if self.queue and not self.started_at:
            self.started_at = time.monotonic()
        chunk = bytes(self.queue[: FRAME * 2])
        del self.queue[: FRAME * 2]
        chunk += bytes(FRAME * 2 - len(chunk))
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(chunk)
        frame.pts, frame.sample_rate, frame.time_base = self._pts, RATE, fractions.Fraction(1, RATE)
        return frame


class Peer:
    """One call: events from the channel (validated against the SDK), the track's loudness."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.mic = Mic()
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.seen: list[dict[str, Any]] = []
        self.loud: list[float] = []  # when a frame of the answer's track had speech
        self.frames = 0
        self.open = asyncio.Event()
        self._louder = asyncio.Event()
        self.location = ""
        self._tasks: list[asyncio.Task[None]] = []
        self.channel.on("open", self.open.set)
        self.channel.on("message", lambda m: self.events.put_nowait(json.loads(m)))
        self.pc.on("track", lambda t: self._tasks.append(asyncio.create_task(self._listen(t))))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame: Any = await track.recv()
            except MediaStreamError:
                return
            self.frames += 1
            samples = frame.to_ndarray().astype(np.int32)
            if int(np.abs(samples).max()) > 500:
                self.loud.append(time.monotonic())
                self._louder.set()

    async def heard(self, frames: int, timeout: float) -> None:
        """Until ``frames`` loud frames of the answer came on the track."""
        async with asyncio.timeout(timeout):
            while len(self.loud) < frames:
                self._louder.clear()
                await self._louder.wait()

    async def call(self, url: str, **headers: str) -> aiohttp.ClientResponse:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with aiohttp.ClientSession() as http:
            answer = await http.post(
                url,
                data=self.pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp", **headers},
            )
            body = await answer.text()
        if answer.status == 201:
            self.location = answer.headers["Location"]
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
            await asyncio.wait_for(self.open.wait(), 20)
        return answer

    def send(self, **event: Any) -> None:
        self.channel.send(json.dumps(event))

    async def until(self, *kinds: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The events up to the first of one of ``kinds``."""
        got: list[dict[str, Any]] = []
        while True:
            event = await asyncio.wait_for(self.events.get(), timeout)
            SERVER_EVENT.validate_python(event)  # the SDK's contract, or the test fails
            got.append(event)
            self.seen.append(event)
            if event["type"] in kinds:
                return got

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
