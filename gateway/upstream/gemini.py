"""The Gemini Live upstream adapter: one ``BidiGenerateContent`` WebSocket per session.

It speaks the wire modelled in ``gemini_wire`` over a raw ``websockets``
client (no SDK: the hot path is one ``recv`` and one msgspec decode per text
chunk), at ``{base_url}/ws/google.ai.generativelanguage.{api_version}.
GenerativeService.BidiGenerateContent``, with the API key in the
``x-goog-api-key`` header (as the ``google-genai`` SDK sends it; a key in the
URL would end up in logs and error messages). The session asks for TEXT
output; audio-native Live models refuse that (the close reason says so) — use
a half-cascade Live model.

How the adapter maps the ``Upstream`` interface onto Gemini Live, and why:

**Requests.** ``open`` connects and sends ``setup`` (model, TEXT modality,
system instruction) and waits for ``setupComplete``. Messages (the history,
``add_message``) are only buffered; ``start_response`` sends every turn the
server does not have yet in ONE ``clientContent`` with ``turnComplete: true``.
So a response is requested exactly once, and no client message ever reaches
the server while a model turn runs (Gemini treats one as an interruption).
Roles: ``assistant`` → ``model``; ``system`` messages become ``user`` turns
(Live has one system instruction, fixed at setup).

**The transcript.** The adapter keeps the conversation as it sent it:
the instructions, every message, and each model turn as the model wrote it.
Gemini's conversation cannot be edited, so whenever the server's copy stops
matching what the session's history says happened, the adapter *reconnects*
and replays the transcript: the model's context then equals the history again.

**Cancel.** Gemini Live has no cancel message. ``cancel_response`` sends
nothing; ``recv`` stops forwarding text and waits (at most ``cancel_grace``
seconds) for the model's turn to end by itself:

- the turn ends with no more text (a model that stops after ``</execute>``):
  ``ResponseDone("completed")`` with the turn's usage; the server's copy of the
  turn is exactly the text the session saw, and the connection stays;
- more text arrives (the model writes past the stop) or the grace expires:
  ``ResponseDone("cancelled")`` at once, with usage estimated from characters
  (Gemini reports usage only at the end of a turn; the step's ``metric`` says
  ``estimated``); the turn
  still running on the server makes the connection *stale*: the next request
  reconnects with the transcript (which holds the text the session saw)
  rather than interrupt it, because what Gemini keeps of an interrupted turn
  is not knowable. For the same reason a turn the server reports
  ``interrupted`` ends as ``ResponseDone("cancelled")`` and the next request
  reconnects.

**replace_response(text).** If the server's copy of the stopped turn is
exactly ``text``, nothing happens. If the server has no copy (the turn wrote
nothing), ``text`` is queued as a ``model`` turn for the next request.
Otherwise the transcript's turn becomes ``text`` and the adapter reconnects —
in the background, so the handshake overlaps the tool calls the session runs
next; ``start_response`` waits for it. The trade-off: a tool call whose raw
output differs from its re-assembly (any overrun, or whitespace the parser
normalises) costs one reconnect and the re-reading of the context by the
model, instead of leaving the overrun in its context as a Live session would.

**goAway.** The server announces the end of the session. The running turn
goes on (``timeLeft`` is usually enough to finish it); the next
``start_response`` reconnects with the transcript first, so the session never
sees the close. If the server closes mid-turn, ``recv`` raises
``UpstreamClosed`` (its reason names the ``goAway``), and the session reruns
the step from history.

**Voice** (``open(..., voice=VoiceConfig(...))``). ``setup`` asks for
``AUDIO`` output with the voice in ``speechConfig``, input and output
transcription, ``functionDeclarations`` for the tools, and either the
server's VAD with ``explicitVadSignal`` (so ``voiceActivity`` gives
``SpeechBegan``/``SpeechEnded``) or ``automaticActivityDetection``
disabled, where ``send_audio`` opens the user's turn with ``activityStart``
and ``commit_audio`` closes it with ``activityEnd`` (the model then
answers). Audio goes out as ``realtimeInput.audio`` at 16 kHz (resampled
with soxr when the client's rate differs). A model turn that begins
without a request (the server heard the user stop) is announced with
``ResponseBegan``. ``toolCall`` ends the response with a ``NativeCall``
per call and ``ResponseDone``; ``send_function_output`` collects the
outputs and ``start_response`` sends them as one ``toolResponse``, after
which the model goes on by itself. In a voice session an ``interrupted``
turn (barge-in) is normal and costs no reconnect: the audio the server
heard cannot be replayed anyway, so the transcript (input transcripts as
user turns, the model's words) is only a fallback for a lost connection.

**Errors.** Gemini reports errors by closing the WebSocket with a code and
the error text as reason (1007 "API key not valid…", 1008 "models/… is not
found…"); ``UpstreamClosed`` carries that text plus what to do. A frame that
does not decode comes out of ``recv`` as ``UpstreamError("upstream_protocol")``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Close

from gateway.upstream import gemini_wire as wire
from gateway.upstream.audio import Resampler
from gateway.upstream.base import (
    AdapterFactory,
    AudioDelta,
    NativeCall,
    ResponseBegan,
    ResponseDone,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    TextDelta,
    Transcript,
    Upstream,
    UpstreamClosed,
    UpstreamError,
    UpstreamEvent,
    VoiceConfig,
    Woken,
)
from gateway.upstream.dial import dial
from gateway.wsfast import MessageQueue, can_write_now, write_text_now
from protocol.assembly import Message
from protocol.events import Usage
from protocol.metering import billed_tokens_estimate

__all__ = [
    "DEFAULT_API_VERSION",
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "GeminiLive",
    "GeminiLiveFactory",
]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL: Final = "wss://generativelanguage.googleapis.com"
# The Gemini API serves the Live WebSocket on v1beta (v1alpha for ephemeral tokens).
DEFAULT_API_VERSION: Final = "v1beta"
# A half-cascade Live model: it can answer in TEXT (audio-native ones cannot).
DEFAULT_MODEL: Final = "gemini-live-2.5-flash-preview"


# The Live API's audio rates (PCM16 mono): what it hears and how it speaks.
INPUT_RATE: Final = 16000
OUTPUT_RATE: Final = 24000
_INPUT_MIME: Final = f"audio/pcm;rate={INPUT_RATE}"
_RATE: Final = re.compile(r"rate=(\d+)")


def _offset_ms(duration: str | None) -> int:
    """A protobuf Duration (``"1.200s"``) in milliseconds (0 if absent or unreadable)."""
    try:
        return round(float((duration or "0s").removesuffix("s")) * 1000)
    except ValueError:
        return 0


def _rate(mime_type: str | None) -> int:
    match = _RATE.search(mime_type or "")
    return int(match.group(1)) if match else OUTPUT_RATE


# Where the current model turn is.
_IDLE: Final = 0  # no turn requested, or it ended
_RUNNING: Final = 1  # requested; its text reaches the session
_CANCELLING: Final = 2  # cancel asked: waiting (bounded) for the turn to end by itself
_STALE: Final = 3  # the session was told it ended, but it still runs on the server

_ROLES: Final = {"user": "user", "assistant": "model", "system": "user"}


def _turn(message: Message) -> wire.Content:
    return wire.text_content(_ROLES[message.role], message.content)


def _turn_text(turn: wire.Content) -> str:
    return "".join(part.text or "" for part in turn.parts)


def _close_hint(code: int, reason: str) -> str:
    """What to do about a close the Live API is known to send."""
    lowered = reason.lower()
    if "api key" in lowered or "unregistered callers" in lowered:
        return ": set GEMINI_API_KEY to a valid Gemini API key"
    if "modalit" in lowered:
        return (
            ": the model cannot answer in TEXT; choose a half-cascade Live model "
            f"(e.g. {DEFAULT_MODEL})"
        )
    if "not found" in lowered or "not supported for bidigeneratecontent" in lowered:
        return ": check the model name: it must be a Live model available to this key"
    if "quota" in lowered or "resource_exhausted" in lowered or code == 1013:
        return ": the key's quota or rate limit is exhausted; retry later"
    if code == 1011:
        return ": an error inside Gemini; the gateway retries"
    return ""


# Google API statuses a retry will not fix: a session falls back (if it can).
_NOT_RETRYABLE: Final = frozenset(
    {"PERMISSION_DENIED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "NOT_FOUND"}
)


def _rejection(exc: InvalidStatus) -> str:
    status = exc.response.status_code
    body = exc.response.body.decode("utf-8", "replace").strip() if exc.response.body else ""
    detail = f": {body[:300]}" if body else ""
    if status in (401, 403):
        return f"Gemini refused the connection (HTTP {status}): set GEMINI_API_KEY{detail}"
    if status == 404:
        return (
            f"Gemini Live endpoint not found (HTTP 404): check the base URL and the API "
            f"version (the Live API is served on {DEFAULT_API_VERSION}){detail}"
        )
    if status == 429:
        return f"Gemini rate-limited the connection (HTTP 429): retry later{detail}"
    return f"Gemini rejected the WebSocket handshake (HTTP {status}){detail}"


class GeminiLive(Upstream):
    """One Gemini Live session (see the module docstring)."""

    provider = "gemini"

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        api_version: str = DEFAULT_API_VERSION,
        connect_timeout: float = 10.0,
        open_timeout: float = 10.0,
        cancel_grace: float = 0.5,
    ) -> None:
        """``connect_timeout`` bounds the TCP + TLS + WebSocket handshake;
        ``open_timeout`` the wait for ``setupComplete`` after it;
        ``cancel_grace`` how long a cancelled turn may take to end by itself
        before it is abandoned (see the module docstring)."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = os.environ.get("GEMINI_API_KEY", "") if api_key is None else api_key
        self.api_version = api_version
        self.connect_timeout = connect_timeout
        self.open_timeout = open_timeout
        self.cancel_grace = cancel_grace
        self._ws: ClientConnection | None = None
        self._opened = False
        self._closed = False
        # A reconnect started by replace_response; requests wait for it.
        self._reopen: asyncio.Task[None] | None = None
        # The transcript, and how many of its turns the server holds (a prefix).
        self._instructions = ""
        self._transcript: list[wire.Content] = []
        self._sent = 0
        # The server's conversation differs from the transcript, or a stale turn
        # still runs on it: reconnect before the next request.
        self._dirty = False
        self._go_away: str | None = None  # timeLeft of the goAway received, if any
        # The current (or last) model turn.
        self._state = _IDLE
        self._text: list[str] = []  # its text forwarded to the session
        self._usage: Usage | None = None
        self._deadline = 0.0
        self._queued: collections.deque[UpstreamEvent] = collections.deque()
        # ``stream_text_to``: where deltas go while recv() waits, and a frame the
        # read callback decoded but did not take (recv() uses it, not decoding again).
        self._text_sink: Callable[[str], bool] | None = None
        self._decoded: tuple[bytes, wire.ServerMessage] | None = None
        # Where the last response's text goes in the transcript (right after the
        # turns of its request), where it is, and whether the server holds exactly it.
        self._reply_at = 0
        self._reply_index: int | None = None
        self._reply_on_server = False
        # Voice (see the module docstring).
        self._voice: VoiceConfig | None = None
        self._resampler: Resampler | None = None
        self._manual_activity = False  # activityStart/End bracket the user's speech
        self._activity_open = False
        self._heard: list[str] = []  # input transcription pieces of the current user turn
        self._calls: dict[str, str] = {}  # call id -> function name, until answered
        self._outputs: list[wire.FunctionResponse] = []

    @property
    def url(self) -> str:
        return (
            f"{self.base_url}/ws/google.ai.generativelanguage.{self.api_version}"
            ".GenerativeService.BidiGenerateContent"
        )

    @property
    def model_name(self) -> str:
        """The model as ``setup`` names it (``models/NAME``)."""
        return self.model if self.model.startswith("models/") else f"models/{self.model}"

    # --- lifecycle --------------------------------------------------------------

    async def open(
        self,
        instructions: str,
        history: Sequence[Message],
        *,
        voice: VoiceConfig | None = None,
    ) -> None:
        if self._opened or self._closed:
            raise RuntimeError("a GeminiLive is opened once; make a new one to reconnect")
        self._opened = True
        self._voice = voice
        if voice is not None and voice.audio_in is not None:
            self._resampler = Resampler(voice.audio_in.rate, INPUT_RATE)
            self._manual_activity = voice.audio_in.turn_detection == "none"
        self._instructions = instructions
        # Empty messages are left out: the API refuses an empty text part.
        self._transcript = [_turn(message) for message in history if message.content]
        self._reply_at = len(self._transcript)
        try:
            self._ws = await self._connect()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._closed = True
        task, self._reopen = self._reopen, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved: a failed reconnect needs no report now
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()

    async def _connect(self) -> ClientConnection:
        """A new connection, set up; the server holds none of the transcript yet."""
        headers = {"x-goog-api-key": self.api_key} if self.api_key else {}
        ws = await dial(
            self.url,
            headers,
            label="Gemini Live",
            connect_timeout=self.connect_timeout,
            rejection=_rejection,
        )
        queue = ws.recv_messages
        if isinstance(queue, MessageQueue):
            queue.intercept = functools.partial(self._intercept, queue)
        try:
            instruction = (
                wire.text_content(None, self._instructions) if self._instructions else None
            )
            setup = self._setup(instruction)
            await self._send(ws, wire.ClientMessage(setup=setup))
            try:
                async with asyncio.timeout(self.open_timeout):
                    await self._await_setup_complete(ws)
            except TimeoutError as exc:
                raise UpstreamClosed(
                    f"Gemini Live sent no setupComplete within {self.open_timeout:g}s"
                ) from exc
        except BaseException:
            await ws.close()
            raise
        self._sent = 0
        self._dirty = False
        self._go_away = None
        self._state = _IDLE
        self._queued.clear()
        self._reply_on_server = False
        return ws

    def _setup(self, instruction: wire.Content | None) -> wire.Setup:
        voice = self._voice
        if voice is None:
            return wire.Setup(
                model=self.model_name,
                generation_config=wire.GenerationConfig(response_modalities=["TEXT"]),
                system_instruction=instruction,
            )
        audio_in, audio_out = voice.audio_in, voice.audio_out
        speech = None
        if audio_out is not None and audio_out.voice:
            speech = wire.SpeechConfig(
                voice_config=wire.VoiceConfig(
                    prebuilt_voice_config=wire.PrebuiltVoiceConfig(voice_name=audio_out.voice)
                )
            )
        declarations = [
            wire.FunctionDeclaration(
                name=tool.name,
                description=tool.description or None,
                parameters_json_schema=tool.parameters or {"type": "object"},
            )
            for tool in voice.tools
        ]
        return wire.Setup(
            model=self.model_name,
            generation_config=wire.GenerationConfig(
                response_modalities=["AUDIO" if audio_out is not None else "TEXT"],
                speech_config=speech,
            ),
            system_instruction=instruction,
            tools=[wire.Tool(function_declarations=declarations)] if declarations else None,
            realtime_input_config=(
                wire.RealtimeInputConfig(
                    automatic_activity_detection=wire.AutomaticActivityDetection(disabled=True)
                )
                if self._manual_activity
                else None
            ),
            input_audio_transcription=(
                {} if audio_in is not None and audio_in.transcription else None
            ),
            output_audio_transcription={} if audio_out is not None else None,
            explicit_vad_signal=True
            if audio_in is not None and not self._manual_activity
            else None,
        )

    async def _await_setup_complete(self, ws: ClientConnection) -> None:
        while True:
            try:
                data = await ws.recv(decode=False)
            except ConnectionClosed as exc:
                raise UpstreamClosed(self._describe_close(exc)) from exc
            try:
                message = wire.decode_server_message(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if message.setup_complete is not None:
                return
            if message.error is not None:
                error = message.error
                raise UpstreamClosed(
                    f"Gemini Live refused the session ({error.status or error.code}): "
                    f"{error.message}"
                )

    async def _reconnect(self, why: str) -> None:
        """Replace the connection by a new one whose context is the transcript."""
        old, self._ws = self._ws, None
        log.debug("Gemini Live: reconnecting with the transcript (%s)", why)
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()  # also stops a turn still running there
        ws = await self._connect()
        if self._closed:
            await ws.close()
            raise UpstreamClosed("the Gemini Live adapter was closed while reconnecting")
        self._ws = ws

    def _begin_reconnect(self, why: str) -> None:
        if self._reopen is None:
            self._reopen = asyncio.create_task(self._reconnect(why), name="gemini-reconnect")

    async def _join_reconnect(self) -> None:
        task, self._reopen = self._reopen, None
        if task is not None:
            await task  # raises UpstreamClosed when the reconnect failed

    async def _ready(self) -> ClientConnection:
        """The connection to send the next request on (reconnecting first if needed)."""
        if self._closed:
            raise UpstreamClosed("the Gemini Live connection is closed")
        if self._reopen is not None:
            await self._join_reconnect()
        elif self._dirty:
            await self._reconnect("the server's conversation differs from the transcript")
        elif self._go_away is not None:
            await self._reconnect(f"goAway (timeLeft={self._go_away})")
        ws = self._ws
        if ws is None:
            raise UpstreamClosed("the Gemini Live connection is closed")
        return ws

    # --- requests ---------------------------------------------------------------

    async def add_message(self, message: Message) -> None:
        if self._closed:
            raise UpstreamClosed("the Gemini Live connection is closed")
        if message.content:  # the API refuses an empty text part
            self._transcript.append(_turn(message))

    async def start_response(self) -> None:
        if self._state in (_RUNNING, _CANCELLING):
            self._queued.append(
                UpstreamError(
                    code="active_response",
                    message="a Gemini Live turn is already running; wait for its end "
                    "before asking for another response",
                )
            )
            return
        ws = await self._ready()
        if self._outputs:
            outputs, self._outputs = self._outputs, []
            self._begin_turn()
            response = wire.ToolResponse(function_responses=outputs)
            await self._send(ws, wire.ClientMessage(tool_response=response))
            return
        pending = self._transcript[self._sent :]
        self._begin_turn()
        content = wire.ClientContent(turns=pending or None, turn_complete=True)
        await self._send(ws, wire.ClientMessage(client_content=content))
        self._sent = self._reply_at = len(self._transcript)

    def _begin_turn(self) -> None:
        """A model turn starts: its text and usage are collected from here."""
        self._state = _RUNNING
        self._text = []
        self._usage = None
        self._reply_index = None
        self._reply_on_server = False
        self._reply_at = len(self._transcript)

    async def send_audio(self, pcm16: bytes) -> None:
        resampler = self._resampler
        if resampler is None:
            raise RuntimeError(
                "send_audio needs a voice session: open(..., voice=VoiceConfig(audio_in=...))"
            )
        ws = await self._ready()
        if self._manual_activity and not self._activity_open:
            self._activity_open = True
            start = wire.RealtimeInput(activity_start=wire.ActivityMarker())
            await self._send(ws, wire.ClientMessage(realtime_input=start))
        blob = wire.Blob(mime_type=_INPUT_MIME, data=resampler.push(pcm16))
        await self._send(ws, wire.ClientMessage(realtime_input=wire.RealtimeInput(audio=blob)))

    def send_audio_now(self, pcm16: bytes) -> bool:
        ws = self._ws
        resampler = self._resampler
        if (
            ws is None
            or resampler is None
            or self._closed
            or self._reopen is not None
            or self._dirty
            or self._go_away is not None
            or (self._manual_activity and not self._activity_open)
            or not can_write_now(ws)
        ):
            return False  # something to await first: send_audio does it
        blob = wire.Blob(mime_type=_INPUT_MIME, data=resampler.push(pcm16))
        data = wire.encode(wire.ClientMessage(realtime_input=wire.RealtimeInput(audio=blob)))
        with contextlib.suppress(Exception):  # broke: recv raises UpstreamClosed
            write_text_now(ws, data)
        return True

    async def commit_audio(self) -> None:
        ws = await self._ready()
        if not self._activity_open:
            start = wire.RealtimeInput(activity_start=wire.ActivityMarker())
            await self._send(ws, wire.ClientMessage(realtime_input=start))
        self._activity_open = False
        self._begin_turn()
        end = wire.RealtimeInput(activity_end=wire.ActivityMarker())
        await self._send(ws, wire.ClientMessage(realtime_input=end))

    async def send_function_output(self, call_id: str, output: str) -> None:
        name = self._calls.pop(call_id, None)
        self._outputs.append(
            wire.FunctionResponse(id=call_id, name=name, response={"output": output})
        )

    async def cancel_response(self) -> None:
        if self._state != _RUNNING:
            return
        if any(isinstance(event, TextDelta) for event in self._queued):
            # Text the session has not seen yet: the model already wrote past the stop.
            self._queued.clear()
            self._queued.append(self._abandon("the model wrote past the point it was stopped at"))
            return
        self._state = _CANCELLING
        self._deadline = asyncio.get_running_loop().time() + self.cancel_grace

    async def replace_response(self, text: str) -> None:
        if self._closed:
            raise UpstreamClosed("the Gemini Live connection is closed")
        index = self._reply_index
        if index is not None:
            if self._reply_on_server and _turn_text(self._transcript[index]) == text:
                return  # the server holds exactly this turn
            if text:
                self._transcript[index] = wire.text_content("model", text)
            else:
                del self._transcript[index]
                self._reply_index = None
            if self._reply_on_server:
                self._reply_on_server = False
                self._dirty = True
        elif text:
            # The server holds no text of that response: send it with the next request.
            self._transcript.insert(self._reply_at, wire.text_content("model", text))
            self._reply_index = self._reply_at
        if self._dirty:
            self._begin_reconnect("a response was replaced")
        elif self._go_away is not None:
            self._begin_reconnect(f"goAway (timeLeft={self._go_away})")

    # --- events -----------------------------------------------------------------

    async def recv(self) -> UpstreamEvent:
        while True:
            if self._queued:
                return self._queued.popleft()
            if self._reopen is not None:
                await self._join_reconnect()
            ws = self._ws
            if ws is None:
                raise UpstreamClosed("the Gemini Live connection is closed")
            try:
                if self._state == _CANCELLING:
                    remaining = self._deadline - asyncio.get_running_loop().time()
                    if remaining <= 0:
                        return self._abandon(
                            f"the turn did not end within {self.cancel_grace:g}s of the cancel"
                        )
                    try:
                        async with asyncio.timeout(remaining):
                            data = await ws.recv(decode=False)
                    except TimeoutError:
                        continue  # the deadline is checked at the top
                else:
                    data = await ws.recv(decode=False)
            except ConnectionClosed as exc:
                raise UpstreamClosed(self._describe_close(exc)) from exc
            except OSError as exc:  # pragma: no cover - websockets wraps these
                raise UpstreamClosed(f"Gemini Live connection failed: {exc}") from exc
            if data is None:
                return Woken()
            decoded, self._decoded = self._decoded, None
            if decoded is not None and decoded[0] is data:
                message = decoded[1]
            else:
                try:
                    message = wire.decode_server_message(data)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    return UpstreamError(
                        code="upstream_protocol",
                        message=f"unreadable Gemini Live frame ({exc}): {bytes(data[:200])!r}",
                    )
            event = self._handle(message)
            if event is not None:
                return event

    def stream_text_to(self, sink: Callable[[str], bool] | None) -> bool:
        self._text_sink = sink
        return True

    def _intercept(self, queue: MessageQueue, data: bytes, text: bool) -> bool:
        """The read callback's offer of a frame while ``recv()`` waits: take a
        text part of the running turn to the sink; leave anything else to ``recv()``."""
        sink = self._text_sink
        if sink is None or self._queued or self._reopen is not None:
            return False
        try:
            message = wire.decode_server_message(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False  # recv() reports it
        part = self._hot_part(message)
        if part is None or not part.text or part.thought:
            self._decoded = (data, message)
            return False
        self._text.append(part.text)
        if sink(part.text):
            queue.nudge()
        return True

    def _hot_part(self, message: wire.ServerMessage) -> wire.Part | None:
        """The frame's one part when it is the running turn's and nothing else."""
        content = message.server_content
        if (
            content is not None
            and self._state == _RUNNING
            and content.model_turn is not None
            and len(content.model_turn.parts) == 1
            and not (content.turn_complete or content.interrupted)
            and message.usage_metadata is None
            and message.go_away is None
            and message.error is None
        ):
            return content.model_turn.parts[0]
        return None

    def _handle(self, message: wire.ServerMessage) -> UpstreamEvent | None:
        """The frame's first event for the session; any further ones are queued."""
        content = message.server_content
        # The hot path: one text part of the running turn, and nothing else.
        part = self._hot_part(message)
        if part is not None and content is not None:
            if part.text and not part.thought:
                self._text.append(part.text)
                return TextDelta(part.text)
            if part.inline_data is None and content.output_transcription is None:
                return None
            # Spoken output: the general path below.
        events: list[UpstreamEvent] = []
        if self._voice is not None:
            self._voice_events(message, events)
        usage = message.usage_metadata
        if usage is not None and self._state in (_RUNNING, _CANCELLING):
            prompt = usage.prompt_token_count or 0
            output = usage.response_token_count or usage.candidates_token_count
            if output is None:
                output = max(0, (usage.total_token_count or 0) - prompt)
            self._usage = Usage(
                input=prompt,
                output=output,
                cached=usage.cached_content_token_count or 0,
                input_audio=_audio_tokens(usage.prompt_tokens_details),
                output_audio=_audio_tokens(usage.response_tokens_details),
            )
        if message.go_away is not None:
            self._go_away = message.go_away.time_left or "unknown"
            log.info(
                "Gemini Live: goAway (timeLeft=%s): reconnecting after this turn", self._go_away
            )
        if message.error is not None:
            error = message.error
            code = error.status or str(error.code or "error")
            events.append(
                UpstreamError(
                    code=code, message=error.message, retryable=code not in _NOT_RETRYABLE
                )
            )
        if content is not None:
            self._content(content, events)
        if not events:
            return None
        self._queued.extend(events[1:])
        return events[0]

    def _voice_events(self, message: wire.ServerMessage, events: list[UpstreamEvent]) -> None:
        """What a voice session hears besides model text: VAD, transcripts, turns, calls."""
        activity = message.voice_activity
        if activity is not None:
            offset = _offset_ms(activity.audio_offset)
            if activity.voice_activity_type == "ACTIVITY_START":
                events.append(SpeechBegan(offset))
            elif activity.voice_activity_type == "ACTIVITY_END":
                events.append(SpeechEnded(offset))
        content = message.server_content
        if content is not None and content.input_transcription is not None:
            piece = content.input_transcription
            if piece.text:
                self._heard.append(piece.text)
            if piece.finished:
                self._flush_heard(events)
        model_output = content is not None and (
            content.model_turn is not None or content.output_transcription is not None
        )
        if (model_output or message.tool_call is not None) and self._state == _IDLE:
            # The server answers the user by itself (its VAD heard the end of speech).
            self._flush_heard(events)
            self._begin_turn()
            events.append(ResponseBegan())
        if content is not None and content.output_transcription is not None:
            text = content.output_transcription.text
            if text and self._state == _RUNNING:
                self._text.append(text)
                events.append(Spoken(text))
        if message.tool_call is not None and self._state == _RUNNING:
            for call in message.tool_call.function_calls or ():
                call_id = call.id or ""
                self._calls[call_id] = call.name or ""
                arguments = msgspec.json.encode(call.args or {}).decode()
                events.append(NativeCall(call_id, call.name or "", arguments))
            self._end_turn(clean=True)
            events.append(ResponseDone(status="completed", usage=self._usage))

    def _flush_heard(self, events: list[UpstreamEvent]) -> None:
        """The user's spoken turn, heard whole: an ``Transcript``, a transcript turn."""
        if not self._heard:
            return
        text, self._heard = "".join(self._heard), []
        events.append(Transcript(text))
        held = self._sent == len(self._transcript)
        self._transcript.append(wire.text_content("user", text))
        if held:
            self._sent += 1  # the server heard it: it holds this turn

    def _content(self, content: wire.ServerContent, events: list[UpstreamEvent]) -> None:
        if content.model_turn is not None:
            for part in content.model_turn.parts:
                blob = part.inline_data
                if blob is not None and blob.data and self._state == _RUNNING:
                    events.append(AudioDelta(blob.data, _rate(blob.mime_type)))
                    continue
                text = part.text
                if not text or part.thought:
                    continue  # non-text parts and thought summaries are not output
                if self._state == _RUNNING:
                    self._text.append(text)
                    events.append(TextDelta(text))
                elif self._state == _CANCELLING:
                    # The rest of the frame's parts are ignored: the turn is stale now.
                    events.append(self._abandon("the model wrote past the point it was stopped at"))
        if content.interrupted:
            # In a voice session interruptions are barge-in: no reconnect (see the docstring).
            voice = self._voice is not None
            if self._state in (_RUNNING, _CANCELLING):
                usage, estimated = self._turn_usage()
                self._end_turn(clean=voice)
                events.append(
                    ResponseDone(
                        status="cancelled",
                        usage=usage,
                        detail="Gemini Live interrupted the turn",
                        estimated=estimated,
                    )
                )
            self._state = _IDLE
            self._dirty = self._dirty or not voice
        elif content.turn_complete:
            if self._state in (_RUNNING, _CANCELLING):
                usage, estimated = self._turn_usage()
                self._end_turn(clean=True)
                events.append(ResponseDone(status="completed", usage=usage, estimated=estimated))
            self._state = _IDLE  # a stale turn is over: the connection stays dirty

    def _end_turn(self, *, clean: bool) -> None:
        """Record the turn in the transcript; ``clean``: the server holds exactly its text."""
        self._state = _IDLE
        text = "".join(self._text)
        if text:
            self._transcript.insert(self._reply_at, wire.text_content("model", text))
            self._reply_index = self._reply_at
            if clean:
                self._sent += 1  # == _reply_at + 1: the server holds it, after its request
                self._reply_on_server = True
        if not clean:
            self._dirty = True

    def _abandon(self, why: str) -> ResponseDone:
        """End a cancelled turn for the session while it still runs on the server."""
        usage, estimated = self._turn_usage()
        self._end_turn(clean=False)
        self._state = _STALE
        return ResponseDone(
            status="cancelled",
            usage=usage,
            detail=f"{why} (Gemini Live has no cancel)",
            estimated=estimated,
        )

    def _turn_usage(self) -> tuple[Usage, bool]:
        """The running turn's usage: as reported, or estimated (then True) from characters.

        Gemini reports usage only at the end of a turn; a turn the adapter stops
        waiting for (no cancel on Gemini) or that the server interrupted is still
        billed, so it is counted at about 4 characters a token: the context up to
        the request (instructions and transcript) in, the text received out.
        """
        if self._usage is not None:
            return self._usage, False
        context = len(self._instructions) + sum(
            len(_turn_text(turn)) for turn in self._transcript[: self._reply_at]
        )
        output = sum(len(text) for text in self._text)
        return Usage(
            input=billed_tokens_estimate(context), output=billed_tokens_estimate(output)
        ), True

    # --- plumbing ---------------------------------------------------------------

    def _describe_close(self, exc: ConnectionClosed) -> str:
        after = f" after goAway (timeLeft={self._go_away})" if self._go_away is not None else ""
        close: Close | None = exc.rcvd
        if close is None:
            return f"Gemini Live connection lost without a close frame (code 1006){after}"
        reason = f": {close.reason}" if close.reason else ""
        hint = _close_hint(close.code, close.reason)
        return f"Gemini Live closed the connection (code {close.code}{reason}){after}{hint}"

    async def _send(self, ws: ClientConnection, message: wire.ClientMessage) -> None:
        data = wire.encode(message)
        if can_write_now(ws):  # nothing to wait for: no await, no send context (wsnow)
            try:
                write_text_now(ws, data)
            except Exception as exc:  # the socket broke under the write
                raise UpstreamClosed(f"Gemini Live connection failed: {exc!r}") from exc
            return
        try:
            await ws.send(data, text=True)
        except ConnectionClosed as exc:
            raise UpstreamClosed(self._describe_close(exc)) from exc


def _audio_tokens(details: list[wire.ModalityTokenCount] | None) -> int:
    """The AUDIO entry of a usage breakdown by modality (0 when there is none)."""
    if not details:
        return 0
    return sum(d.token_count or 0 for d in details if d.modality == "AUDIO")


class GeminiLiveFactory(AdapterFactory):
    """Makes ``GeminiLive`` adapters, all with the same settings (its keyword arguments)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(GeminiLive, "gemini", **settings)
