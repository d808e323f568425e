"""A telephone carrier, simulated: it dials a media stream as Twilio does and plays the call.

``SimulatedCall`` is one call. It opens the stream's WebSocket (signed with
``X-Twilio-Signature`` when it has the auth token: the stream's URL, no
parameters), sends ``connected`` and ``start`` (the call's ids, custom
parameters, μ-law 8 kHz mono), then runs two clocks at real time, as a
carrier's media server does:

- the *caller*: every 20 ms a ``media`` frame of μ-law, the caller's speech
  while there is some to say (``say``), silence otherwise (a phone line is
  never quiet on the wire);
- the *player*: what the app sent (``media``) is queued and played 20 ms at
  a time; a ``mark`` is echoed once the audio before it has played; a
  ``clear`` drops the queued audio and echoes every pending mark at once.

It measures what the caller lives through: the caller's speech end → the
answer's first audio (received), and barge-in (the caller's first speech
frame over an answer being played) → silence (the ``clear`` that emptied the
queue, or the queue running out). Keys are sent with ``press``; ``hang_up``
sends ``stop``.

Used by the tests (``tests/support/carrier.py``), ``gateway loadtest
--phone`` and the phone benchmarks; it stands on the protocol and ``pcm``
only, like every client program.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from xml.etree import ElementTree

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.client.dial import NO_PROXY
from gateway.common.pcm import last_loud_frame, mulaw_decode, mulaw_encode, rms
from protocol.media_stream import (
    TWILIO,
    Clear,
    Connected,
    Dtmf,
    Inbound,
    MarkEcho,
    MarkOut,
    Media,
    MediaStreamWire,
    Naming,
    Play,
    Started,
    Stopped,
    twilio_signature,
)

__all__ = ["FRAME_BYTES", "MULAW_SILENCE", "CallSetup", "SimulatedCall", "speech_mulaw"]

FRAME_S: Final = 0.02
FRAME_BYTES: Final = 160  # 20 ms of μ-law at 8 kHz
MULAW_SILENCE: Final = b"\xff" * FRAME_BYTES  # μ-law's zero
# A 20 ms frame of the caller's louder than this (PCM16 RMS) is speech.
_AUDIBLE: Final = 200.0
CALL_RATE: Final = 8000


def speech_mulaw(pcm16_8k: bytes) -> bytes:
    """PCM16 at 8 kHz as the μ-law a caller's phone sends."""
    return mulaw_encode(pcm16_8k)


@dataclass
class CallSetup:
    """How the call dials: ``url`` (ws:// or wss://…/v1/phone/twilio), the auth token
    it signs with (None: unsigned), the stream's parameters, its ids."""

    url: str
    auth_token: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    naming: Naming = TWILIO
    call_sid: str = field(default_factory=lambda: "CA" + secrets.token_hex(16))
    account_sid: str = "AC" + "0" * 32
    stream_sid: str = field(default_factory=lambda: "MZ" + secrets.token_hex(16))
    signed_url: str | None = None  # the URL signed, if not ``url`` (a proxy in front)
    encoding: str = "audio/x-mulaw"  # what start says the media is
    headers: dict[str, str] = field(default_factory=dict)
    # The number's voice webhook (the gateway's TwiML helper): asked first, signed, as
    # Twilio does; its <Stream>'s parameters (the one-time token) join ``parameters``.
    webhook_url: str | None = None


def _ask_webhook(setup: CallSetup, auth_token: str, timeout: float) -> str:
    """The TwiML the number's voice webhook answers for this call (raises on a refusal)."""
    assert setup.webhook_url is not None
    form = {
        "CallSid": setup.call_sid,
        "AccountSid": setup.account_sid,
        "From": setup.parameters.get("from", ""),
        "To": setup.parameters.get("to", ""),
    }
    form = {k: v for k, v in form.items() if v}
    request = urllib.request.Request(
        setup.webhook_url,
        data=urllib.parse.urlencode(form).encode(),
        headers={
            "X-Twilio-Signature": twilio_signature(auth_token, setup.webhook_url, form.items())
        },
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return str(response.read().decode())


def stream_parameters(twiml: str) -> dict[str, str]:
    """The ``<Parameter>``s of a TwiML answer's ``<Connect><Stream>``."""
    stream = ElementTree.fromstring(twiml).find("./Connect/Stream")
    if stream is None:
        raise ValueError(f"the webhook's TwiML has no <Connect><Stream>: {twiml[:200]!r}")
    return {p.get("name", ""): p.get("value", "") for p in stream.findall("Parameter")}


class Speech:
    """The caller's clock's state: the frames it has yet to say, each with "the speech's
    last loud frame", the ``media`` chunk count, and ``said`` once the speech went out."""

    __slots__ = ("chunk", "frames", "said")

    def __init__(self) -> None:
        self.frames: deque[tuple[bytes, bool]] = deque()
        self.chunk = 0
        self.said = asyncio.Event()

    def queue(self, mulaw: bytes) -> None:
        """``mulaw`` to say, in 20 ms frames (the last one padded with silence)."""
        self.said.clear()
        starts = range(0, len(mulaw), FRAME_BYTES)
        last_loud = last_loud_frame(mulaw_decode(mulaw), CALL_RATE)
        if last_loud < 0:
            last_loud = len(starts) - 1
        for index, at in enumerate(starts):
            frame = mulaw[at : at + FRAME_BYTES]
            self.frames.append((frame + MULAW_SILENCE[len(frame) :], index == last_loud))


class Playback:
    """The player's clock's state: what the app sent, in play order (audio as bytes,
    marks as their names), how much of its audio was played (8 bytes a ms), and
    ``arrived``, set by each audio frame received."""

    __slots__ = ("arrived", "played_bytes", "queue")

    def __init__(self) -> None:
        self.queue: deque[bytes | str] = deque()
        self.played_bytes = 0
        self.arrived = asyncio.Event()


class SimulatedCall:
    """One simulated call (see the module docstring). ``async with`` dials and hangs up."""

    def __init__(self, setup: CallSetup) -> None:
        self.setup = setup
        self.wire = MediaStreamWire(setup.naming)
        self.ws: ClientConnection | None = None
        self._speech = Speech()  # the caller's clock: what it has yet to say
        self._playback = Playback()  # the player's clock: what the app sent, yet to play
        self._sequence = 0
        self._tasks: list[asyncio.Task[None]] = []
        # What was measured (monotonic seconds).
        self.speech_ended_at: float | None = None  # the caller's last speech frame sent
        self.first_audio: list[float] = []  # speech end → the answer's first audio received
        self.barge_in_to_silence: list[float] = []  # caller's speech start → playback stopped
        self.marks_echoed = 0
        self.clears = 0
        self.media_received = 0
        self.audio_received = bytearray()  # every μ-law byte the app sent (for checks)
        self.refusal: str | None = None  # how the gateway refused the stream, if it did
        self.closed: tuple[int, str] | None = None
        self._awaiting_answer = False
        self._barge_started: float | None = None
        self._changed = asyncio.Event()  # something the caller lives through changed
        self._closed = asyncio.Event()

    # ------------------------------------------------------------------ dialling

    async def dial(self, timeout: float = 10.0) -> None:
        """Open the stream and send ``connected`` and ``start`` (raises on a refused handshake)."""
        setup = self.setup
        if setup.webhook_url is not None and setup.auth_token is not None:
            twiml = await asyncio.to_thread(_ask_webhook, setup, setup.auth_token, timeout)
            setup.parameters = {**stream_parameters(twiml), **setup.parameters}
        headers = dict(setup.headers)
        if setup.auth_token is not None:
            signed = setup.signed_url or setup.url
            headers["X-Twilio-Signature"] = twilio_signature(setup.auth_token, signed)
        self.ws = await connect(
            setup.url,
            additional_headers=headers,
            open_timeout=timeout,
            max_size=None,
            compression=None,
            **NO_PROXY,
        )
        await self._send_in(Connected(protocol="Call", version="1.0.0"))
        await self._send_in(
            Started(
                stream=setup.stream_sid,
                call=setup.call_sid,
                account=setup.account_sid,
                tracks=("inbound",),
                custom=dict(setup.parameters),
                encoding=setup.encoding,
                sequence=self._next_sequence(),
            )
        )
        self._tasks = [
            asyncio.create_task(self._caller(), name="carrier-caller"),
            asyncio.create_task(self._receiver(), name="carrier-receiver"),
            asyncio.create_task(self._player(), name="carrier-player"),
        ]

    async def __aenter__(self) -> SimulatedCall:
        await self.dial()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.hang_up()

    def _next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    async def _send_in(self, message: Inbound) -> None:
        assert self.ws is not None
        await self.ws.send(self.wire.encode_inbound(message).decode())

    # ------------------------------------------------------------------ the caller

    async def say(self, mulaw: bytes) -> float:
        """Say ``mulaw`` (8 kHz μ-law) at real time; returns when its last loud frame went
        out (monotonic: the speech's end, its trailing silence aside). The answer's first
        audio after that is measured. Raises ``ConnectionError`` (with the close code and
        reason) if the stream closes first."""
        self._speech.queue(mulaw)
        said = asyncio.ensure_future(self._speech.said.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait((said, closed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            said.cancel()
            closed.cancel()
        if not self._speech.said.is_set():  # the gateway closed the stream (refused, or ended it)
            raise ConnectionError(f"the stream closed: {self.closed}")
        assert self.speech_ended_at is not None
        return self.speech_ended_at

    async def press(self, digit: str) -> None:
        """The caller presses a key (a ``dtmf`` message, track ``inbound_track``)."""
        await self._send_in(
            Dtmf(
                digit=digit,
                stream=self.setup.stream_sid,
                track="inbound_track",
                sequence=self._next_sequence(),
            )
        )

    async def _caller(self) -> None:
        start = time.monotonic()
        index = 0
        loud = False
        speech = self._speech.frames
        with contextlib.suppress(ConnectionClosed):
            while True:
                delay = start + index * FRAME_S - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                index += 1
                speaking = bool(speech)
                frame, last_loud = speech.popleft() if speaking else (MULAW_SILENCE, False)
                now = time.monotonic()
                if speaking and not loud and rms(mulaw_decode(frame)) > _AUDIBLE:
                    loud = True
                    if self._playing():
                        self._barge_started = now  # the caller speaks over the answer
                self._speech.chunk += 1
                await self._send_in(
                    Media(
                        payload=frame,
                        stream=self.setup.stream_sid,
                        track="inbound",
                        chunk=self._speech.chunk,
                        timestamp=round((now - start) * 1000),
                        sequence=self._next_sequence(),
                    )
                )
                if last_loud:  # the speech ends here (its trailing silence aside)
                    self.speech_ended_at = time.monotonic()
                    self._awaiting_answer = True
                if speaking and not speech:
                    loud = False
                    self._speech.said.set()

    # ------------------------------------------------------------------ the player

    @property
    def played_ms(self) -> int:
        """How much of the app's audio the caller heard, in ms."""
        return self._playback.played_bytes // 8

    def _playing(self) -> bool:
        return any(isinstance(item, bytes) for item in self._playback.queue)

    async def _receiver(self) -> None:
        assert self.ws is not None
        try:
            async for frame in self.ws:
                message = self.wire.decode_outbound(frame)
                if isinstance(message, Play):
                    self.media_received += 1
                    self.audio_received += message.payload
                    if self._awaiting_answer and self.speech_ended_at is not None:
                        self._awaiting_answer = False
                        self.first_audio.append(time.monotonic() - self.speech_ended_at)
                    self._playback.queue.append(message.payload)
                    self._playback.arrived.set()
                    self._changed.set()
                elif isinstance(message, MarkOut):
                    self._playback.queue.append(message.name)
                elif isinstance(message, Clear):
                    self.clears += 1
                    self._silenced()
                    queue = self._playback.queue
                    pending = [item for item in queue if isinstance(item, str)]
                    queue.clear()
                    for name in pending:  # a clear echoes every pending mark
                        await self._echo(name)
                    self._changed.set()
        except ConnectionClosed:
            pass
        finally:
            ws = self.ws
            self.closed = (ws.close_code or 1006, ws.close_reason or "")
            self._closed.set()
            self._changed.set()

    def _silenced(self) -> None:
        started, self._barge_started = self._barge_started, None
        if started is not None:
            self.barge_in_to_silence.append(time.monotonic() - started)

    async def _echo(self, name: str) -> None:
        self.marks_echoed += 1
        await self._send_in(
            MarkEcho(name=name, stream=self.setup.stream_sid, sequence=self._next_sequence())
        )

    async def _player(self) -> None:
        """Play 20 ms of the queued audio per tick; echo a mark once all before it played."""
        playback = self._playback
        queue = playback.queue
        start = time.monotonic()
        tick = 0
        with contextlib.suppress(ConnectionClosed):
            while True:
                tick += 1
                delay = start + tick * FRAME_S - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                budget = FRAME_BYTES
                while queue and (budget > 0 or isinstance(queue[0], str)):
                    head = queue[0]
                    if isinstance(head, str):
                        queue.popleft()
                        await self._echo(head)
                        continue
                    take = head[:budget]
                    budget -= len(take)
                    playback.played_bytes += len(take)
                    self._changed.set()
                    if len(take) == len(head):
                        queue.popleft()
                    else:
                        queue[0] = head[len(take) :]
                if budget == FRAME_BYTES and self._barge_started is not None:
                    self._silenced()  # the answer ran out by itself

    # ------------------------------------------------------------------ waiting

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait until ``predicate()`` holds (looked at whenever the call's state changes:
        audio received or played, a clear, the stream's end)."""
        async with asyncio.timeout(timeout):
            while not predicate():
                if self._closed.is_set():
                    raise ConnectionError(f"the stream closed: {self.closed}")
                self._changed.clear()
                await self._changed.wait()

    async def answered(self, timeout: float = 30.0) -> float:
        """Wait for the answer to the last thing said; its speech end → first audio (s)."""
        await self.wait_for(lambda: not self._awaiting_answer and bool(self.first_audio), timeout)
        return self.first_audio[-1]

    async def heard_all(self, timeout: float = 60.0, quiet: float = 0.6) -> None:
        """Wait until nothing is left to play and no audio came for ``quiet`` seconds."""
        async with asyncio.timeout(timeout):
            while True:
                if not self._playback.queue:
                    self._playback.arrived.clear()
                    try:
                        async with asyncio.timeout(quiet):
                            await self._playback.arrived.wait()
                    except TimeoutError:
                        return
                await asyncio.sleep(FRAME_S)

    async def wait_closed(self, timeout: float = 10.0) -> tuple[int, str]:
        async with asyncio.timeout(timeout):
            await self._closed.wait()
        return self.closed or (1006, "")

    async def hang_up(self) -> None:
        """Send ``stop`` (the caller hung up) and close the stream."""
        ws = self.ws
        if ws is not None and not self._closed.is_set():
            with contextlib.suppress(ConnectionClosed):
                await self._send_in(
                    Stopped(
                        stream=self.setup.stream_sid,
                        call=self.setup.call_sid,
                        account=self.setup.account_sid,
                        sequence=self._next_sequence(),
                    )
                )
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await self._closed.wait()
            with contextlib.suppress(Exception):
                await ws.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
