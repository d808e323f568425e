"""A phone call's world for tests: a gateway with its phone edge, a carrier, speech, a REST stand-in.

The carrier itself is ``gateway.client.carrier.SimulatedCall`` (also what
``gateway loadtest --phone`` dials with). Speech is made with espeak-ng, as a
caller's would sound, and sent as 8 kHz μ-law.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from websockets.asyncio.client import ClientConnection, connect

from gateway.app import running_gateway
from gateway.client.carrier import CallSetup, SimulatedCall, speech_mulaw
from gateway.common.pcm import read_wav, resample
from gateway.config import load_config
from gateway.edge.server import Gateway
from protocol.events import Event, decode_event

__all__ = [
    "AUTH_TOKEN",
    "AppClient",
    "PhoneGateway",
    "TwilioStandIn",
    "espeak",
    "phone_gateway",
]

AUTH_TOKEN = "test-twilio-auth-token"


@functools.cache
def espeak(text: str) -> bytes:
    """``text`` spoken by espeak-ng, as a caller's phone sends it: 8 kHz μ-law."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, timeout=30)
        pcm, rate = read_wav(wav)
    return speech_mulaw(resample(pcm, rate, 8000))


@dataclass
class PhoneGateway:
    gateway: Gateway

    @property
    def stream_url(self) -> str:
        return f"ws://127.0.0.1:{self.gateway.port}/v1/phone/twilio"

    @property
    def api_url(self) -> str:
        return self.gateway.api_url

    @property
    def client_url(self) -> str:
        return self.gateway.url

    def call(self, *, signed: bool = True, webhook: bool = True, **setup: Any) -> SimulatedCall:
        """A call (not dialled yet) as Twilio would make it: signed with ``AUTH_TOKEN``,
        after asking the TwiML helper for its stream (the one-time token) unless
        ``webhook`` is False or the call is unsigned."""
        return SimulatedCall(
            CallSetup(
                url=self.stream_url,
                auth_token=AUTH_TOKEN if signed else None,
                webhook_url=f"{self.api_url}/v1/phone/twilio/voice" if webhook else None,
                **setup,
            )
        )


@contextlib.asynccontextmanager
async def phone_gateway(tmp_path: Path, **settings: Any) -> AsyncIterator[PhoneGateway]:
    """A gateway on the in-process simulator with its phone edge (Twilio's auth token
    set: streams are signed) and its HTTP API; ``settings`` override. Auth is off,
    so calls belong to the key id the HTTP API then uses (``anonymous``)."""
    values: dict[str, Any] = {
        "port": 0,
        "api_port": 0,
        "phone_twilio_auth_token": AUTH_TOKEN,
        "workspace_root": str(tmp_path / "workspaces"),
        "sim_tokens_per_second": 200,
    }
    values.update(settings)
    async with running_gateway(load_config(values, env={})) as gateway:
        yield PhoneGateway(gateway)


@dataclass
class AppClient:
    """The app's own client of a call's session (text events; audio frames skipped)."""

    ws: ClientConnection
    events: list[Event] = field(default_factory=list)

    @classmethod
    async def connect(cls, url: str, sid: str) -> AppClient:
        ws = await connect(f"{url}?session_id={sid}", max_size=None)
        await ws.recv()  # the session frame
        return cls(ws)

    async def until(self, kind: str, timeout: float = 20.0) -> Event:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.ws.recv()
                if isinstance(frame, bytes):
                    continue
                event = decode_event(frame)
                self.events.append(event)
                if type(event).__struct_config__.tag == kind:
                    return event

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(message).decode())

    async def close(self) -> None:
        await self.ws.close()


class TwilioStandIn:
    """A local stand-in for Twilio's Calls resource: records each update, answers 200."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[tuple[str, dict[str, str], str]] = []  # (path, form, authorization)
        self.received = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _update(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        self.requests.append((request.path, form, request.headers.get("Authorization", "")))
        self.received.set()
        return web.json_response({"sid": request.match_info["call"]}, status=self.status)

    async def __aenter__(self) -> TwilioStandIn:
        app = web.Application()
        app.router.add_post("/2010-04-01/Accounts/{account}/Calls/{call}.json", self._update)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
