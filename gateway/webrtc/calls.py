"""``POST /openai/v1/realtime/calls``: OpenAI's WebRTC calls, terminated in the gateway.

The offer (``application/sdp``, or multipart with ``sdp`` and ``session``) is
answered ``201`` with the SDP answer and ``Location: …/calls/rtc_…``. The call
is then one more client of the OpenAI door, admitted by the door's checks with
the caller's credentials (``OpenAIDoor.enter``) and served by the node as any
client is (``serve``: ``Gateway._handler``), as a ``CallConnection`` whose
socket is the call (``CallSocket``): its ``oai-events`` data channel carries
the door's events, its microphone track goes into the session at 48 kHz, and
the model's speech goes out on the answering track (``gateway.webrtc.media``).

Limits come before the work: the body's size (``max_sdp``) before it is
read, and its arrival within ``body_timeout``; the node's call count
(``max_calls``, offers being answered included) before a peer connection is
made; the offer's media sections (``MAX_MEDIA``) before aiortc parses it; a
data-channel message's size (``max_frame``) before it is decoded, the door's
event rate before any work, and a peer that does not open its data channel
within ``connect_timeout`` seconds is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

import msgspec
from aiohttp import web
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request

from gateway.config import Config
from gateway.edge.http_requests import (
    ApiError,
    Caller,
    ErrorBody,
    Owns,
    Refusal,
    json_response,
)
from gateway.edge.openai_door import REFUSAL_CODES, OpenAIDoor
from gateway.upstream.providers import MODELS
from gateway.webrtc import CALLS_PATH
from gateway.webrtc.channel import CallSocket
from gateway.webrtc.connection import CallConnection
from protocol.openai_conversation import Conversation

__all__ = ["CALLS_PATH", "WebRTCCalls", "ice_servers"]

log = logging.getLogger("gateway.webrtc.calls")

# Serves an admitted client's socket until it ends (``Gateway._handler``).
Serve = Callable[[ServerConnection], Awaitable[None]]


def _refusal(status: int, message: str, code: str) -> web.Response:
    """OpenAI's error body, as every HTTP refusal of the node (``ApiError``)."""
    return json_response(status, ErrorBody(ApiError(code, message)))


def _credentials(request: web.Request) -> Headers:
    """What the door's checks read of an offer's request: its key or token, its origin."""
    return Headers(
        (name, value)
        for name, value in request.headers.items()
        if name.lower() in ("authorization", "origin")
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


class WebRTCCalls:
    """The calls of one node: answers offers, runs each call until it ends."""

    def __init__(
        self,
        config: Config,
        door: OpenAIDoor,
        serve: Serve,
        owns: Owns,
        caller: Caller,
    ) -> None:
        """``door``: admits a call (its checks) and finds it for ``?call_id=`` (the
        sideband); ``serve``: serves an admitted call's socket as the node's clients;
        ``owns``: the request's API key owns a session (a hangup's check); ``caller``:
        the refusal of credentials no key or token has (before an offer holds a slot)."""
        self.config = config
        self.settings = config.webrtc
        self.door = door
        self.serve = serve
        self.owns = owns
        self.caller = caller
        self.calls: dict[str, asyncio.Task[None]] = {}
        self._admitting: set[str] = set()  # offers being answered: each holds a slot

    async def create(self, request: web.Request) -> web.Response:
        limit = self.settings.max_sdp
        if request.content_length is not None and request.content_length > limit:
            return _refusal(413, f"the offer takes at most {limit} bytes", "sdp_too_large")
        authorizations = request.headers.getall("Authorization", [])
        if len(authorizations) > 1:
            return _refusal(401, "send one Authorization header, not several", "auth")
        # Credentials first: a caller no key or token knows holds no slot, and its
        # body is not waited for (the door checks everything else once it is read).
        refused = await self.caller(Request(request.path_qs, _credentials(request)))
        if refused is not None:
            text = refused.body.decode("utf-8", "replace").strip() if refused.body else ""
            return _refusal(
                refused.status_code, text, REFUSAL_CODES.get(refused.status_code, "refused")
            )
        if len(self.calls) + len(self._admitting) >= self.settings.max_calls:
            return _refusal(
                429, "this node holds all the WebRTC calls it may; retry later or elsewhere", "busy"
            )
        # The slot is taken before the first await: offers arriving together are counted
        # with the calls they may become, not let in because none has been answered yet.
        call_id = "rtc_" + secrets.token_hex(12)
        self._admitting.add(call_id)
        try:
            return await self._answer(request, call_id)
        finally:
            self._admitting.discard(call_id)

    async def _answer(self, request: web.Request, call_id: str) -> web.Response:
        limit = self.settings.max_sdp
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return _refusal(
                415, "send the offer uncompressed (no Content-Encoding)", "unsupported_encoding"
            )
        raw = bytearray()  # read() gives what has arrived: a body may come in pieces
        timeout = self.config.body_timeout
        try:
            async with asyncio.timeout(timeout):
                while len(raw) <= limit and (
                    piece := await request.content.read(limit + 1 - len(raw))
                ):
                    raw += piece
        except TimeoutError:
            return _refusal(
                408,
                f"the offer did not arrive within {timeout:g} s; send the whole request at once",
                "timeout",
            )
        except ConnectionError:  # the caller went away mid-body: nobody to answer
            raise web.HTTPBadRequest() from None
        if len(raw) > limit:
            return _refusal(413, f"the offer takes at most {limit} bytes", "sdp_too_large")
        parsed = _offer(request.content_type, request.headers.get("Content-Type", ""), bytes(raw))
        if isinstance(parsed, str):
            return _refusal(400, parsed, "invalid_offer")
        sdp, session = parsed
        model = request.query.get("model") or str(session.get("model") or _default_model())
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
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        call = CallSocket(call_id, self.config.max_frame, sockname)
        headers = _credentials(request)
        # Every check of the door, with the caller's credentials, before any media work.
        refused = await self.door.enter(
            cast(ServerConnection, call),
            Request(request.path_qs, headers),
            model=model,
            sid=sid,
            after=after,
            make=CallConnection,
        )
        if refused is not None:
            await call.close()
            return web.Response(
                status=refused.status_code, body=refused.body, content_type="application/json"
            )
        # The caller is known: now what its offer asks for, line by line as aiortc
        # splits it (any line break), and given to aiortc with those lines only.
        lines = sdp.splitlines()
        problem = _media_problem(lines)
        if problem is not None:
            await call.close()
            return _refusal(400, problem, "invalid_offer")
        sdp = "\r\n".join(lines) + "\r\n"
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers(self.settings.ice_servers)))
        call.attach(pc)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            pc.addTrack(call.speaker)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # aiortc raises ValueError and others on a bad offer
            await call.close()
            log.info("call %s: the offer cannot be answered: %r", call_id, exc)
            return _refusal(
                400,
                "the SDP offer cannot be answered: send the offer the browser's "
                "createOffer() made, whole and unedited (a line of it is missing or "
                f"malformed: {str(exc)[:160]})",
                "invalid_offer",
            )
        if session:
            call.push(msgspec.json.encode({"type": "session.update", "session": session}).decode())
        self._admitting.discard(call_id)  # its slot is the call's now
        self.calls[call_id] = asyncio.create_task(self._run(call), name=f"webrtc:{call_id}")
        joined = await call.joined  # the session the node attached the call to
        if not joined:
            return _refusal(503, "the gateway cannot serve this session now; retry", "busy")
        self.door.calls[call_id] = (joined, model)
        log.info("WebRTC call %s: session %s, model %s", call_id, joined, model)
        return web.Response(
            status=201,
            text=pc.localDescription.sdp,
            content_type="application/sdp",
            headers={"Location": f"{CALLS_PATH}/{call_id}"},
        )

    async def hangup(self, request: web.Request) -> web.Response:
        """``POST …/calls/CALL_ID/hangup``: the call ends (its peer connection closed),
        its session stays, to resume as any other; an app's API key that owns the
        session may, as OpenAI lets the project's key."""
        call_id = request.match_info["call_id"]
        task, joined = self.calls.get(call_id), self.door.calls.get(call_id)
        try:  # the key first: an unknown call id says nothing to a caller with no key
            await self.owns(request, joined[0] if task is not None and joined else None)
        except Refusal as refused:
            code = REFUSAL_CODES.get(refused.status, "refused")
            return _refusal(refused.status, refused.message, code)
        if task is None or joined is None:
            return _refusal(
                404,
                f"no WebRTC call {call_id[:80]!r} on this node: it ended, or was made on "
                "another node (hang up where its offer was answered)",
                "call_not_found",
            )
        log.info("WebRTC call %s: hung up through the API", call_id)
        task.cancel()  # ``_run`` closes the peer connection and forgets the call
        await asyncio.wait({task})
        return web.Response(status=200)

    async def _run(self, call: CallSocket) -> None:
        serving = asyncio.ensure_future(self.serve(cast(ServerConnection, call)))
        opened = asyncio.ensure_future(call.opened.wait())
        try:
            done, _ = await asyncio.wait(
                (serving, opened),
                timeout=self.settings.connect_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                log.info("WebRTC call %s: no data channel within the connect timeout", call.call_id)
                await call.close()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        finally:
            for task in (opened, serving):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await call.close()
            self.calls.pop(call.call_id, None)
            self.door.calls.pop(call.call_id, None)

    async def close(self) -> None:
        for task in list(self.calls.values()):
            task.cancel()
        for task in list(self.calls.values()):
            with contextlib.suppress(BaseException):
                await task


def _default_model() -> str:
    """The model of a call that names none (agents-js names it after connecting)."""
    return next(m.name for m in MODELS if m.wire == "openai" and not m.shutdown)


MAX_MEDIA: Final = 4
"""Media sections an offer may have: a call uses one audio track and the ``oai-events``
data channel; aiortc makes a transceiver (and answers a section) for each one, on the
loop, so 500 of them in 64 KiB held it for ~150 ms per offer."""

MAX_CANDIDATES: Final = 64
"""An offer's ICE candidates: a browser gathers a few per interface. Each is checked by
sending it STUN requests; 900 held the loop ~100 ms in aiortc and had the node probe 900
addresses the offer chose."""

MAX_LINES: Final = 512
"""Lines of an offer (a browser's audio and data channel offer has about 60)."""
MAX_SAME_ATTRIBUTE: Final = 64
"""Lines of one attribute (``a=rtpmap``, ``a=rtcp-fb``, ``a=ssrc``…) an offer may have:
aiortc applies every ``rtcp-fb`` line to every codec, so 1,400 of each in 47 KB made
2 million objects and held the loop ~2-3 s; each ``ssrc`` line searches the ones before."""


def _media_problem(lines: list[str]) -> str | None:
    """What is wrong with an offer's lines, before aiortc is given them; or None."""
    kinds = [line[2:].partition(" ")[0] for line in lines if line.startswith("m=")]
    if len(kinds) > MAX_MEDIA:
        return (
            f"the offer has {len(kinds)} media sections (m= lines); a call takes one audio "
            f"track and the oai-events data channel (at most {MAX_MEDIA} sections)"
        )
    attributes = Counter(line[2:].partition(":")[0] for line in lines if line.startswith("a="))
    candidates = attributes.pop("candidate", 0)
    name, most = attributes.most_common(1)[0] if attributes else ("", 0)
    if most > MAX_SAME_ATTRIBUTE:
        return (
            f"the offer has {most} a={name[:40]} lines; a browser's has a few (at most "
            f"{MAX_SAME_ATTRIBUTE} of one attribute): send the offer createOffer() made"
        )
    if candidates > MAX_CANDIDATES:
        return (
            f"the offer has {candidates} ICE candidates (a=candidate lines); a browser's "
            f"has a few, at most {MAX_CANDIDATES} are taken: send the offer createOffer() made"
        )
    if len(lines) > MAX_LINES:
        return (
            f"the offer has {len(lines)} lines; a browser's has about 60 (at most "
            f"{MAX_LINES} are taken): send the offer createOffer() made"
        )
    if "audio" not in kinds:
        return (
            "the offer has no audio section (m=audio): add the microphone's track "
            "(sendrecv, Opus) and the oai-events data channel before creating the offer"
        )
    if "application" not in kinds:  # the call would wait for a channel it cannot open
        return (
            "the offer has no data channel (m=application): create the oai-events data "
            "channel (pc.createDataChannel('oai-events')) before creating the offer"
        )
    return None


MAX_PARTS: Final = 4
"""Parts of a multipart offer: ``sdp`` and ``session`` are read, a few more are let be
(1,000 parts in 64 KiB held the loop 120 ms in the email parser)."""

_TOO_DEEP: Final = "the session nests too deeply to read: send a client_secrets session"


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
        except RecursionError:  # msgspec recurses per level: ~1,000 is its end
            return _TOO_DEEP
        if not isinstance(body, dict) or not str(body.get("sdp", "")).startswith("v=0"):
            return 'the JSON body takes "sdp" (the SDP offer) and "session" (optional)'
        given = body.get("session") or {}
        if not isinstance(given, dict):
            return '"session" is a JSON object (a client_secrets session)'
        return str(body["sdp"]), given
    if content_type == "multipart/form-data":
        # Python's email parser takes ~0.1 ms of the loop per part: counted first, every
        # delimiter line (nested ones too) whatever the boundary, split as the parser
        # splits them (a bare CR is a line break there: 9,000 parts got past a count of
        # LF-led ones and held the loop 1.2 s).
        if sum(line.startswith(b"--") for line in raw.splitlines()) > MAX_PARTS + 1:
            return (
                f"the multipart body takes the parts 'sdp' and 'session' (at most {MAX_PARTS} "
                "parts in all)"
            )
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
            except RecursionError:
                return _TOO_DEEP
            if not isinstance(session, dict):
                return "the part 'session' is a JSON object (a client_secrets session)"
        return sdp, session
    return (
        "send the SDP offer as Content-Type application/sdp, or multipart/form-data "
        "with the parts 'sdp' and 'session' (or JSON with those fields)"
    )
