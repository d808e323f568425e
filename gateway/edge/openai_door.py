"""The OpenAI door: ``ws://HOST:PORT/openai/v1/realtime?model=…`` (OpenAI's GA Realtime).

A thin I/O shell around ``protocol.openai_conversation.Conversation``. A client is
admitted by the gateway's own door's checks (``Gateway._admit_client``: key or token,
origin, limits, ownership, resume; a refusal is the same HTTP status with OpenAI's error
body), then served by the gateway's own ``ClientConnection`` (writer, catch-up,
backpressure, commands, limits, revocation) with its wire translated: OpenAI client
events become the gateway's commands, its logged events OpenAI server events
(``DoorConnection``); what it refuses is logged (``door_refusals``).

Credentials: ``Authorization: Bearer KEY`` (an API key or a client token), or a
browser's ``openai-insecure-api-key.KEY`` subprotocol (``realtime`` is selected, as OpenAI's).

Resume (an extension of this gateway): ``?session_id=SID&after_event=EVENT_ID`` reconnects
to the session ``session.created`` named (``session.id``) and sends what follows the last
``event_id`` the client saw: the session's log is replayed through a fresh conversation,
and what it yields up to that event is not sent again; with no ``after_event``, nothing
before the log's head is (``Replay``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Final, Protocol
from urllib.parse import parse_qs

import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from gateway import wsfast
from gateway.common.loop_turns import LoopTurns
from gateway.config import Config
from gateway.edge.closes import CloseCode
from gateway.edge.connection import ClientConnection
from gateway.edge.door_refusals import RefusalLog, error_response
from gateway.edge.frame_rate import Verdict, over_limit, weight
from gateway.edge.http_requests import given_twice, split_target
from gateway.sessions.policy import KeyPolicies, refusal
from gateway.sessions.port import NodePort
from gateway.upstream import providers
from protocol.audio import split_audio_frame
from protocol.configuration import SessionConfig
from protocol.events import Configured, ReplyNow, Session, UserMessage, decode_event
from protocol.openai_audio import APPEND_SLICE, NOT_BASE64, append_pcm, append_pcm_slices
from protocol.openai_conversation import Command, Conversation, Emit, ServerEvent
from protocol.openai_events import (
    InputAudioBufferAppend,
    decode_client,
    decode_large_append,
    encode_frame,
    unread,
)
from protocol.openai_ids import Replay
from protocol.openai_session import route_configure

__all__ = ["OPENAI_PATH", "REFUSAL_CODES", "DoorConnection", "OpenAIDoor"]

REFUSAL_CODES: Final = {401: "invalid_api_key", 403: "forbidden", 404: "session_not_found"}
"""OpenAI's error codes for the gateway's refusals by status (a handshake's, a call's)."""

log = logging.getLogger("gateway.edge.openai_door")

OPENAI_PATH: Final = "/openai/v1/realtime"
INSECURE_KEY: Final = "openai-insecure-api-key."
REALTIME: Final = Subprotocol("realtime")
_command_encoder: Final = msgspec.json.Encoder()
_ONCE: Final = ("model", "session_id", "after_event", "call_id")  # given once (or alike)
_RESUME: Final = "reconnect with session_id and after_event (node draining or session moved)"

# The client's events are read once the replay reached the log's head, or after this.
CATCH_UP_WAIT: Final = 30.0
# A function_call_output waits this long for the response.create that answers it.
OUTPUT_GRACE: Final = 2.0
LARGE_FRAMES_AT_ONCE: Final = 8
"""Frames of ``door_max_frame`` the node holds for all door clients at once (168 MiB by
default); past it, a client's large frame is read once another's is done with."""


class Admission(Protocol):
    """What the gateway's checks established for one handshake (``server.Handshake``):
    ``last_seq``, the session's last seq, read as they checked ``after``."""

    principal: str
    trusted: bool
    last_seq: int


Admit = Callable[
    [ServerConnection, Request, dict[str, list[str]]], Awaitable["Admission | Response"]
]


class _Pending(msgspec.Struct):
    model: str
    route: tuple[str, str]
    after: tuple[int, int] | None
    configure: bool  # configured for ?model= as the connection starts (new, or another model)
    fresh: bool = False  # a new WebSocket session: it answers in audio, OpenAI's default
    make: type[DoorConnection] | None = None  # the connection's class (a WebRTC call's)


class OpenAIDoor:
    """The OpenAI door of one node: its handshakes, and its clients' connections."""

    def __init__(
        self,
        config: Config,
        policies: KeyPolicies,
        admit: Admit,
        config_of: Callable[[str], Awaitable[SessionConfig | None]],
        route_of: Callable[[SessionConfig], tuple[str, str] | None],
    ) -> None:
        """``admit``: the gateway's own handshake checks (a refusal, or what they
        established); ``config_of(sid)``: a session's configuration (shown by
        ``session.created`` to a client of a session made elsewhere: ``client_secrets``);
        ``route_of(config)``: the provider and model it runs (``SessionSetups.route_of``)."""
        self.config = config
        self.policies = policies
        self.admit = admit
        self.config_of = config_of
        self.route_of = route_of
        self._handshakes: dict[ServerConnection, _Pending] = {}
        self._reapers: set[asyncio.Task[None]] = set()
        # This node's WebRTC calls: call id -> (session id, model), for ?call_id=.
        self.calls: dict[str, tuple[str, str]] = {}
        # The large frames (recordings sent whole) all door clients hold, and their work.
        self.large_frames = wsfast.FrameBudget(LARGE_FRAMES_AT_ONCE * config.door_max_frame)
        self.slice_turns = LoopTurns()

    def owns(self, ws: ServerConnection) -> bool:
        return ws in self._handshakes

    def select_subprotocol(self, offered: Sequence[Subprotocol]) -> Subprotocol | None:
        return REALTIME if REALTIME in offered else None

    async def handshake(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return error_response(
                426, f"{OPENAI_PATH} is a WebSocket endpoint: send a WebSocket handshake", "upgrade"
            )
        query = parse_qs(split_target(request.path)[1])
        if twice := given_twice(query, _ONCE):
            return error_response(400, twice, "duplicate_parameter")
        call_id = (query.get("call_id") or [""])[-1]
        call = self.calls.get(call_id) if call_id else None
        if call_id and call is None:
            return error_response(
                404, f"no WebRTC call {call_id[:80]!r} on this node", "call_not_found"
            )
        model = (query.get("model") or [""])[-1] or (call[1] if call else "")
        if not model:
            return error_response(
                400, "name the model: connect to ?model=MODEL (e.g. gpt-realtime-2.1)", "model"
            )
        authorizations = request.headers.get_all("Authorization")
        if len(authorizations) > 1:
            return error_response(401, "send one Authorization header, not several", "auth")
        offered = [
            p.strip()
            for value in request.headers.get_all("Sec-WebSocket-Protocol")
            for p in value.split(",")
        ]
        insecure = next((p for p in offered if p.startswith(INSECURE_KEY)), None)
        headers = Headers(
            (name, value)
            for name, value in request.headers.raw_items()
            if name.lower() != "sec-websocket-protocol"  # the gateway's door reads its own
        )
        if not authorizations and insecure is not None:
            headers["Authorization"] = "Bearer " + insecure[len(INSECURE_KEY) :]
        # The sideband (?call_id=): the app's server joins the call's session.
        sid = call[0] if call else (query.get("session_id") or [""])[-1]
        after_event = (query.get("after_event") or [""])[-1]
        after: tuple[int, int] | None = None
        if after_event:
            after = Conversation.position(after_event)
            if after is None or not sid:
                return error_response(
                    400,
                    "after_event takes the event_id of the last event received "
                    "(evt_SEQ_N), with session_id",
                    "invalid_after_event",
                )
        return await self.enter(
            connection, Request(request.path, headers), model=model, sid=sid, after=after
        )

    async def enter(
        self,
        connection: ServerConnection,
        request: Request,
        *,
        model: str,
        sid: str,
        after: tuple[int, int] | None,
        make: type[DoorConnection] | None = None,
    ) -> Response | None:
        """Admit a client of this door: the gateway's checks (``admit``), then ``model``
        through the key's aliases and its policy; the refusal, or None once the client's
        connection (``make``'s, a ``DoorConnection`` by default) is ready to be served.
        A WebRTC call enters here too, its data channel as ``connection``."""
        # The session's log is replayed from its start through a fresh conversation.
        gateway_query = {"session_id": [sid], "after": ["0"]} if sid else {}
        admitted = await self.admit(connection, request, gateway_query)
        if isinstance(admitted, Response):
            text = admitted.body.decode("utf-8", "replace").strip() if admitted.body else ""
            return error_response(
                admitted.status_code, text, REFUSAL_CODES.get(admitted.status_code, "refused")
            )
        if after is not None and after[0] > admitted.last_seq:
            # Its client would be sent nothing of the next turns, as if it had seen them.
            return error_response(
                400,
                f"after_event names an event of seq {after[0]}, past this session's log (its "
                f"last seq is {admitted.last_seq}): pass the event_id of the last event "
                "received from this session",
                "invalid_after_event",
            )
        # ?model= through the key's aliases: known once the key is.
        aliases = self.policies.get(admitted.principal).aliases
        route = providers.model_route(self.config.providers, model, aliases)
        if isinstance(route, str):
            if aliases:
                route += f"; or one of this API key's aliases: {', '.join(sorted(aliases))}"
            return error_response(400, route, "model_not_found")
        # A new session is configured for ?model=, and so is a resumed one that runs
        # another (the way to change a session's model: session.update cannot): a model
        # the key's policy refuses is refused here, before the socket opens, not after
        # a turn ran on another model. A token's session keeps what it was minted with.
        configure = admitted.trusted and (not sid or await self._runs_another(sid, route))
        if configure:
            wanted = SessionConfig(provider=route[0], model=route[1])
            if (problem := refusal(self.policies.get(admitted.principal), wanted)) is not None:
                return error_response(403, problem, "forbidden")
        self._handshakes[connection] = _Pending(
            model, route, after=after, configure=configure, make=make, fresh=not (sid or make)
        )
        # OpenAI's appends take 15 MiB: before the first frame is read (1 MiB's 1009 else).
        if (protocol := getattr(connection, "protocol", None)) is not None:
            protocol.max_message_size = self.config.door_max_frame
        # A handshake that never completes (the client went away) leaves nothing behind.
        reaper = asyncio.get_running_loop().create_task(self._forget(connection))
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)
        return None

    async def _runs_another(self, sid: str, route: tuple[str, str]) -> bool:
        """Session ``sid`` runs another provider or model than ``route`` (its unset ones
        are the node's defaults)."""
        config = await self.config_of(sid)
        if config is None:
            return False
        runs = self.route_of(config)
        return runs is not None and runs != route

    async def _forget(self, connection: ServerConnection) -> None:
        await connection.wait_closed()
        self._handshakes.pop(connection, None)

    def connection(
        self,
        node: NodePort,
        ws: ServerConnection,
        *,
        sid: str,
        after: int,
        resumed: bool,
        event_mode: bool = False,
        unrecorded: MutableMapping[str, str] | None = None,
        trusted: bool = True,
        may_approve: bool | None = None,
    ) -> ClientConnection:
        """The connection serving ``ws``, a client of this door (made as ``ClientConnection``)."""
        state = self._handshakes.pop(ws)
        if isinstance(ws, wsfast.FastReader):
            ws.share_budget(self.large_frames)
        return (state.make or DoorConnection)(
            node,
            ws,
            door=self,
            state=state,
            sid=sid,
            after=after,
            resumed=resumed,
            unrecorded=unrecorded,
            trusted=trusted,
            may_approve=may_approve,
        )

    async def close(self) -> None:
        self._handshakes.clear()
        for reaper in list(self._reapers):
            reaper.cancel()


class DoorConnection(ClientConnection):
    """The gateway's client connection, speaking OpenAI's events on its socket: what it
    writes (logged events, replies, speech) goes through the conversation; what it reads
    is made commands, handled as its own frames. A resume replays the log, and what comes
    up to the client's ``after_event`` is not sent again."""

    def __init__(
        self,
        node: NodePort,
        ws: ServerConnection,
        *,
        door: OpenAIDoor,
        state: _Pending,
        sid: str,
        after: int,
        resumed: bool,
        unrecorded: MutableMapping[str, str] | None,
        trusted: bool,
        may_approve: bool | None,
    ) -> None:
        super().__init__(
            node,
            ws,
            sid=sid,
            after=after,
            resumed=resumed,
            unrecorded=unrecorded,
            trusted=trusted,
            may_approve=may_approve,
        )
        self.door = door
        self.state = state
        self.conversation = Conversation(sid, state.model, connection_id=self.conn_id[:10])
        self.conversation.overrides.allowed = trusted
        self.replay = Replay(state.after)  # what of the replayed log the client is sent
        self._caught_up = asyncio.Event()  # the replay reached the log's head
        self._switched: asyncio.Event | None = None  # set by a ?model= switch's configured
        self._grace: asyncio.TimerHandle | None = None  # for outputs held (``_outputs_due``)
        self.refusals = RefusalLog(sid)
        # Commands the conversation asked for as it translated (a response's overrides
        # taken back once it is done): sent in order, before the client's next ones.
        self._due: asyncio.Task[None] | None = None

    # ------------------------------------------------------------- out

    def _emit(self, events: list[ServerEvent], out: list[bytes]) -> None:
        replay = self.replay
        for event in events:
            if replay.skip is not None and not replay.shows(str(event["event_id"])):
                continue
            if event["type"] == "error":
                self.refusals.seen(event)
            out.append(encode_frame(event))

    def _translate(self, frames: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        conversation = self.conversation
        for frame in frames:
            event = decode_event(frame)
            if isinstance(event, Session):  # the connection's first frame: the log's head
                if self.replay.start(event.seq):
                    self._caught_up.set()
                continue
            self._emit(conversation.gateway(event), out)
            if not self.replay.caught_up and self.replay.replayed(event.seq):
                self._caught_up.set()
            elif self._switched is not None and type(event) is Configured:
                self._switched.set()
        if conversation.due:
            due = conversation.take_due()
            self._due = asyncio.get_running_loop().create_task(self._send_due(self._due, due))
        return out

    async def _send_due(self, before: asyncio.Task[None] | None, due: list[Command]) -> None:
        if before is not None:
            await before
        for command in due:
            await self._handle(_command_encoder.encode(command).decode())

    def _speech(self, frame: bytes) -> list[bytes]:
        """The model's speech (never logged, never replayed) as OpenAI's audio deltas."""
        if self.replay.skip is not None:
            return []
        try:
            tag, pcm = split_audio_frame(frame)
        except ValueError:
            return []
        out: list[bytes] = []
        self._emit(self.conversation.audio(tag, pcm), out)
        return out

    def _write_now(self, frames: list[bytes], *, binary: bool = False) -> None:
        out = self._speech(frames[0]) if binary else self._translate(frames)
        if out:
            wsfast.write_now(self.ws, out)

    async def _send(self, frames: list[bytes], *, binary: bool = False) -> None:
        out = self._speech(frames[0]) if binary else self._translate(frames)
        if out:
            await wsfast.send_batch(self.ws, out)

    drained = _RESUME

    def session_lost(self, reason: str) -> None:
        super().session_lost(reason)
        if self._close is not None and self._close[0] == CloseCode.SERVICE_RESTART:
            # Say how to resume through this door.
            self._close = (CloseCode.SERVICE_RESTART, _RESUME)

    async def _send_events(self, events: list[ServerEvent]) -> None:
        out: list[bytes] = []
        self._emit(events, out)
        if out:
            await wsfast.send_batch(self.ws, out)

    # ------------------------------------------------------------- in

    async def _reader(self, writer: asyncio.Task[None]) -> None:
        try:
            await self._read(writer)
        except ConnectionClosed:
            return  # the client went away, or was closed (its close code says why)
        finally:
            self.conversation.release()
            if self._grace is not None:
                self._grace.cancel()
            if self._due is not None:
                self._due.cancel()
                with contextlib.suppress(BaseException):
                    await self._due

    async def _open(self) -> None:
        """Before the client's first event, once the replay reached the log's head (a reply
        made during it would be held back as replayed): its session shown, or configured."""
        state = self.state
        await self._until(self._caught_up, "the door's replay")
        # A session made elsewhere (client_secrets), or joined without after_event (its
        # session.created was replayed, not shown): shown as it is.
        if state.after is None and (self.replay.head > 0 or not state.configure):
            config = await self.door.config_of(self.sid)
            if config is not None:
                await self._send_events([self.conversation.created(config)])
        if state.configure:  # the new session's route (the key's policy allowed it)
            state.configure = False
            first = _command_encoder.encode(route_configure(state.route, audio=state.fresh))
            # A session switched to another model says so before anything else.
            switched = self._switched = asyncio.Event() if self.replay.head > 0 else None
            await self._handle(first.decode())
            if switched is not None:
                await self._until(switched, "the session's switch to its model")
                self._switched = None

    async def _until(self, done: asyncio.Event, what: str) -> None:
        """Wait for ``done``, at most ``CATCH_UP_WAIT``: past it the client is read anyway."""
        try:
            async with asyncio.timeout(CATCH_UP_WAIT):
                await done.wait()
        except TimeoutError:
            log.warning("session %s: %s is slow; reading the client", self.sid, what)

    async def _read(self, writer: asyncio.Task[None]) -> None:
        await self._open()
        check = self._frame_rate.check
        clock = time.monotonic
        messages = getattr(self.ws, "recv_messages", None)
        if isinstance(messages, wsfast.MessageQueue):
            messages.intercept = self._take_append
        try:
            await self._read_events(writer, check, clock)
        finally:
            if isinstance(messages, wsfast.MessageQueue):
                messages.intercept = None

    def _take_append(self, data: bytes, text: bool) -> bool:
        """The read callback's offer of a frame while the reader waits (``wsfast``'s
        intercept): an ``input_audio_buffer.append`` of a session that hears is
        relayed from here, as the gateway's own door relays its clients' audio, with
        no task resumed per 20 ms frame (that wake-up and its ``sleep(0)`` were a
        third of a frame's CPU there). Anything else, or audio the fast path cannot
        take (nothing changed yet), goes to the reader, which answers as before."""
        if (
            self._close is not None
            or not text
            or len(data) > APPEND_SLICE  # read a slice at a time by the reader
            or data.find(b'"input_audio_buffer.append"', 0, 200) < 0
            or not self.conversation.hearing
            or not self.mic.within()  # its verdict is left for the reader: counted once
        ):
            return False
        event = decode_client(data)
        if type(event) is not InputAudioBufferAppend:
            return False
        pcm = append_pcm(event)  # None: not base64, the reader refuses it with its event_id
        if pcm is None or not self.mic.taken(self.mic.now(pcm)):
            return False
        self.conversation.requests.heard(len(pcm))  # what a commit will take
        return True

    async def _read_events(
        self,
        writer: asyncio.Task[None],
        check: Callable[[float, int], Verdict],
        clock: Callable[[], float],
    ) -> None:
        state = self.state
        while True:
            # As bytes: JSON is decoded from them as well, and a 20 MiB append's copy
            # into a str held the loop ~4 ms. A text frame was checked to be UTF-8.
            frame = await self.ws.recv(decode=False)
            if self._close is not None:
                return  # closing: its frames are not processed any more
            # Every event counts before any work is done for it; audio (a microphone's 50
            # appends a second) against a limit of its own, as on the gateway's own door.
            audio = b'"input_audio_buffer.append"' in frame[:200]
            verdict = self.mic.verdict() if audio else check(clock(), weight(len(frame)))
            if verdict is Verdict.CLOSE:
                await self._close_flooding(writer)
                return
            if verdict is not Verdict.ACCEPT:
                if verdict is Verdict.REFUSE:
                    self.node.metrics.clients.frames_dropped.inc()
                    rate = self.mic.rate if audio else self._frame_rate
                    what = "input_audio_buffer.append events" if audio else "events"
                    message = over_limit(what, rate, sized=not audio)
                    error = self.conversation.error(message, code="rate_limit_exceeded")
                    await self._send_events([error])
                del frame  # as below
                continue
            if self._due is not None and not self._due.done():
                await self._due  # the conversation's own commands go first
            if len(frame) > APPEND_SLICE:  # a recording sent whole: read in slices
                await self._large(frame)
            else:
                event = decode_client(frame)
                await self._run(self.conversation.client(event, model_route=state.route))
            # Not held while the next is awaited: the node's budget for large frames no
            # longer counts it (thirty clients' last appends held 320 MiB past it).
            del frame
            await asyncio.sleep(0)  # buffered frames come back without a pause

    async def _large(self, frame: bytes) -> None:
        """A frame over a slice: an append's audio is read without decoding it as JSON
        (``decode_large_append``), a slice at a time; another over ``max_frame`` is refused
        unread. It counts against the node's budget for large frames until the next."""
        if (large := decode_large_append(frame)) is not None:
            await self._append_in_slices(large[0].event_id, large[1])
            return
        event = unread(frame, self.door.config.max_frame) or decode_client(frame)
        if type(event) is InputAudioBufferAppend:
            await self._append_in_slices(event.event_id, event.audio)
        else:
            await self._run(self.conversation.client(event, model_route=self.state.route))

    async def _run(self, emit: Emit) -> None:
        """What the conversation made of a client event: its commands sent, then its events."""
        for command in emit.commands:
            if isinstance(command, bytes):  # user audio
                if not self.mic.now(command):
                    await self.mic.send(command)
            else:
                await self._handle(_command_encoder.encode(command).decode())
                if isinstance(command, UserMessage | ReplyNow):  # a turn: the key's limits now
                    limits = await self.node.limits.standing(self.sid)
                    if limits:
                        emit.events.append(self.conversation.ids.rate_limits(limits))
        if emit.events:
            await self._send_events(emit.events)
        held, grace = bool(self.conversation.requests.typed.outputs), self._grace
        if held and grace is None:  # the grace runs from the oldest output held
            self._grace = asyncio.get_running_loop().call_later(OUTPUT_GRACE, self._outputs_due)
        elif grace is not None and not held:  # a create took them: it is over
            grace.cancel()
            self._grace = None

    def _outputs_due(self) -> None:
        """Outputs no response.create asked for in the grace go on all the same."""
        self._grace = None
        if due := self.conversation.requests.typed.take_outputs():
            self._due = asyncio.get_running_loop().create_task(self._send_due(self._due, [*due]))

    async def _append_in_slices(self, event_id: str | None, audio: str | memoryview) -> None:
        """A recording sent whole (OpenAI takes 15 MiB of audio an append): read, then
        relayed, a slice per turn (``LoopTurns``: one slice of the node's a loop pass),
        and read whole before any is relayed, so a bad one is refused whole."""
        turns, pcm, slices = self.door.slice_turns, list[bytes](), append_pcm_slices(audio)
        while True:
            await turns.take()
            if (piece := next(slices, b"")) is None:
                error = self.conversation.error(NOT_BASE64, event_id=event_id, param="audio")
                await self._send_events([error])
                return
            if not piece:
                break
            pcm.append(piece)
        for piece in pcm:
            await turns.take()
            await self._run(self.conversation.speech_in(piece))
