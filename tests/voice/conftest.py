"""A voice client over a real gateway whose upstream is a simulator of either flavour."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from websockets.asyncio.client import ClientConnection, connect

from gateway.app import running_gateway
from gateway.common.pcm import silence, tone
from gateway.config import load_config
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from protocol.audio import split_audio_frame
from protocol.events import Event, Session, decode_event
from tests.support.netem import LatencyProxy

KEY = "voice-key"
CHUNK_S = 0.02  # 20 ms frames, as a microphone sends them


def kind(event: Event) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def utterance(seconds: float, rate: int) -> bytes:
    """Speech (a tone) with silence around it: 0.3 s before, 0.8 s after."""
    return silence(0.3, rate) + tone(seconds, rate) + silence(0.8, rate)


@dataclass
class VoiceClient:
    """One client connection: events and the audio frames (seq, pcm) it was sent."""

    ws: ClientConnection
    session: Session
    events: list[Event] = field(default_factory=list)
    audio: list[tuple[int, bytes]] = field(default_factory=list)
    audio_at: list[float] = field(default_factory=list)

    @classmethod
    async def connect(cls, url: str, **query: str) -> VoiceClient:
        target = url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
        ws = await connect(target, max_size=None)
        first = decode_event(await ws.recv())
        assert isinstance(first, Session)
        return cls(ws, first)

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(message).decode())

    async def configure(self, **fields: Any) -> Event:
        await self.send({"type": "configure", **fields})
        [configured] = [e for e in await self.until("configured") if kind(e) == "configured"]
        return configured

    async def stream(self, pcm: bytes, rate: int, *, as_json: bool = False) -> None:
        """Send ``pcm`` in 20 ms frames at real-time pace (due times from the start: no drift)."""
        size = round(rate * CHUNK_S) * 2
        start = time.monotonic()
        for index, at in enumerate(range(0, len(pcm), size)):
            delay = start + index * CHUNK_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            chunk = pcm[at : at + size]
            if as_json:
                await self.send({"type": "audio", "audio": base64.b64encode(chunk).decode()})
            else:
                await self.ws.send(chunk)

    async def next(self, timeout: float = 20.0) -> Event:
        while True:
            frame = await asyncio.wait_for(self.ws.recv(), timeout)
            if isinstance(frame, bytes):
                self.audio.append(split_audio_frame(frame))
                self.audio_at.append(time.monotonic())
                continue
            event = decode_event(frame)
            self.events.append(event)
            return event

    async def until_match(
        self, pred: Callable[[Event], bool], timeout: float = 30.0
    ) -> list[Event]:
        got: list[Event] = []

        async def run() -> None:
            while True:
                event = await self.next(timeout)
                got.append(event)
                if pred(event):
                    return

        await asyncio.wait_for(run(), timeout)
        return got

    async def until(self, name: str, timeout: float = 30.0) -> list[Event]:
        return await self.until_match(lambda e: kind(e) == name, timeout)

    async def turn_end(self, timeout: float = 30.0) -> list[Event]:
        """Events through the next closing event (end/cancelled) and its metric."""
        got = await self.until_match(lambda e: kind(e) in ("end", "cancelled"), timeout)
        got += await self.until("metric", timeout)
        return got

    async def close(self) -> None:
        await self.ws.close()


def shape(events: list[Event]) -> list[tuple[str, str]]:
    """Event types with merged think/respond contents; metrics and execute without content."""
    out: list[tuple[str, str]] = []
    for event in events:
        name = kind(event)
        content = getattr(event, "content", "")
        if name in ("think", "respond") and out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + content)
        elif name in ("metric", "execute", "end", "speech_started", "speech_stopped"):
            out.append((name, ""))
        else:
            out.append((name, content))
    return out


@dataclass
class VoiceGateway:
    url: str
    sim: Any
    link: LatencyProxy | None = None  # between the gateway and the simulator, if asked for


@contextlib.asynccontextmanager
async def voice_gateway(
    provider: str,
    workspace: Path,
    redis_url: str | None = None,
    gateway_settings: dict[str, Any] | None = None,
    *,
    link: bool = False,
    **knobs: Any,
) -> AsyncIterator[VoiceGateway]:
    """A gateway whose ``provider`` upstream is a simulator of that flavour
    (``knobs``: the simulator's; ``gateway_settings``: more of the gateway's;
    ``link``: the upstream is reached through a ``LatencyProxy`` the test holds)."""
    sim_config = SimConfig(flavor=provider, api_key=KEY, **knobs)
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(serve_sim(sim_config))
        base_url, proxy = sim.url, None
        if link:
            host, port = urlsplit(sim.url).netloc.rsplit(":", 1)
            proxy = await stack.enter_async_context(LatencyProxy((host, int(port))))
            base_url = base_url.replace(f":{port}", f":{proxy.port}", 1)
        settings: dict[str, Any] = {
            "provider": provider,
            f"{provider}_base_url": base_url,
            f"{provider}_api_key": KEY,
            # The simulator's own model writes text on either wire, as these sessions' text
            # answers need (today's Live models only speak: tests/voice/test_spoken_models.py).
            "model": "sim",
            "port": 0,
            "workspace_root": str(workspace / provider),
        }
        if redis_url is not None:
            settings["redis_url"] = redis_url
        settings.update(gateway_settings or {})
        async with running_gateway(load_config(settings, env={})) as gateway:
            yield VoiceGateway(gateway.url, sim, proxy)
