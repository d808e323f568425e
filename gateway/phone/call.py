"""One phone call: a carrier's media stream as a client of its voice session.

The stream's first messages are ``connected`` and ``start``. ``start`` is
checked before any session is touched (the one-time stream token, the media
format); then the call's plan (``gateway.phone.plans``) opens a session for
its owner, or resumes the one its ``session_id`` parameter (or token) names,
and configures it for the phone: μ-law decoded to PCM16 at 8 kHz in,
speech out. From then on the call is one of the session's subscribers, as
a client connection is (``gateway.sessions.subscriber.Subscriber``):

- ``media`` in: the caller's audio, decoded (``CallAudio.heard``) and sent
  to the session as a microphone's (``SessionRuntime.send_audio``);
- the session's speech out: each chunk encoded (``CallAudio.spoken``) and
  sent as a ``media`` frame, then a ``mark``; the carrier's echo of a mark
  is a playback report (``SessionRuntime.played``), which a barge-in uses
  to cut the provider's copy of the answer where the caller stopped hearing;
- ``speech_started`` while the caller hears an answer: ``clear`` at once,
  so the caller stops hearing it;
- ``dtmf`` in: a logged ``dtmf`` event, and with the session's ``dtmf:
  "message"`` a message to the model;
- ``stop`` (or the socket's end) ends the call: a ``phone_call`` event
  with the call's metrics goes to the log, and the session stays (its
  transcript, usage and cost read like any session's).

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
from typing import Final, Protocol

import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gateway import wsfast
from gateway.edge.closes import close_reason
from gateway.phone.audio import CALL_RATE, CallAudio
from gateway.phone.carriers import Carrier
from gateway.phone.metrics import PhoneMetrics
from gateway.phone.plans import CallPlan, CallPlans
from gateway.phone.playback import Playback
from gateway.phone.settings import PhoneSettings
from gateway.sessions.runtime import SessionRuntime
from gateway.sessions.subscriber import EventSource
from gateway.store.base import LogEntry, StoreError
from protocol.audio import split_audio_frame
from protocol.configuration import ConfigChange, InputAudio
from protocol.events import (
    Dtmf,
    Error,
    PhoneCall,
    PhoneCallMetrics,
    Usage,
)
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
from protocol.media_stream import Dtmf as DtmfIn

__all__ = ["CallHost", "CallServices", "PhoneCallConnection", "StreamTokenCheck"]

log = logging.getLogger("gateway.phone")

# Close codes towards the carrier (it hangs up on any close).
_REFUSED: Final = 1008  # policy: not let in
_UNSUPPORTED: Final = 1003  # a media format the gateway does not take
_NORMAL: Final = 1000
_GONE: Final = 1001
_ERROR: Final = 1011

START_TIMEOUT: Final = 10.0
"""Seconds a stream may take to send ``start`` after its handshake."""
HANDOVER_WAIT: Final = 3.0
"""Seconds a call that resumes a session driven elsewhere waits for it to come here
(at least: a dead driver's lease must expire first, ``CallServices.lease_ttl``)."""
PLAYED_OUT_WAIT: Final = 15.0
"""At most, seconds a hang-up or transfer waits for the caller to hear what was said."""
MAX_FIRST_AUDIO_SAMPLES: Final = 200


class CallStore(Protocol):
    async def get_meta(self, sid: str) -> dict[str, str] | None: ...

    async def incr_window(self, key: str, amount: int, ttl: float) -> int: ...


class CallHost(Protocol):
    """What a call needs of its node: a few named calls (``Node`` has them)."""

    @property
    def store(self) -> CallStore: ...

    async def create_session(self, owner: str = "") -> SessionRuntime: ...

    async def record_session(self, sid: str, owner: str) -> None: ...

    async def drive(self, sid: str, *, owner: str = "") -> SessionRuntime | None: ...

    async def ask_to_hand_over(self, sid: str) -> None: ...


class StreamTokenCheck(Protocol):
    """Redeems a one-time stream token (``gateway.phone.admission.StreamTokens``)."""

    async def redeem(self, token: str, call: str) -> tuple[str, str] | str:
        """``(owner, session id or "")`` of a valid unused token for ``call``; else why not."""


@dataclass(frozen=True)
class CallServices:
    """What every call of a node shares."""

    host: CallHost
    settings: PhoneSettings
    plans: CallPlans
    tokens: StreamTokenCheck
    metrics: PhoneMetrics
    calls: dict[str, PhoneCallConnection]  # by session id: the call tools find their call
    settle: Callable[[ServerConnection], None]  # the connection is authenticated now
    lease_ttl: float = 10.0  # a session of a dead node is free after this


class _Refused(Exception):
    def __init__(self, reason: str, message: str, code: int = _REFUSED) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.code = code


def _kind(data: bytes) -> bytes:
    """An event's ``type`` from its JSON (msgspec writes the tag first)."""
    if data.startswith(b'{"type":"'):
        end = data.find(b'"', 9)
        if end > 0:
            return data[9:end]
    return b""


class _Stamp(msgspec.Struct):
    timestamp: float = 0.0


_stamp_decoder: Final = msgspec.json.Decoder(_Stamp)


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
        self.runtime: SessionRuntime | None = None
        self.sid = ""
        self.stream = ""
        self.call_id = ""
        self.account = ""
        self.caller = ""
        self.called = ""
        self.audio = CallAudio()
        self.playback = Playback()
        self._wire = carrier.wire
        self._out: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._ending: tuple[str, int, str] | None = None  # (reason, close code, close text)
        self._answer_over = True  # the next audio begins a new answer
        self._speech_stopped_at: float | None = None  # wall time of the speech end not answered
        self._first_audio_at: float | None = None  # wall time of this answer's first audio
        self.first_audio_ms: list[int] = []
        self.barge_ins = 0
        self._digits = ""  # keys waiting to be told to the model
        self._started_at = 0.0
        self._usage_at_start = Usage(input=0, output=0)
        self._cost_at_start = 0.0
        self._played_out = asyncio.Event()
        self._played_out.set()

    # ------------------------------------------------------------------ lifecycle

    async def serve(self) -> None:
        """Take the stream from its handshake to its end."""
        metrics = self.services.metrics
        try:
            started = await self._await_start()
            plan = await self._admit(started)
            runtime = await self._open_session(plan)
        except _Refused as exc:
            metrics.streams_refused.labels(exc.reason).inc()
            log.info("phone stream refused (%s): %s", exc.reason, exc.message)
            with contextlib.suppress(Exception):
                await self.ws.close(exc.code, close_reason(exc.message))
            return
        except ConnectionClosed:
            return
        self._begin(runtime, plan)
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
                    frame = await self.ws.recv()
                    message = self._wire.decode_inbound(frame)
                    if isinstance(message, Connected):
                        continue
                    if isinstance(message, Started):
                        return message
                    what = message if isinstance(message, str) else type(message).__name__
                    raise _Refused("protocol", f"expected start, got: {what}")
        except TimeoutError:
            raise _Refused("no_start", f"no start message within {START_TIMEOUT:g}s") from None

    async def _admit(self, started: Started) -> CallPlan:
        """Who may open this stream, and what session it gets (raises ``_Refused``)."""
        if started.encoding.lower() not in ("audio/x-mulaw", "pcmu") or started.rate != CALL_RATE:
            raise _Refused(
                "media_format",
                f"the gateway takes audio/x-mulaw (PCMU) at {CALL_RATE} Hz; this stream is "
                f"{started.encoding} at {started.rate} Hz: set the stream's codec to PCMU",
                _UNSUPPORTED,
            )
        self.stream = started.stream
        self.call_id = started.call
        self.account = started.account
        custom = started.custom
        self.caller = custom.get("from", "") or started.caller
        self.called = custom.get("to", "") or started.called
        services = self.services
        token = custom.get("token", "") or self.url_token
        owner = ""
        sid = custom.get("session_id", "")
        if token:
            redeemed = await services.tokens.redeem(token, started.call)
            if isinstance(redeemed, str):
                raise _Refused("token", redeemed)
            owner, token_sid = redeemed
            if token_sid:
                if sid and sid != token_sid:
                    raise _Refused(
                        "token", "the stream token is for another session than session_id"
                    )
                sid = token_sid
        elif not self.signed or services.settings.require_token:
            why = "its signature was not checked" if not self.signed else "tokens are required"
            raise _Refused(
                "unauthenticated",
                f'a stream needs a one-time token ({why}): put <Parameter name="token" '
                'value="…"/> from POST /v1/phone/tokens in the <Stream>, or use the TwiML '
                "helper (docs/phone.md)",
            )
        services.settle(self.ws)
        plan = services.plans.plan(self.called, custom.get("profile", ""))
        if owner:
            plan = CallPlan(owner=owner, change=plan.change, greeting=plan.greeting)
        self.sid = sid
        return plan

    async def _open_session(self, plan: CallPlan) -> SessionRuntime:
        """The call's session, driven here and configured for the phone."""
        host = self.services.host
        audio = ConfigChange(
            input_audio=InputAudio(rate=CALL_RATE, turn_detection="server_vad"), output="audio"
        )
        try:
            if self.sid:
                meta = await host.store.get_meta(self.sid)
                if meta is None:
                    raise _Refused(
                        "unknown_session", f"session {self.sid[:64]!r} does not exist or expired"
                    )
                if meta.get("owner", "") != plan.owner:
                    raise _Refused("forbidden", "the session belongs to another API key")
                runtime = await self._drive_here(self.sid)
                change = audio  # the app's session keeps its own configuration
            else:
                runtime = await host.create_session(plan.owner)
                self.sid = runtime.sid
                await host.record_session(self.sid, plan.owner)
                change = msgspec.structs.replace(
                    plan.change, input_audio=audio.input_audio, output="audio"
                )
        except StoreError:
            raise _Refused(
                "store", "the session store is unavailable; call again", _ERROR
            ) from None
        error = await runtime.configure(change)
        if error is not None:
            raise _Refused("config", f"the call's session cannot be set up: {error.content}")
        return runtime

    async def _drive_here(self, sid: str) -> SessionRuntime:
        """Voice is driven where its microphone is: ask the driving node to hand over."""
        host = self.services.host
        deadline = time.monotonic() + max(HANDOVER_WAIT, self.services.lease_ttl + 1.0)
        while True:
            runtime = await host.drive(sid)
            if runtime is not None:
                return runtime
            if time.monotonic() >= deadline:
                raise _Refused(
                    "driven_elsewhere",
                    "another node drives the session and a live microphone keeps it there",
                )
            await host.ask_to_hand_over(sid)
            await asyncio.sleep(0.25)

    def _begin(self, runtime: SessionRuntime, plan: CallPlan) -> None:
        services = self.services
        self.runtime = runtime
        self._started_at = time.monotonic()
        self._usage_at_start = runtime.usage
        self._cost_at_start = runtime.observer.cost_total
        services.calls[self.sid] = self
        services.metrics.calls.labels(self.carrier.name).inc()
        services.metrics.open.inc()
        runtime.record(
            PhoneCall(
                status="started",
                carrier=self.carrier.name,
                call=self.call_id,
                caller=self.caller,
                called=self.called,
            )
        )
        runtime.attach(self)
        log.info(
            "phone call %s (%s) on session %s",
            self.call_id,
            self.carrier.name,
            self.sid,
            extra={"sid": self.sid},
        )
        if plan.greeting:
            runtime.start_turn(plan.greeting)  # the model speaks first

    def _end(self, reason: str) -> None:
        services = self.services
        runtime = self.runtime
        if services.calls.get(self.sid) is self:
            del services.calls[self.sid]
        services.metrics.open.dec()
        services.metrics.ended.labels(reason).inc()
        duration = time.monotonic() - self._started_at
        services.metrics.duration.observe(duration)
        if runtime is None:
            return
        usage = runtime.usage
        before = self._usage_at_start
        spent = Usage(
            input=usage.input - before.input,
            output=usage.output - before.output,
            cached=usage.cached - before.cached,
            input_audio=usage.input_audio - before.input_audio,
            output_audio=usage.output_audio - before.output_audio,
        )
        runtime.record(
            PhoneCall(
                status="ended",
                carrier=self.carrier.name,
                call=self.call_id,
                caller=self.caller,
                called=self.called,
                reason=reason,
                metrics=PhoneCallMetrics(
                    duration_ms=round(duration * 1000),
                    talk_ms=self.playback.heard_ms,
                    barge_ins=self.barge_ins,
                    first_audio_ms=self.first_audio_ms,
                    usage=spent,
                    cost=round(runtime.observer.cost_total - self._cost_at_start, 9),
                ),
            )
        )
        runtime.detach(self)
        log.info(
            "phone call %s ended (%s) after %.1fs",
            self.call_id,
            reason,
            duration,
            extra={"sid": self.sid},
        )

    # ------------------------------------------------------------------ the carrier's frames

    async def _read(self) -> str:
        """Frames until the stream ends; why it ended."""
        decode = self._wire.decode_inbound
        heard = self.audio.heard
        try:
            async for frame in self.ws:
                runtime = self.runtime
                if runtime is None or self._ending is not None:
                    break
                message = decode(frame)
                kind = type(message)
                if kind is Media:
                    pcm = heard(message.payload)  # type: ignore[union-attr]
                    if not runtime.send_audio_now(pcm):
                        await runtime.send_audio(pcm)
                elif kind is MarkEcho:
                    self._echoed(message.name)  # type: ignore[union-attr]
                elif kind is DtmfIn:
                    self._key(message.digit)  # type: ignore[union-attr]
                elif kind is Stopped:
                    return "hangup"
                elif isinstance(message, str):
                    log.info("phone call %s: ignoring a bad frame: %s", self.call_id, message)
        except ConnectionClosed:
            pass
        return self._ending[0] if self._ending is not None else "lost"

    def _echoed(self, name: str) -> None:
        report = self.playback.echoed(name)
        if not self.playback.playing:
            self._played_out.set()
        runtime = self.runtime
        if report is not None and runtime is not None:
            runtime.played(report)

    def _key(self, digit: str) -> None:
        runtime = self.runtime
        if runtime is None or not digit:
            return
        runtime.record(Dtmf(digit=digit[:8]))
        if runtime.setup.config.dtmf == "message":
            self._digits += digit[:8]
            self._tell_keys()

    def _tell_keys(self) -> None:
        """The keys the caller pressed, as a message to the model (once no turn runs)."""
        runtime = self.runtime
        if runtime is None or not self._digits:
            return
        said = f"(The caller pressed {self._digits} on the phone's keypad.)"
        if runtime.start_turn(said) is None:
            self._digits = ""

    # ------------------------------------------------------------------ Subscriber

    def deliver(self, entries: Sequence[LogEntry]) -> None:
        for entry in entries:
            kind = _kind(entry.data)
            if kind == b"speech_started":
                self._speech_started(entry.data)
            elif kind == b"speech_stopped":
                self._speech_stopped(entry.data)
            elif kind in (b"end", b"cancelled"):
                self._answer_over = True
            elif kind == b"metric" and self._digits:
                self._tell_keys()

    def _speech_started(self, data: bytes) -> None:
        """The caller spoke: if an answer plays, the carrier drops it now (``clear``)."""
        self._answer_over = True
        if not self.playback.clear():
            return
        self._send(self._wire.encode_outbound(Clear(self.stream)))
        self.audio.cut()
        self._played_out.set()
        self.barge_ins += 1
        metrics = self.services.metrics
        metrics.barge_ins.inc()
        emitted = _stamp_decoder.decode(data).timestamp
        metrics.clear_after.observe(max(0.0, time.time() - emitted))

    def _speech_stopped(self, data: bytes) -> None:
        stopped = _stamp_decoder.decode(data).timestamp
        first = self._first_audio_at
        if first is not None and first >= stopped:
            self._first_audio(first - stopped)  # the answer's audio overtook the event
        else:
            self._speech_stopped_at = stopped

    def _first_audio(self, seconds: float) -> None:
        self.services.metrics.first_audio.observe(seconds)
        if len(self.first_audio_ms) < MAX_FIRST_AUDIO_SAMPLES:
            self.first_audio_ms.append(round(seconds * 1000))

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
            now = time.time()
            self._first_audio_at = now
            stopped, self._speech_stopped_at = self._speech_stopped_at, None
            if stopped is not None:
                self._first_audio(now - stopped)
        self._play(seq, self.audio.spoken(pcm))

    def _play(self, seq: int, mulaw: bytes) -> None:
        """μ-law for the caller, then a mark that says when it has played."""
        if not mulaw:
            return
        wire = self._wire
        name = self.playback.sent(seq, len(mulaw) * 1000 // CALL_RATE)
        self._played_out.clear()
        self._send(
            wire.encode_outbound(Play(self.stream, mulaw)),
            wire.encode_outbound(MarkOut(self.stream, name)),
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
