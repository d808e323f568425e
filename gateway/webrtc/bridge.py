"""A WebRTC call's way into its session: a loopback connection to the node's own door.

Known extra hop (docs/webrtc.md): the OpenAI door's WebSocket clients are
served directly (``gateway.edge.openai_door.DoorConnection``, a
``ClientConnection`` speaking OpenAI's events); a WebRTC call is still served
through a WebSocket connection to this node's own ``/v1/realtime``, made with
the caller's credentials, so every check of the gateway's door (API key or
client token, origin, connection limits, session ownership, resume) is made
there. The next step is to drive a call as the door drives its
``DoorConnection``, without the loopback.

``LoopbackBridge.open`` makes that connection (or the refusal to answer);
``LoopbackBridge.pump`` carries frames both ways between it and the call's
``Link`` (its data channel and audio tracks) through a ``Conversation``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, Protocol
from urllib.parse import quote

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.config import Config
from gateway.edge.closes import CloseCode
from gateway.edge.frame_rate import FrameRate, Verdict
from gateway.edge.tokens import is_client_token
from protocol.audio import split_audio_frame
from protocol.configuration import SessionConfig
from protocol.events import Configure, Configured, Error, Played, Session, decode_event
from protocol.openai_conversation import Conversation, Emit
from protocol.openai_events import OutputAudioBufferClear, decode_client, encode

__all__ = ["DoorSession", "Link", "LoopbackBridge", "Refused"]

log = logging.getLogger("gateway.webrtc.bridge")

_OPEN_TIMEOUT: Final = 10.0
_command_encoder: Final = msgspec.json.Encoder()
_AUDIO_DELTA: Final = "response.output_audio.delta"
_SPEECH_STARTED: Final = "input_audio_buffer.speech_started"
_RESPONSE_CREATED: Final = "response.created"


class Refused(msgspec.Struct, frozen=True):
    """A refusal before the client's transport opens: HTTP status, message, OpenAI code."""

    status: int
    message: str
    code: str


class Link(Protocol):
    """A call's transport of the door's events: its data channel, its audio tracks."""

    def incoming(self) -> AsyncIterator[str | bytes]:
        """The client's frames; it ends when the client is gone."""
        ...

    async def send(self, text: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...

    def speech(self, tag: int, pcm16: bytes) -> bool:
        """The model's speech: True if played here (a media track: no delta events)."""
        ...

    def cut_speech(self) -> Played | None:
        """Stop playing the answer now (speech over it, or the client's
        ``output_audio_buffer.clear``); how much of it was heard, if known here."""
        ...

    def answer_started(self) -> None:
        """A response began (its speech's played position counts from zero)."""
        ...

    def progress(self) -> Played | None:
        """How far the answer has played, when that moved (asked at each microphone frame)."""
        ...

    def media(self) -> AsyncIterator[bytes]:
        """The user's audio at the conversation's ``input_rate`` (a microphone track)."""
        ...


class DoorSession(msgspec.Struct):
    """A call's loopback connection to its session, as ``LoopbackBridge.open`` made it."""

    inner: ClientConnection
    sid: str
    model: str
    route: tuple[str, str]
    after: tuple[int, int] | None
    early: list[str]  # frames read during the handshake, for the conversation
    head: int = 0  # a resumed session's last seq when joined: its replay ends there


class LoopbackBridge:
    """The calls' connections to this node's own door, and the frames through them."""

    def __init__(
        self,
        config: Config,
        config_of: Callable[[str], Awaitable[SessionConfig | None]],
        address: Callable[[], str],
    ) -> None:
        """``config_of(sid)``: a session's configuration (``session.created`` of a call
        joining a session made elsewhere); ``address()``: ``HOST:PORT`` of this node's
        own door (known once it listens)."""
        self.config = config
        self.config_of = config_of
        self.address = address

    async def open(
        self,
        model: str,
        route: tuple[str, str],
        authorization: str | None,
        origin: str | None,
        *,
        sid: str = "",
        after: tuple[int, int] | None = None,
    ) -> DoorSession | Refused:
        """A connection to this node's own door with the client's credentials (every
        check of the gateway's door is made there), or the refusal to answer with."""
        headers: list[tuple[str, str]] = []
        if authorization is not None:
            headers.append(("Authorization", authorization))
        token = is_client_token((authorization or "").partition(" ")[2].strip())
        if origin is not None:
            headers.append(("Origin", origin))
        url = f"ws://{self.address()}/v1/realtime"
        if sid:
            url += f"?session_id={quote(sid)}&after=0"
        try:
            inner = await connect(
                url,
                additional_headers=headers,
                open_timeout=_OPEN_TIMEOUT,
                max_size=self.config.max_frame,
                compression=None,
                user_agent_header=None,
            )
        except InvalidStatus as exc:
            answer = exc.response
            text = answer.body.decode("utf-8", "replace").strip() if answer.body else ""
            code = {401: "invalid_api_key", 403: "forbidden", 404: "session_not_found"}
            return Refused(answer.status_code, text, code.get(answer.status_code, "refused"))
        except (OSError, TimeoutError) as exc:
            log.warning("OpenAI door: cannot reach this node's own endpoint: %s", exc)
            return Refused(503, "the gateway cannot serve this session now; retry", "busy")
        try:
            first = decode_event(await asyncio.wait_for(inner.recv(), _OPEN_TIMEOUT))
        except (ConnectionClosed, TimeoutError, msgspec.DecodeError):
            await inner.close()
            return Refused(503, "the gateway cannot serve this session now", "busy")
        if not isinstance(first, Session):
            await inner.close()
            return Refused(503, "the gateway cannot serve this session now", "busy")
        early: list[str] = []
        # A new session is configured for ?model= now, before the client's transport
        # opens: a model the key's policy (or the node) refuses is refused here, not
        # after a turn ran on another model. A token's session was configured when it
        # was minted.
        if not sid and not token:
            refused = await self._configure(inner, route, early)
            if refused is not None:
                await inner.close()
                return refused
        return DoorSession(
            inner,
            first.session_id,
            model,
            route,
            after=after,
            early=early,
            head=first.seq if sid else 0,
        )

    async def _configure(
        self, inner: ClientConnection, route: tuple[str, str], early: list[str]
    ) -> Refused | None:
        """Configure the new session for its route; the refusal to answer, if any.
        The frames read meanwhile are kept in ``early`` for the conversation."""
        await inner.send(_command_encoder.encode(_configure(route)).decode())
        try:
            async with asyncio.timeout(_OPEN_TIMEOUT):
                while True:
                    frame = await inner.recv()
                    if not isinstance(frame, str):
                        continue
                    event = decode_event(frame)
                    if isinstance(event, Error) and not event.seq:
                        status = 403 if event.code == "forbidden" else 400
                        return Refused(status, event.content, event.code)
                    early.append(frame)
                    if isinstance(event, Configured):
                        return None
        except (ConnectionClosed, TimeoutError):
            return Refused(503, "the gateway cannot serve this session now", "busy")

    async def pump(
        self, state: DoorSession, link: Link, conversation: Conversation | None = None
    ) -> None:
        """Frames both ways between a client's link and its session, until either ends."""
        inner = state.inner
        if conversation is None:
            conversation = Conversation(state.sid, state.model)
        after = state.after
        caught_up = asyncio.Event()  # the session's log up to the connection's head was read
        if state.head == 0:
            caught_up.set()

        async def send(events: list[dict[str, object]]) -> None:
            nonlocal after
            for event in events:
                if after is not None:
                    position = Conversation.position(str(event["event_id"]))
                    if position is None or position <= after:
                        continue
                await link.send(encode(event))

        async def frames() -> AsyncIterator[str | bytes]:
            for early in state.early:
                yield early
            async for frame in inner:
                yield frame

        async def downstream() -> None:
            nonlocal after
            async for frame in frames():
                if isinstance(frame, bytes):  # the model's speech (never logged, never replayed)
                    try:
                        tag, pcm = split_audio_frame(frame)
                    except ValueError:
                        continue
                    if after is None:
                        events = conversation.audio(tag, pcm)
                        if any(e["type"] == _RESPONSE_CREATED for e in events):
                            link.answer_started()
                        if link.speech(tag, pcm):  # played on a track: no deltas
                            events = [e for e in events if e["type"] != _AUDIO_DELTA]
                        await send(events)
                    continue
                event = decode_event(frame)
                events = conversation.gateway(event)
                # A response's overrides taken back: before the client hears it is done.
                for command in conversation.take_due():
                    await inner.send(_command_encoder.encode(command).decode())
                if any(e["type"] == _RESPONSE_CREATED for e in events):
                    link.answer_started()
                if any(e["type"] == _SPEECH_STARTED for e in events):
                    heard = link.cut_speech()
                    if heard is not None:
                        await inner.send(_command_encoder.encode(heard).decode())
                await send(events)
                if after is not None and event.seq > after[0]:
                    after = None  # caught up: everything from here is new
                if event.seq >= state.head:
                    caught_up.set()

        async def to_session(emit: Emit) -> None:
            for command in emit.commands:
                if isinstance(command, bytes):
                    await inner.send(command)  # user audio: a binary frame
                else:
                    await inner.send(_command_encoder.encode(command).decode())
            await send(emit.events)

        async def microphone() -> None:
            async for pcm in link.media():
                if not caught_up.is_set():
                    continue  # a resumed session's replay first: it says how it hears
                played = link.progress()
                if played is not None:  # kept by the session for a barge-in's cut
                    await inner.send(_command_encoder.encode(played).decode())
                await to_session(conversation.speech_in(pcm))

        async def upstream() -> None:
            if not state.early and after is None:  # a session made elsewhere: show it
                config = await self.config_of(state.sid)
                if config is not None:
                    await send([conversation.created(config)])
            cfg = self.config
            rate = FrameRate(cfg.client_frames_per_second, cfg.client_frame_burst, time.monotonic())
            async for frame in link.incoming():
                if isinstance(frame, bytes):
                    frame = frame.decode("utf-8", "replace")
                # Audio (50 appends a second from a microphone) is not counted, as on the
                # gateway's own door; every other event is, before any work is done for it.
                if '"input_audio_buffer.append"' not in frame[:200]:
                    verdict = rate.check(time.monotonic())
                    if verdict is Verdict.CLOSE:
                        await link.close(CloseCode.RATE_LIMITED, "too many events; slow down")
                        return
                    if verdict is not Verdict.ACCEPT:
                        if verdict is Verdict.REFUSE:
                            await send(
                                [
                                    conversation.error(
                                        f"too many events: at most {cfg.client_frames_per_second:g}"
                                        f"/s (bursts of {cfg.client_frame_burst}); events over it "
                                        "are dropped unread; slow down",
                                        code="rate_limit_exceeded",
                                    )
                                ]
                            )
                        continue
                event = decode_client(frame)
                if isinstance(event, OutputAudioBufferClear):  # WebRTC: the buffer is ours
                    heard = link.cut_speech()
                    if heard is not None:
                        await inner.send(_command_encoder.encode(heard).decode())
                await to_session(conversation.client(event, model_route=state.route))

        tasks = [
            asyncio.create_task(downstream(), name=f"openai-down:{state.sid}"),
            asyncio.create_task(upstream(), name=f"openai-up:{state.sid}"),
        ]
        mic = asyncio.create_task(microphone(), name=f"openai-mic:{state.sid}")
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in [*tasks, mic]:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            code = inner.close_code
            reason = inner.close_reason or ""
            with contextlib.suppress(Exception):
                await inner.close()
            if code == CloseCode.SERVICE_RESTART:  # say how to resume through this door
                reason = (
                    "reconnect with session_id and after_event (node draining or session moved)"
                )
            if code is not None and code != 1000:
                with contextlib.suppress(Exception):
                    await link.close(code, reason)


def _configure(route: tuple[str, str]) -> Configure:
    return Configure(provider=route[0], model=route[1])
