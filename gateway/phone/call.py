"""One phone call: a carrier's media stream as a client of its voice session.

The stream's first messages are ``connected`` and ``start``; ``start`` opens
the call (``gateway.phone.opening``: who may, what session it gets). From
then on the call is one of the session's subscribers, as a client
connection is (``gateway.sessions.subscriber.Subscriber``):

- ``media`` in: the caller's audio, decoded (``CallAudio.heard``) and sent
  to the session as a microphone's (``SessionRuntime.send_audio``);
- the session's speech out: each chunk encoded (``CallAudio.spoken``) and
  sent as a ``media`` frame, then a ``mark``; the carrier's echo of a mark
  is a playback report (``SessionRuntime.played``), which a barge-in uses
  to cut the provider's copy of the answer where the caller stopped hearing;
- ``speech_started`` while the caller hears an answer: ``clear`` at once,
  so the caller stops hearing it;
- ``dtmf`` in: a logged ``dtmf`` event, and with the session's ``dtmf:
  "message"`` a message to the model; with the plan's ``keypad_approval``,
  ``1`` or ``2`` decides a tool call waiting for approval
  (``gateway.phone.keypad``);
- ``stop`` (or the socket's end) ends the call: a ``phone_call`` event
  with the call's figures (``gateway.phone.meter``) goes to the log, and
  the session stays (its transcript, usage and cost read like any session's).

Writes to the carrier never wait in a subscriber callback: frames are
written at once when the socket takes them, else queued for the writer task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gateway import wsfast
from gateway.edge.closes import CloseCode, close_reason
from gateway.edge.frame_rate import FrameRate, Verdict
from gateway.phone.audio import CALL_RATE, CallAudio
from gateway.phone.carriers import Carrier
from gateway.phone.keypad import KeypadApprovals
from gateway.phone.meter import CallMeter
from gateway.phone.metrics import PhoneMetrics
from gateway.phone.opening import (
    REFUSED,
    CallIdentity,
    Opened,
    Opening,
    Refused,
    open_call,
)
from gateway.phone.playback import Playback
from gateway.sessions.commands import run
from gateway.sessions.runtime import SessionRuntime
from gateway.sessions.subscriber import EventSource
from gateway.store.base import LogEntry
from protocol.audio import split_audio_frame
from protocol.events import Dtmf, Error, PhoneCall, UserMessage
from protocol.media_stream import (
    Clear,
    Connected,
    MarkEcho,
    MarkOut,
    Media,
    Play,
    Started,
    Stopped,
)
from protocol.media_stream import Dtmf as KeyPressed

__all__ = ["CallServices", "PhoneCallConnection"]

log = logging.getLogger("gateway.phone")

_NORMAL: Final = 1000
_GONE: Final = 1001

FRAMES_PER_SECOND: Final = 150.0
"""A carrier's frames a second, sustained: a call's media is 50 (20 ms each) with its
marks and keys; three times that lets a jitter buffer's flush through. Past the burst
frames are dropped, and a carrier that keeps on is closed (4029): a flood of them held
the node's loop (10,000 in 2 s: /healthz at 195 ms)."""
FRAME_BURST: Final = 500
"""Frames at once: 10 s of audio a carrier held back."""
_BAD_FRAMES_LOGGED: Final = 3
"""A call's bad frames logged (each says what was wrong); the rest are only dropped."""

START_TIMEOUT: Final = 10.0
"""Seconds a stream may take to send ``start`` after its handshake."""
PLAYED_OUT_WAIT: Final = 15.0
"""At most, seconds a hang-up or transfer waits for the caller to hear what was said."""


@dataclass(frozen=True)
class CallServices:
    """What every call of a node shares."""

    opening: Opening
    metrics: PhoneMetrics
    calls: dict[str, PhoneCallConnection]  # by session id: the call tools find their call
    settle: Callable[[ServerConnection], None]  # the connection is authenticated now


def _kind(data: bytes) -> bytes:
    """An event's ``type`` from its JSON (msgspec writes the tag first)."""
    if data.startswith(b'{"type":"'):
        end = data.find(b'"', 9)
        if end > 0:
            return data[9:end]
    return b""


class _Stamp(msgspec.Struct):
    timestamp: float = 0.0


_stamp: Final = msgspec.json.Decoder(_Stamp).decode
_UNKNOWN: Final = CallIdentity(stream="", call="", account="", caller="", called="")


class PhoneCallConnection:
    """One carrier WebSocket: a call (see the module docstring)."""

    def __init__(
        self,
        services: CallServices,
        ws: ServerConnection,
        carrier: Carrier,
        *,
        signed: bool,
        url_token: str = "",
    ) -> None:
        self.services = services
        self.ws = ws
        self.carrier = carrier
        self.signed = signed
        self.url_token = url_token
        self.identity = _UNKNOWN
        self.runtime: SessionRuntime | None = None
        self.meter: CallMeter | None = None
        self.audio = CallAudio()
        self.playback = Playback()
        self._wire = carrier.wire
        self._out: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._ending: tuple[str, int, str] | None = None  # (reason, close code, close text)
        self._answer_over = True  # the next audio begins a new answer
        self._digits = ""  # keys waiting to be told to the model
        self.keypad: KeypadApprovals | None = None  # the caller's keys approve (the plan's)
        self._played_out = asyncio.Event()  # every mark sent came back
        self._played_out.set()
        self._frames = FrameRate(FRAMES_PER_SECOND, FRAME_BURST, time.monotonic())
        self._bad_frames = 0

    @property
    def sid(self) -> str:
        return self.runtime.sid if self.runtime is not None else ""

    @property
    def call_id(self) -> str:
        return self.identity.call

    @property
    def account(self) -> str:
        return self.identity.account

    # ------------------------------------------------------------------ lifecycle

    async def serve(self) -> None:
        """Take the stream from its handshake to its end."""
        try:
            started = await self._await_start()
            opened = await open_call(
                self.services.opening,
                started,
                signed=self.signed,
                url_token=self.url_token,
                settle=lambda: self.services.settle(self.ws),
            )
        except Refused as exc:
            self.services.metrics.streams_refused.labels(exc.reason).inc()
            log.info("phone stream refused (%s): %s", exc.reason, exc.message)
            with contextlib.suppress(Exception):
                await self.ws.close(exc.code, close_reason(exc.message))
            return
        except ConnectionClosed:
            return
        # Checked again now that no await separates it from the call's registration:
        # two streams that opened at once for one call do not both join it.
        live = self.services.opening.joins_a_live_call(opened.runtime.sid, opened.identity.call)
        if live is not None:
            self.services.metrics.streams_refused.labels("call_live").inc()
            with contextlib.suppress(Exception):
                await self.ws.close(REFUSED, close_reason(live))
            return
        self._begin(opened)
        writer = asyncio.create_task(self._writer(), name=f"phone-writer:{self.sid}")
        reason = "lost"
        try:
            reason = await self._read()
        finally:
            self._end(reason)
            # The writer sends what is queued, then closes the stream (the carrier hangs up).
            self.stop(reason)
            try:
                async with asyncio.timeout(5.0):
                    await asyncio.shield(writer)
            except (TimeoutError, asyncio.CancelledError):
                writer.cancel()
                self.ws.transport.abort()
            with contextlib.suppress(BaseException):
                await writer

    async def _await_start(self) -> Started:
        """The stream's ``start`` (``connected`` may come first, nothing else)."""
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while True:
                    message = self._wire.decode_inbound(await self.ws.recv())
                    if isinstance(message, Connected):
                        continue
                    if isinstance(message, Started):
                        return message
                    what = message if isinstance(message, str) else type(message).__name__
                    raise Refused("protocol", f"expected start, got: {what}")
        except TimeoutError:
            raise Refused("no_start", f"no start message within {START_TIMEOUT:g}s") from None

    def _begin(self, opened: Opened) -> None:
        services = self.services
        runtime = self.runtime = opened.runtime
        identity = self.identity = opened.identity
        self.meter = CallMeter(services.metrics, runtime.usage, runtime.observer.cost_total)
        if opened.plan.keypad_approval:
            self.keypad = KeypadApprovals()
        services.calls[runtime.sid] = self
        services.metrics.calls.labels(self.carrier.name).inc()
        services.metrics.open.inc()
        runtime.record(self._event("started"))
        runtime.attach(self)
        log.info(
            "phone call %s (%s) on session %s",
            identity.call,
            self.carrier.name,
            runtime.sid,
            extra={"sid": runtime.sid},
        )
        if opened.plan.greeting:
            run(UserMessage(content=opened.plan.greeting), runtime)  # the model speaks first

    def _event(self, status: Literal["started", "ended"]) -> PhoneCall:
        identity = self.identity
        return PhoneCall(
            status=status,
            carrier=self.carrier.name,
            call=identity.call,
            caller=identity.caller,
            called=identity.called,
        )

    def _end(self, reason: str) -> None:
        services = self.services
        runtime, meter = self.runtime, self.meter
        if runtime is None or meter is None:
            return
        if services.calls.get(runtime.sid) is self:
            del services.calls[runtime.sid]
        services.metrics.open.dec()
        services.metrics.ended.labels(reason).inc()
        ended = self._event("ended")
        ended.reason = reason
        ended.metrics = meter.ended(
            self.playback.heard_ms, runtime.usage, runtime.observer.cost_total
        )
        runtime.record(ended)
        runtime.detach(self)
        log.info(
            "phone call %s ended (%s) after %.1fs",
            self.call_id,
            reason,
            ended.metrics.duration_ms / 1000,
            extra={"sid": runtime.sid},
        )

    # ------------------------------------------------------------------ the carrier's frames

    async def _read(self) -> str:
        """Frames until the stream ends; why it ended."""
        decode = self._wire.decode_inbound
        heard = self.audio.heard
        messages = getattr(self.ws, "recv_messages", None)
        if isinstance(messages, wsfast.MessageQueue):
            messages.intercept = self._take_media
        try:
            async for frame in self.ws:
                runtime = self.runtime
                if runtime is None or self._ending is not None:
                    break
                if not self._within_rate():
                    continue
                message = decode(frame)
                kind = type(message)
                if kind is Media:
                    pcm = heard(message.payload)  # type: ignore[union-attr]
                    if not runtime.send_audio_now(pcm):
                        await runtime.send_audio(pcm)
                elif kind is MarkEcho:
                    self._echoed(message.name)  # type: ignore[union-attr]
                elif kind is KeyPressed:
                    self._key(message.digit)  # type: ignore[union-attr]
                elif kind is Stopped:
                    return "hangup"
                elif isinstance(message, str):
                    self._bad_frame(message)
        except ConnectionClosed:
            pass
        finally:
            if isinstance(messages, wsfast.MessageQueue):
                messages.intercept = None
        return self._ending[0] if self._ending is not None else "lost"

    def _take_media(self, data: bytes, text: bool) -> bool:
        """The read callback's offer of a frame while ``_read`` waits (``wsfast``'s
        intercept): a ``media`` frame the session's upstream takes at once is relayed
        from here, with no task resumed per 20 ms frame; every other frame (and media
        the fast path cannot take) goes to ``_read``, as before."""
        runtime = self.runtime
        if runtime is None or self._ending is not None or b'"media"' not in data:
            return False
        message = self._wire.decode_inbound(data)
        if type(message) is not Media:
            return False
        if not self._within_rate():
            return True  # dropped (and counted) here
        pcm = self.audio.heard(message.payload)
        return runtime.send_audio_now(pcm)  # not taken: ``_read`` counts it again

    def _within_rate(self) -> bool:
        """Whether the carrier's frame just read is taken (``FRAMES_PER_SECOND``); a
        carrier that keeps flooding is closed."""
        verdict = self._frames.check(time.monotonic())
        if verdict is Verdict.ACCEPT:
            return True
        if verdict is Verdict.REFUSE and self._frames.refusals == 1:
            # Once a call: a carrier at twice the rate is refused every other frame.
            log.warning(
                "phone call %s: frames past the carrier's rate are dropped (logged once)",
                self.call_id,
            )
        elif verdict is Verdict.CLOSE:
            self.stop(
                "flood",
                CloseCode.RATE_LIMITED,
                f"frames faster than {FRAMES_PER_SECOND:g} a second; a call sends 50",
            )
        return False

    def _bad_frame(self, problem: str) -> None:
        self._bad_frames += 1
        count = self._bad_frames
        if count <= _BAD_FRAMES_LOGGED:
            more = (
                " (this call's further bad frames are not logged)"
                if count == _BAD_FRAMES_LOGGED
                else ""
            )
            log.info("phone call %s: ignoring a bad frame: %s%s", self.call_id, problem, more)

    def _echoed(self, name: str) -> None:
        report = self.playback.echoed(name)
        if not self.playback.playing:
            self._played_out.set()
        runtime = self.runtime
        if report is not None and runtime is not None:
            run(report, runtime)

    def _key(self, digit: str) -> None:
        runtime = self.runtime
        if runtime is None or not digit:
            return
        runtime.record(Dtmf(digit=digit[:8]))
        decision = self.keypad.press(digit) if self.keypad is not None else None
        if decision is not None:
            refused = run(decision, runtime)
            if refused is not None:
                log.info("phone call %s: the key decided nothing: %s", self.call_id, refused)
            return
        if runtime.setup.config.dtmf == "message":
            self._digits += digit[:8]
            self._tell_keys()

    def _tell_keys(self) -> None:
        """The keys the caller pressed, as a message to the model (once no turn runs)."""
        runtime = self.runtime
        if runtime is None or not self._digits:
            return
        said = f"(The caller pressed {self._digits} on the phone's keypad.)"
        if run(UserMessage(content=said), runtime) is None:
            self._digits = ""

    # ------------------------------------------------------------------ Subscriber

    def deliver(self, entries: Sequence[LogEntry]) -> None:
        meter = self.meter
        for entry in entries:
            kind = _kind(entry.data)
            if kind == b"speech_started":
                self._speech_started(_stamp(entry.data).timestamp)
            elif kind == b"speech_stopped" and meter is not None:
                meter.speech_stopped(_stamp(entry.data).timestamp)
            elif kind in (b"end", b"cancelled"):
                self._answer_over = True
            elif kind == b"user":
                # A new turn: the last answer's marks still echo as it plays out, but
                # they no longer report on the session's answer (the new one).
                self._answer_over = True
                self.playback.new_answer()
            elif kind == b"metric" and self._digits:
                self._tell_keys()
            elif kind == b"approval_required" and self.keypad is not None:
                self.keypad.asked(entry.data)
            elif kind == b"approval" and self.keypad is not None:
                self.keypad.decided(entry.data)

    def _speech_started(self, stamp: float) -> None:
        """The caller spoke: if an answer plays, the carrier drops it now (``clear``)."""
        self._answer_over = True
        if not self.playback.clear():
            return
        self._send(self._wire.encode_outbound(Clear(self.identity.stream)))
        self.audio.cut()
        self._played_out.set()
        if self.meter is not None:
            self.meter.barged_in(stamp)

    def deliver_audio(self, frame: bytes) -> None:
        if self._ending is not None:
            return
        try:
            seq, pcm = split_audio_frame(frame)
        except ValueError:
            return
        if self._answer_over:
            self._answer_over = False
            self.playback.new_answer()
            if self.meter is not None:
                self.meter.answer_began()
        self._play(seq, self.audio.spoken(pcm))

    def _play(self, seq: int, mulaw: bytes) -> None:
        """μ-law for the caller, then a mark that says when it has played."""
        if not mulaw:
            return
        wire, stream = self._wire, self.identity.stream
        name = self.playback.sent(seq, len(mulaw) * 1000 / CALL_RATE)
        self._played_out.clear()
        self._send(
            wire.encode_outbound(Play(stream, mulaw)), wire.encode_outbound(MarkOut(stream, name))
        )

    def notify(self, event: Error) -> None:
        log.info("phone call %s: %s", self.call_id, event.content, extra={"sid": self.sid})

    def session_lost(self, reason: str) -> None:
        """This node stopped driving the session: a call cannot move, so it ends."""
        self.stop("lost", _GONE, "the session moved to another node")

    def switch_source(self, source: EventSource) -> None:
        if isinstance(source, SessionRuntime):
            self.runtime = source
            source.attach(self)

    # ------------------------------------------------------------------ the call tools' side

    async def played_out(self, timeout: float = PLAYED_OUT_WAIT) -> bool:
        """Wait until the caller heard everything sent (every mark came back)."""
        try:
            async with asyncio.timeout(timeout):
                await self._played_out.wait()
            return True
        except TimeoutError:
            return False

    def play_keys(self, keys: str) -> None:
        """Play telephone keys into the call (``ValueError`` naming a key it cannot play)."""
        runtime = self.runtime
        self._play(runtime.last_seq if runtime is not None else 0, CallAudio.keys(keys))

    def stop(self, reason: str, code: int = _NORMAL, text: str = "call ended") -> None:
        """End the call: close the stream (the carrier hangs up, or goes on with its TwiML)."""
        if self._ending is not None:
            return
        self._ending = (reason, code, text)
        self._wake.set()

    # ------------------------------------------------------------------ writing

    def _send(self, *frames: bytes) -> None:
        ws = self.ws
        out = self._out
        if not out and wsfast.can_write_now(ws):
            try:
                wsfast.write_now(ws, frames)
            except Exception:  # the connection broke: the reader sees it end
                self._wake.set()
            return
        out.extend(frames)
        self._wake.set()

    async def _writer(self) -> None:
        """Frames the socket could not take at once, in order; then the close."""
        out = self._out
        ws = self.ws
        try:
            while True:
                if out:
                    batch = list(out)
                    out.clear()
                    await wsfast.send_batch(ws, batch)
                    continue
                if self._ending is not None:
                    _, code, text = self._ending
                    await ws.close(code, close_reason(text))
                    return
                self._wake.clear()
                await self._wake.wait()
        except ConnectionClosed:
            return
