"""One client WebSocket: its reader (client messages) and its writer (events).

The writer sends logged events in ``seq`` order with no gap and no duplicate.
It has two modes. *Live*: events the session hands over are queued and sent.
*Catch-up*: events are read from the store's log after the last ``seq`` this
client got. A connection starts in catch-up (that is resume: replay after
``after``, then live), and falls back to it when the client is too slow and its
queue passes ``send_queue_frames``: memory stays bounded and the client still
gets every event, from the log instead of from memory.

In event mode (``?stream=event``) think and respond chunks are joined into one
frame per segment (``gateway.edge.backpressure.SegmentJoiner``), live and in
replay alike. The reader limits how fast a client may send frames
(``gateway.edge.frame_rate``): one client cannot take a core.

Voice (``protocol.audio``): binary frames from the client are user audio, handed to
the session's upstream as they come (under an audio limit of their own: ``AudioIn``);
binary frames to the client are the model's speech, sent as soon as they arrive — a
client whose writer is behind misses them (it has the text).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import MutableMapping, Sequence

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gateway import wsfast
from gateway.edge.audio_in import DRIVEN_ELSEWHERE, AudioIn
from gateway.edge.backpressure import SendPressure
from gateway.edge.closes import CloseCode, close_reason
from gateway.edge.frame_rate import FrameRate, Verdict, over_limit, weight
from gateway.edge.outbox import Outbox
from gateway.sessions.commands import COMMANDS, admit, dispatch
from gateway.sessions.port import NodePort
from gateway.sessions.subscriber import DrivenSession, EventSource
from gateway.store.base import LogEntry, StoreUnavailable
from protocol.client_frames import decode_client
from protocol.events import (
    AudioChunk,
    AudioCleared,
    Error,
    Ping,
    Pong,
    Session,
    answering,
    decode_event,
    encode,
)

__all__ = ["ClientConnection"]

log = logging.getLogger("gateway.edge.connection")

_REPLAY_PAGE = 500
# A replay page's bytes: a client catching up over large events holds one page
# in memory at a time, not all of them.
_REPLAY_BYTES = 1 << 20


class ClientConnection:
    """Serves one client WebSocket attached to one session."""

    drained = "node draining; reconnect with session_id and after=<last seq>"  # 1012's reason

    def __init__(
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
    ) -> None:
        """``unrecorded``: the node's new sessions not stored yet (sid → owner);
        one is stored at its first turn or configure (``Node.record_session``).
        ``trusted``: the client presented an API key (not a client token), so
        it may change the session's configuration. ``may_approve``: it may
        decide on calls that wait for approval (default: when ``trusted``; a
        client token only if minted with the ``approve`` right)."""
        self.node = node
        self.ws = ws
        self._sid = sid
        self.trusted = trusted
        self.may_approve = trusted if may_approve is None else may_approve
        self.resumed = resumed
        # What the connection reads: the session driven here (``driven``, which it
        # also commands), or a follower of another node's log.
        self.source: EventSource | None = None
        self.driven: DrivenSession | None = None
        cfg = node.config
        self.out = Outbox(
            after,
            limit=cfg.send_queue_frames,
            pressure=SendPressure(cfg.coalesce_after, cfg.send_queue_frames, node.metrics),
            event_mode=event_mode,
        )
        self.mic = AudioIn(self)
        self._close: tuple[int, str] | None = None
        self.conn_id = uuid.uuid4().hex
        self._redispatched = 0
        self._unrecorded: MutableMapping[str, str] = unrecorded if unrecorded is not None else {}
        self._frame_rate = FrameRate(
            node.config.client_frames_per_second, node.config.client_frame_burst, time.monotonic()
        )

    @property
    def sid(self) -> str:
        return self._sid

    @property
    def last_sent(self) -> int:
        """The seq of the last frame handed to the socket (``Outbox.last_sent``)."""
        return self.out.last_sent

    # ------------------------------------------------------------- Subscriber

    def deliver(self, entries: Sequence[LogEntry]) -> None:
        out = self.out
        if entries and entries[-1].seq > out.newest:
            out.newest = entries[-1].seq
        if out.lagging:
            return  # the writer reads these from the log
        if out.idle and not out.queue and out.joiner is None:
            sent = self._send_now(entries)
            if sent == len(entries):
                return
            entries = entries[sent:]
        out.queue_events(entries, self.node.metrics)

    def _send_now(self, entries: Sequence[LogEntry]) -> int:
        """Write the frames from here when the writer has nothing to do; how many
        were written (the rest are the writer's: socket buffer full, connection
        closing, not the next seq).

        The common case of a client that keeps up: no writer wake-up, no task
        switch, one socket write for the batch. A batch is written up to
        ``write_limit`` bytes: one log round may carry thousands of a session's
        events (a fast stream while the store answers slowly), and a client that
        stopped reading would otherwise hold them all in the socket's buffer,
        past the bound the writer keeps (``gateway.edge.backpressure``).
        """
        if self._close is not None or not wsfast.can_write_now(self.ws):
            return 0
        out = self.out
        last = out.last_sent
        frames: list[bytes] = []
        room = self.node.config.write_limit
        for entry in entries:
            if entry.seq != last + 1:
                return 0  # a gap or an overlap: the writer sorts it out from the log
            if room <= 0 and frames:
                break
            frames.append(entry.data)
            room -= len(entry.data)
            last = entry.seq
        try:
            self._write_now(frames)
        except Exception:  # the connection broke: the writer's next send ends it
            out.wake.set()
        out.last_sent = last
        return len(frames)

    def deliver_audio(self, frame: bytes) -> None:
        out = self.out
        if out.lagging or self._close is not None:
            return  # catching up from the log: audio is not there, the transcript is
        if out.idle and not out.queue and wsfast.can_write_now(self.ws):
            try:
                self._write_now([frame], binary=True)
            except Exception:  # the connection broke: the writer's next send ends it
                out.wake.set()
            return
        out.queue_audio(frame)

    def notify(self, event: Error | Pong | AudioCleared) -> None:
        self.out.queue_reply(event)

    def reply_frame(self, data: bytes) -> None:
        """An error from the driving node answering a command forwarded from here."""
        event = decode_event(data)
        if isinstance(event, Error):
            self._reply(event)

    def redispatch(self, frame: bytes) -> None:
        """Run a forwarded command again: its session stopped being driven elsewhere."""
        self._redispatched += 1
        if self._redispatched > 5:  # the session keeps moving: let the client decide
            moving = Error(
                code="turn_active", content="the session is moving between nodes; send again"
            )
            self._reply(answering(moving, decode_client(frame)))
            return
        self.node.spawn(self._handle(frame.decode()), f"redispatch:{self.sid}")

    def session_lost(self, reason: str) -> None:
        # The reason is for the log: it may name nodes and runs past a close
        # frame's 123 bytes. The client only needs to know what to do.
        log.info("session %s: closing client (1012): %s", self.sid, reason, extra={"sid": self.sid})
        if self._close is not None:
            return  # already closing for a reason of its own (a deletion)
        self._close = (
            CloseCode.SERVICE_RESTART,
            "session moved to another node; reconnect with session_id and after=<last seq>",
        )
        self.out.wake.set()

    def session_deleted(self) -> None:
        """The session was deleted: close with 4404; resuming it answers 404."""
        self._close = (CloseCode.SESSION_DELETED, "session deleted")
        self.out.wake.set()

    def revoked(self) -> None:
        """Its API key was revoked (the key it presented, or the one that minted its
        client token): close with 4401; the reader takes no frame from now on."""
        if self._close is None:
            self._close = (CloseCode.KEY_REVOKED, "API key revoked: this credential opens nothing")
            self.out.wake.set()

    def switch_source(self, session: DrivenSession) -> None:
        """The session is now driven by this node (takeover): read and command it."""
        self.source = self.driven = session
        self.out.lagging = True
        session.attach(self)
        self.out.wake.set()

    # ------------------------------------------------------------- lifecycle

    async def serve(self) -> None:
        node = self.node
        node.connections[self.conn_id] = self
        try:
            await self._serve()
        finally:
            node.connections.pop(self.conn_id, None)

    async def _serve(self) -> None:
        node = self.node
        await self._attach()
        driven = self.driven
        head = driven.last_seq if driven is not None else await node.store.last_seq(self.sid)
        self.out.newest = max(self.out.newest, head)
        provider = driven.provider if driven is not None else node.upstream_factory.provider
        first = Session(
            session_id=self.sid,
            seq=head,
            timestamp=time.time(),
            resumed=self.resumed,
            provider=provider,
            node=node.node_id,
        )
        await self._send([encode(first)])
        # Two tasks for the connection's life, none per frame: the writer ending
        # by itself (the connection closed or broke) cancels the reader. One
        # cancelled by ``_close_flooding`` does not: that reader closes the socket.
        writer = asyncio.create_task(self._writer(), name=f"writer:{self.sid}")
        reader = asyncio.create_task(self._reader(writer), name=f"reader:{self.sid}")

        def writer_ended(task: asyncio.Task[None]) -> None:
            if not task.cancelled():
                reader.cancel()

        writer.add_done_callback(writer_ended)
        try:
            await asyncio.wait((reader,))
            if not reader.cancelled():
                reader.result()  # the reader's own failure, if any
            elif writer.done() and not writer.cancelled() and writer.exception() is not None:
                await self._writer_failed(writer.exception())
        finally:
            for task in (reader, writer):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            source = self.source
            if source is not None:
                source.detach(self)

    async def _attach(self) -> None:
        runtime = await self.node.drive(self.sid)
        if runtime is not None:
            self.source = self.driven = runtime
            runtime.attach(self)
            return
        follower = await self.node.follow(self.sid)
        self.source = follower
        follower.attach(self)

    async def _reader(self, writer: asyncio.Task[None]) -> None:
        """Client frames, one ``recv`` each and nothing else per frame.

        A microphone sends 50 frames a second per session: a task and an
        ``asyncio.wait`` per frame (how this loop once watched the writer)
        cost more CPU than relaying the audio (``tests/bench/voice_session_bench.py``).
        """
        check = self._frame_rate.check
        clock = time.monotonic
        queue = self.out.queue
        mic = self.mic
        messages = getattr(self.ws, "recv_messages", None)
        if isinstance(messages, wsfast.MessageQueue):
            messages.intercept = mic.take
        try:
            async for frame in self.ws:
                if self._close is not None:
                    return  # closing: its frames are not processed any more
                if queue:
                    # Frames already received are returned without a pause:
                    # let the writer send the replies queued so far, or a
                    # client that sends a burst before reading would find
                    # them dropped (``SendPressure.may_queue_reply``).
                    await asyncio.sleep(0)
                heard = None  # audio's verdict: it has a limit of its own (``AudioIn``)
                if isinstance(frame, bytes):
                    heard = verdict = await mic.binary(frame)
                    await asyncio.sleep(0)  # buffered frames come without a pause: others' turn
                elif '"audio"' in frame and (heard := await mic.json(frame)) is not None:
                    verdict = heard
                elif (verdict := check(clock(), weight(len(frame)))) is Verdict.ACCEPT:
                    await self._handle(frame)
                if verdict is Verdict.ACCEPT:
                    continue
                if verdict is Verdict.REFUSE:
                    self.node.metrics.clients.frames_dropped.inc()
                    rate = self._frame_rate
                    self._reply(mic.refusal() if heard else flood_refusal(rate))
                elif verdict is Verdict.CLOSE:
                    await self._close_flooding(writer)
                    return
                else:
                    self.node.metrics.clients.frames_dropped.inc()
        except ConnectionClosed:
            return
        finally:
            if isinstance(messages, wsfast.MessageQueue):
                messages.intercept = None

    async def _close_flooding(self, writer: asyncio.Task[None]) -> None:
        """Close a client that kept flooding, reading nothing more of it; abort the
        TCP connection if it has not closed its end within 2 s (it may not read at all)."""
        self.node.metrics.clients.frames_dropped.inc()
        log.warning(
            "session %s: closing a client that keeps sending over its frame limit",
            self.sid,
            extra={"sid": self.sid},
        )
        self._close = (
            CloseCode.RATE_LIMITED,
            close_reason("too many frames; slow down, then reconnect with session_id and after"),
        )
        writer.cancel()
        with contextlib.suppress(BaseException):
            await writer
        ws = self.ws
        assert isinstance(ws, wsfast.FastReader)  # every door's connection class is one
        ws.fail_discarding(*self._close)  # what it sends on is dropped unparsed
        try:
            async with asyncio.timeout(2.0):
                await ws.wait_closed()
        except TimeoutError:
            ws.transport.abort()

    async def _handle(self, frame: str | bytes) -> None:
        if isinstance(frame, bytes):
            await self.mic.send(frame)
            return
        message = decode_client(frame)
        if isinstance(message, Error):
            self._reply(message)
            return
        if isinstance(message, Ping):
            self.notify(answering(Pong(timestamp=time.time()), message))
            return
        if isinstance(message, AudioChunk):
            await self.mic.send(message.audio, message.id)
            return
        refusal = await admit(message, self)
        if refusal is not None:
            self._reply(refusal)
            return
        spec = COMMANDS[type(message)]
        runtime = await self._runtime_to_run(frame, message, spec.forwarded)
        if runtime is None:
            return  # forwarded (the driving node answers), or refused
        self._redispatched = 0
        error = await dispatch(message, runtime)
        if error is not None:
            self._reply(error)
        elif spec.answer is not None:
            self.notify(answering(spec.answer(timestamp=time.time()), message))

    async def _runtime_to_run(
        self, frame: str, message: object, forwarded: bool
    ) -> DrivenSession | None:
        """The session's runtime here, to run a command on; None when it went to the
        node driving the session (``forwarded`` commands) or was refused (replied)."""
        runtime = None
        # The lease can change hands between looking and forwarding: look again.
        for _ in range(3):
            runtime = await self._runtime_for_command()
            if runtime is not None or not forwarded:
                break
            try:
                if await self.node.forward(self.sid, frame.encode(), self.conn_id):
                    return None  # the driving node answers through the log (or a reply)
            except StoreUnavailable:
                break
        if runtime is None and not forwarded:
            # Voice is driven where its client is (audio is not forwarded between nodes).
            self._reply(answering(Error(code="turn_active", content=DRIVEN_ELSEWHERE), message))
        elif runtime is None:
            self._reply(
                answering(
                    Error(
                        code="store",
                        content="the session store is unavailable, so this message could not "
                        "reach the session; send it again in a few seconds",
                    ),
                    message,
                )
            )
        return runtime

    # ------------------------------------------------------------- Sender

    @property
    def draining(self) -> bool:
        return self.node.draining

    async def admit_turn(self) -> Error | None:
        return await self.node.limits.admit_turn(self.sid, self.driven)

    async def record(self) -> Error | None:
        """Store a new session at its first turn or configuration (``commands.admit``).

        A connection that never sends a message leaves no session behind.
        """
        owner = self._unrecorded.get(self.sid)
        if owner is None:
            return None
        try:
            await self.node.record_session(self.sid, owner)
        except StoreUnavailable:
            return Error(
                code="store",
                content="the session store is unavailable, so the session could "
                "not be saved; send your message again in a few seconds",
            )
        self._unrecorded.pop(self.sid, None)
        return None

    async def _runtime_for_command(self) -> DrivenSession | None:
        driven = self.driven
        if driven is not None and not driven.closed:
            return driven
        try:
            runtime = await self.node.drive(self.sid)
        except StoreUnavailable:
            return None
        if runtime is not None:
            if self.source is not None and self.source is not driven:
                self.source.detach(self)  # the follower of another node's log
            self.switch_source(runtime)
        return runtime

    @property
    def client_seq(self) -> int:
        """The seq of the last logged event the client has been sent (held
        chunks of an event-mode segment are not sent yet)."""
        return self.out.client_seq

    def _reply(self, error: Error) -> None:
        """An error answering this client's own frame: not logged, sent to it only."""
        error.seq = self.client_seq
        error.timestamp = time.time()
        self.notify(error)

    # ------------------------------------------------------------- writer

    async def _writer_failed(self, exc: BaseException | None) -> None:
        """The writer broke on a bug: logged with its traceback, and the client told
        to reconnect (1011 with ``after``), not shown a normal close (1000) as if the
        session had ended."""
        log.error(
            "session %s: sending to a client failed; it is closed with %d to reconnect",
            self.sid,
            CloseCode.INTERNAL_ERROR,
            exc_info=exc,
            extra={"sid": self.sid},
        )
        reason = f"internal error: reconnect with session_id and after={self.client_seq}"
        with contextlib.suppress(Exception):
            await self.ws.close(CloseCode.INTERNAL_ERROR, close_reason(reason))

    async def _writer(self) -> None:
        ws = self.ws
        out = self.out
        queue = out.queue
        try:
            while True:
                if self._close is not None:
                    await ws.close(self._close[0], close_reason(self._close[1]))
                    return
                if out.lagging:
                    await self._catch_up()
                if queue:  # everything queued, in order (merged if the client is behind)
                    for frames, binary in out.take_queued():
                        await self._send(frames, binary=binary)
                if out.lagging or queue or self._close is not None:
                    continue
                out.wake.clear()
                out.idle = True
                try:
                    await out.wake.wait()
                finally:
                    out.idle = False
        except ConnectionClosed:
            return

    # ------------------------------------------------------------- the wire
    # What goes to the client, in one place: the gateway's events as they are
    # logged. Another door (``gateway.edge.openai_door``) translates them here.

    def _write_now(self, frames: list[bytes], *, binary: bool = False) -> None:
        """Written without awaiting, for a caller that checked ``wsfast.can_write_now``:
        text frames (logged events, replies), or one binary frame (the model's speech)."""
        if binary:
            wsfast.write_binary_now(self.ws, frames[0])
        else:
            wsfast.write_now(self.ws, frames)

    async def _send(self, frames: list[bytes], *, binary: bool = False) -> None:
        """Text frames as one write (then drain is awaited), or one binary frame."""
        if binary:
            await self.ws.send(frames[0], text=False)
        elif frames:
            await wsfast.send_batch(self.ws, frames)

    async def _catch_up(self) -> None:
        """Send the log after ``last_sent``, then switch to live delivery.

        Live delivery is switched on *before* reading: whatever is logged from
        then on is queued, so reading the log to its end leaves no gap; the
        overlap is dropped by the seq check. Pages are bounded by count and by
        bytes; a page cut short by its bytes is followed by the next one until
        the newest seq known to be logged was sent.
        """
        out = self.out
        out.lagging = False
        store = self.node.store
        while True:
            try:
                entries = await store.read_log(
                    self.sid, out.last_sent, _REPLAY_PAGE, max_bytes=_REPLAY_BYTES
                )
            except StoreUnavailable:
                await asyncio.sleep(self.node.store_retry_delay)
                continue
            batch = out.replay_page(entries)  # the page, sent as one write
            if batch:
                await self._send(batch)
            if not entries or (len(entries) < _REPLAY_PAGE and out.last_sent >= out.newest):
                return


def flood_refusal(frame_rate: FrameRate) -> Error:
    """The reply to a frame over the connection's limit (the frame is dropped unread)."""
    return Error(code="rate_limited", content=over_limit("frames", frame_rate))
