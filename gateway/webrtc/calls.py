"""``POST /openai/v1/realtime/calls``: OpenAI's WebRTC calls, terminated in the gateway.

The offer (``application/sdp``, or multipart with ``sdp`` and ``session``) is
answered ``201`` with the SDP answer and ``Location: …/calls/rtc_…``. The call
is then one more client of the OpenAI door: its ``oai-events`` data channel
carries the door's events (``LoopbackBridge.pump`` through a ``CallLink``), its
microphone track goes into the session at 48 kHz, and the model's speech
goes out on the answering track (``gateway.webrtc.media``). Credentials and
every check of the gateway's door are the door's, made on the bridge's
loopback connection (``LoopbackBridge.open``; docs/webrtc.md: an extra hop).

Limits come before the work: the body's size (``max_sdp``) before it is
read, the node's call count (``max_calls``) before a peer connection is
made, a data-channel message's size (``max_frame``) before it is decoded,
the door's event rate before any work, and a peer that does not open its
data channel within ``connect_timeout`` seconds is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any, Final

import msgspec
from aiohttp import web
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from gateway.config import Config
from gateway.edge.openai_door import OpenAIDoor, model_route
from gateway.upstream.providers import MODELS
from gateway.webrtc import CALLS_PATH
from gateway.webrtc.bridge import LoopbackBridge, Refused
from gateway.webrtc.media import RATE, Speaker, microphone
from protocol.events import Played
from protocol.openai_conversation import Conversation

__all__ = ["CALLS_PATH", "CallLink", "WebRTCCalls", "ice_servers"]

log = logging.getLogger("gateway.webrtc.calls")

CHANNEL: Final = "oai-events"


def _refusal(status: int, message: str, code: str) -> web.Response:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message}}
    return web.Response(
        status=status, body=msgspec.json.encode(body), content_type="application/json"
    )


def ice_servers(spec: str) -> list[RTCIceServer]:
    """``stun:H:P,turn:USER:PASS@H:P`` as aiortc's servers (credentials out of the URL)."""
    servers: list[RTCIceServer] = []
    for url in filter(None, (u.strip() for u in spec.split(","))):
        scheme, _, rest = url.partition(":")
        if "@" in rest and scheme in ("turn", "turns"):
            cred, _, host = rest.rpartition("@")
            user, _, password = cred.partition(":")
            servers.append(RTCIceServer(f"{scheme}:{host}", username=user, credential=password))
        else:
            servers.append(RTCIceServer(url))
    return servers


class CallLink:
    """A WebRTC call as the door's link: the data channel, the two audio tracks."""

    def __init__(self, pc: RTCPeerConnection, speaker: Speaker, max_frame: int) -> None:
        self.pc = pc
        self.speaker = speaker
        self.max_frame = max_frame
        self.channel: Any = None
        self.opened = asyncio.Event()
        self.mic: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()
        self._inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        pc.on("datachannel", self._channel)
        pc.on("track", self._track)
        pc.on("connectionstatechange", self._state)

    def _channel(self, channel: Any) -> None:
        if channel.label != CHANNEL or self.channel is not None:
            channel.close()  # one events channel per call, named as OpenAI names it
            return
        self.channel = channel
        channel.on("message", self._message)
        channel.on("close", lambda: self._inbox.put_nowait(None))
        self.opened.set()

    def _message(self, message: str | bytes) -> None:
        if len(message) > self.max_frame:  # before any work is done for it
            self.channel.send(
                msgspec.json.encode(
                    {
                        "type": "error",
                        "event_id": "evt_x0",
                        "error": {
                            "type": "invalid_request_error",
                            "code": "message_too_big",
                            "message": f"a data-channel message takes at most {self.max_frame} "
                            "bytes; send audio on the track, not as appends",
                        },
                    }
                ).decode()
            )
            return
        self._inbox.put_nowait(message)

    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and not self.mic.done():
            self.mic.set_result(track)

    async def _state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._inbox.put_nowait(None)

    async def incoming(self) -> AsyncIterator[str | bytes]:
        while (message := await self._inbox.get()) is not None:
            yield message

    def push(self, text: str) -> None:
        """A frame as if the client sent it (a multipart ``session``)."""
        self._inbox.put_nowait(text)

    async def send(self, text: str) -> None:
        await self.opened.wait()
        if self.channel.readyState == "open":
            self.channel.send(text)

    async def close(self, code: int, reason: str) -> None:
        await self.pc.close()

    def speech(self, tag: int, pcm16: bytes) -> bool:
        self.speaker.play(tag, pcm16)
        return True

    def cut_speech(self) -> Played | None:
        return self.speaker.cut()

    def answer_started(self) -> None:
        self.speaker.answer_started()

    def progress(self) -> Played | None:
        return self.speaker.progress()

    async def media(self) -> AsyncIterator[bytes]:
        async for pcm in microphone(await self.mic):
            yield pcm


class WebRTCCalls:
    """The calls of one node: answers offers, runs each call until it ends."""

    def __init__(self, config: Config, door: OpenAIDoor, bridge: LoopbackBridge) -> None:
        """``door``: where ``?call_id=`` (the sideband) finds a call; ``bridge``: how a
        call reaches its session."""
        self.config = config
        self.settings = config.webrtc
        self.door = door
        self.bridge = bridge
        self.calls: dict[str, asyncio.Task[None]] = {}

    async def create(self, request: web.Request) -> web.Response:
        limit = self.settings.max_sdp
        if request.content_length is not None and request.content_length > limit:
            return _refusal(413, f"the offer takes at most {limit} bytes", "sdp_too_large")
        if len(self.calls) >= self.settings.max_calls:
            return _refusal(
                429, "this node holds all the WebRTC calls it may; retry later or elsewhere", "busy"
            )
        authorizations = request.headers.getall("Authorization", [])
        if len(authorizations) > 1:
            return _refusal(401, "send one Authorization header, not several", "auth")
        raw = bytearray()  # read() gives what has arrived: a body may come in pieces
        while len(raw) <= limit and (piece := await request.content.read(limit + 1 - len(raw))):
            raw += piece
        if len(raw) > limit:
            return _refusal(413, f"the offer takes at most {limit} bytes", "sdp_too_large")
        parsed = _offer(request.content_type, request.headers.get("Content-Type", ""), bytes(raw))
        if isinstance(parsed, str):
            return _refusal(400, parsed, "invalid_offer")
        sdp, session = parsed
        model = request.query.get("model") or str(session.get("model") or _default_model())
        route = model_route(self.config, model)
        if isinstance(route, str):
            return _refusal(400, route, "model_not_found")
        # A call offered again (its node died, or the network changed): the same session,
        # and the events after the last one the client saw (the door's resume).
        sid = request.query.get("session_id", "")
        after_event = request.query.get("after_event", "")
        after = Conversation.position(after_event) if after_event else None
        if after_event and (after is None or not sid):
            return _refusal(
                400,
                "after_event takes the event_id of the last event received (evt_SEQ_N), "
                "with session_id",
                "invalid_after_event",
            )
        opened = await self.bridge.open(
            model,
            route,
            authorizations[0] if authorizations else None,
            request.headers.get("Origin"),
            sid=sid,
            after=after,
        )
        if isinstance(opened, Refused):
            return _refusal(opened.status, opened.message, opened.code)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers(self.settings.ice_servers)))
        speaker = Speaker()
        link = CallLink(pc, speaker, self.config.max_frame)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            pc.addTrack(speaker)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # aiortc raises ValueError and others on a bad offer
            await pc.close()
            await opened.inner.close()
            return _refusal(400, f"the SDP offer cannot be answered: {exc}"[:300], "invalid_offer")
        call_id = "rtc_" + secrets.token_hex(12)
        if session:
            link.push(msgspec.json.encode({"type": "session.update", "session": session}).decode())
        conversation = Conversation(opened.sid, model, input_rate=RATE)
        self.door.calls[call_id] = (opened.sid, model)
        self.calls[call_id] = asyncio.create_task(
            self._run(call_id, link, self.bridge.pump(opened, link, conversation)),
            name=f"webrtc:{call_id}",
        )
        log.info("WebRTC call %s: session %s, model %s", call_id, opened.sid, model)
        return web.Response(
            status=201,
            text=pc.localDescription.sdp,
            content_type="application/sdp",
            headers={"Location": f"{CALLS_PATH}/{call_id}"},
        )

    async def _run(self, call_id: str, link: CallLink, pump: Any) -> None:
        task = asyncio.ensure_future(pump)
        try:
            try:
                await asyncio.wait_for(
                    asyncio.shield(link.opened.wait()), self.settings.connect_timeout
                )
            except TimeoutError:
                log.info("WebRTC call %s: no data channel within the connect timeout", call_id)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await link.pc.close()
            self.calls.pop(call_id, None)
            self.door.calls.pop(call_id, None)

    async def close(self) -> None:
        for task in list(self.calls.values()):
            task.cancel()
        for task in list(self.calls.values()):
            with contextlib.suppress(BaseException):
                await task


def _default_model() -> str:
    """The model of a call that names none (agents-js names it after connecting)."""
    return next(m.name for m in MODELS if m.wire == "openai" and not m.shutdown)


def _offer(content_type: str, header: str, raw: bytes) -> tuple[str, dict[str, Any]] | str:
    """``(sdp, session)`` of a call's body, or what is wrong with it."""
    if content_type == "application/sdp":
        text = raw.decode("utf-8", "replace")
        return (text, {}) if text.startswith("v=0") else "the body is no SDP offer (v=0 …)"
    if content_type == "application/json":  # the openai SDK's calls.create(sdp=, session=)
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return 'the JSON body is not JSON: send {"sdp": OFFER, "session": {…}}'
        if not isinstance(body, dict) or not str(body.get("sdp", "")).startswith("v=0"):
            return 'the JSON body takes "sdp" (the SDP offer) and "session" (optional)'
        given = body.get("session") or {}
        if not isinstance(given, dict):
            return '"session" is a JSON object (a client_secrets session)'
        return str(body["sdp"]), given
    if content_type == "multipart/form-data":
        import email.parser
        import email.policy

        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + header.encode("latin-1", "replace") + b"\r\n\r\n" + raw
        )
        parts: dict[str, bytes] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if isinstance(name, str) and isinstance(payload, bytes):
                parts[name] = payload
        sdp = parts.get("sdp", b"").decode("utf-8", "replace")
        if not sdp.startswith("v=0"):
            return "the multipart body needs a part 'sdp' holding the SDP offer"
        session: Any = {}
        if "session" in parts:
            try:
                session = msgspec.json.decode(parts["session"])
            except msgspec.DecodeError:
                return "the part 'session' is not JSON"
            if not isinstance(session, dict):
                return "the part 'session' is a JSON object (a client_secrets session)"
        return sdp, session
    return (
        "send the SDP offer as Content-Type application/sdp, or multipart/form-data "
        "with the parts 'sdp' and 'session' (or JSON with those fields)"
    )
