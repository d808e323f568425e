"""The OpenAI Realtime (GA) upstream adapter: one WebSocket per session.

It speaks the wire modelled in ``openai_wire`` over a raw ``websockets``
client (no SDK: the hot path is one ``recv`` and one msgspec decode per text
delta). Compression is off: per-message deflate costs CPU on every token
and the frames are small.

What the adapter keeps of the provider's state, and why:

- the id of the *current* response (from ``response.created`` after our
  ``response.create``). Deltas and ``response.done`` of any other response are
  stale (a cancelled response still draining) and are dropped, so the session
  only ever sees the response it asked for;
- the output item ids of that response, so ``replace_response`` can delete
  them and put the text the parser accepted in their place.

Voice (``open(..., voice=VoiceConfig(...))``): the session is configured
with ``audio.input`` (PCM16 24 kHz, ``server_vad`` or ``turn_detection:
null``, transcription), ``audio.output.voice`` and ``output_modalities:
["audio"]``, and ``tools``. ``send_audio`` resamples to 24 kHz when the
client's rate differs and appends to the input buffer (base64 by msgspec);
``commit_audio`` commits it and asks for the response. With server VAD the
API starts responses itself: a ``response.created`` nobody asked for
becomes the current response (``ResponseBegan``), and a barge-in ends it
with ``response.done`` ``cancelled`` (``turn_detected``).

Client events are pipelined: nothing waits for a per-item acknowledgement.
An ``error`` the provider sends later comes out of ``recv()`` as an
``UpstreamError`` (except ``response_cancel_not_active``: a cancel that raced
with the end of the response is harmless).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal
from urllib.parse import quote

import msgspec

from gateway.upstream import openai_wire as wire
from gateway.upstream.audio import Resampler
from gateway.upstream.base import (
    AudioDelta,
    AudioIn,
    FrameTap,
    ModelOptions,
    NativeCall,
    ResponseBegan,
    ResponseDone,
    Resume,
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
from gateway.upstream.live import GPTLive, is_live_model, live_controls
from gateway.upstream.models import ModelFacts, Price
from gateway.upstream.provider import ExtraSetting, Provider, ProviderSettings, SimFlavour
from gateway.upstream.provider_socket import ProviderSocket
from protocol.assembly import Message
from protocol.events import Usage

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "MODELS", "PROVIDER", "OpenAIRealtime"]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL: Final = "wss://api.openai.com/v1"
DEFAULT_MODEL: Final = "gpt-realtime-2.1"

# Errors that need no action: a cancel that arrived after the response had ended.
_HARMLESS_ERRORS: Final = frozenset({"response_cancel_not_active"})

_ACTIVE_RESPONSE: Final = "conversation_already_has_active_response"

# The API's audio rate, in and out (PCM16 mono).
AUDIO_RATE: Final = 24000
DEFAULT_TRANSCRIPTION_MODEL: Final = "gpt-4o-mini-transcribe"


def _content_type(role: str) -> str:
    return "output_text" if role == "assistant" else "input_text"


def _message_item(message: Message) -> wire.Item:
    return wire.Item(
        type="message",
        role=message.role,
        content=[wire.ContentPart(type=_content_type(message.role), text=message.content)],
    )


def _turn_detection(given: AudioIn) -> wire.TurnDetection | None:
    """``audio.input.turn_detection`` for the session's choice (None: VAD off)."""
    if given.turn_detection == "none":
        return None
    if given.turn_detection == "semantic_vad":
        return wire.TurnDetection(
            type="semantic_vad",
            eagerness=given.eagerness,
            create_response=True,
            interrupt_response=given.interrupt_response,
        )
    return wire.TurnDetection(
        type="server_vad",
        create_response=True,
        interrupt_response=given.interrupt_response,
        idle_timeout_ms=given.idle_timeout_ms,
    )


def _noise_reduction(given: AudioIn) -> wire.NoiseReduction | msgspec.UnsetType | None:
    if given.noise_reduction is None:
        return msgspec.UNSET  # the provider's default
    if given.noise_reduction == "off":
        return None
    return wire.NoiseReduction(type=given.noise_reduction)


def _model_options(options: ModelOptions | None) -> dict[str, Any]:
    """``truncation`` and ``reasoning`` of ``session.update``, where the session sets them."""
    if options is None:
        return {}
    fields: dict[str, Any] = {}
    truncation = options.truncation
    if isinstance(truncation, str):
        fields["truncation"] = truncation
    elif truncation is not None:
        fields["truncation"] = wire.RetentionRatio(retention_ratio=truncation)
    if options.reasoning_effort is not None:
        fields["reasoning"] = wire.Reasoning(effort=options.reasoning_effort)
    return fields


def session_update(
    instructions: str,
    voice: VoiceConfig | None,
    transcription_model: str,
    options: ModelOptions | None = None,
) -> wire.Session:
    """The ``session.update`` of a session (text unless ``voice`` says otherwise)."""
    more = _model_options(options)
    if voice is None:
        return wire.Session(
            type="realtime", instructions=instructions, output_modalities=["text"], **more
        )
    audio_in = audio_out = None
    if voice.audio_in is not None:
        given = voice.audio_in
        audio_in = wire.AudioInput(
            format=wire.AudioFormat(type="audio/pcm", rate=AUDIO_RATE),
            transcription=(
                wire.Transcription(model=transcription_model) if given.transcription else None
            ),
            turn_detection=_turn_detection(given),
            noise_reduction=_noise_reduction(given),
        )
    if voice.audio_out is not None:
        audio_out = wire.AudioOutput(
            format=wire.AudioFormat(type="audio/pcm", rate=AUDIO_RATE),
            voice=voice.audio_out.voice or None,
        )
    tools = [
        wire.FunctionTool(name=t.name, description=t.description or None, parameters=t.parameters)
        for t in voice.tools
    ]
    return wire.Session(
        type="realtime",
        instructions=instructions,
        output_modalities=["audio"] if voice.audio_out is not None else ["text"],
        audio=wire.AudioConfig(input=audio_in, output=audio_out),
        tools=tools or None,
        **more,
    )


# Error codes a retry on OpenAI will not fix: a session falls back (if it can).
_NOT_RETRYABLE: Final = frozenset(
    {"invalid_api_key", "insufficient_quota", "model_not_found", "billing_hard_limit_reached"}
)


class OpenAIRealtime(Upstream):
    """One OpenAI Realtime session (see the module docstring)."""

    provider = "openai"

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        model: str = DEFAULT_MODEL,
        api_key: str = "",
        connect_timeout: float = 10.0,
        open_timeout: float = 10.0,
        transcription_model: str = DEFAULT_TRANSCRIPTION_MODEL,
        label: str = "OpenAI Realtime",
        key_variable: str = "OPENAI_API_KEY",
    ) -> None:
        """``connect_timeout`` bounds the TCP + TLS + WebSocket handshake;
        ``open_timeout`` the wait for ``session.created`` after it;
        ``transcription_model`` transcribes a voice session's input;
        ``label`` and ``key_variable`` name the API and its key in messages."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.connect_timeout = connect_timeout
        self.open_timeout = open_timeout
        self.transcription_model = transcription_model
        self._socket = ProviderSocket(label, key_variable)
        self._closed = False
        self._event_ids = itertools.count(1)
        # The response whose events reach the session, and whether a
        # ``response.create`` is waiting for its ``response.created``.
        self._current: str | None = None
        self._pending_create: str | None = None
        # Output item ids of the current (or last) response.
        self._items: list[str] = []
        # Voice: the server starts responses (server VAD); the input resampler.
        self._server_responses = False
        self._spoken = False  # the model answers in audio (a barge-in truncates its item)
        self._queued_events: collections.deque[UpstreamEvent] = collections.deque()
        self._resampler: Resampler | None = None
        # ``stream_text_to``: where deltas go while recv() waits, and a frame the
        # read callback decoded but did not take (recv() uses it, not decoding again).
        self._text_sink: Callable[[str], bool] | None = None
        self._decoded: tuple[bytes, wire.UpstreamServerEvent | None] | None = None
        self._intercepting = False

    @property
    def url(self) -> str:
        return f"{self.base_url}/realtime?model={quote(self.model, safe='')}"

    def session_update(
        self, instructions: str, voice: VoiceConfig | None, options: ModelOptions | None
    ) -> wire.Session:
        """The session this connection asks for (a provider of another shape overrides it)."""
        return session_update(instructions, voice, self.transcription_model, options)

    def headers(self) -> dict[str, str]:
        """The handshake's headers: the key as a bearer token."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # --- lifecycle --------------------------------------------------------------

    async def open(
        self,
        instructions: str,
        history: Sequence[Message],
        *,
        voice: VoiceConfig | None = None,
        resume: Resume | None = None,
        options: ModelOptions | None = None,
    ) -> None:
        # OpenAI Realtime has no resumption: ``resume`` is ignored, the history is loaded.
        if self._socket.open or self._closed:
            raise RuntimeError("an OpenAIRealtime is opened once; make a new one to reconnect")
        socket = self._socket
        await socket.connect(self.url, self.headers(), connect_timeout=self.connect_timeout)
        self._intercepting = socket.intercept(self._intercept)
        try:
            try:
                async with asyncio.timeout(self.open_timeout):
                    await self._await_session_created()
            except TimeoutError as exc:
                raise UpstreamClosed(
                    f"{self._socket.label} sent no session.created within {self.open_timeout:g}s"
                ) from exc
            session = self.session_update(instructions, voice, options)
            self._spoken = voice is not None and voice.audio_out is not None
            if voice is not None and voice.audio_in is not None:
                self._server_responses = voice.audio_in.turn_detection != "none"
                self._resampler = Resampler(voice.audio_in.rate, AUDIO_RATE)
            await self._send(wire.SessionUpdate(session=session, event_id=self._event_id()))
            for message in history:
                await self.add_message(message)
        except BaseException:
            await self.close()
            raise

    async def _await_session_created(self) -> None:
        while True:
            data = await self._socket.recv()
            if data is None:
                continue
            try:
                event = wire.decode_upstream(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if isinstance(event, wire.SessionCreated):
                return
            if isinstance(event, wire.ErrorEvent):
                error = event.error
                raise UpstreamClosed(
                    f"{self._socket.label} refused the session ({error.code or error.type}): "
                    f"{error.message}"
                )

    async def close(self) -> None:
        self._closed = True
        await self._socket.close()

    # --- requests ---------------------------------------------------------------

    async def add_message(self, message: Message) -> None:
        await self._send(wire.ConversationItemCreate(item=_message_item(message)))

    async def start_response(self) -> None:
        event_id = self._event_id()
        # Until its response.created arrives, events of any earlier response are stale.
        self._pending_create = event_id
        await self._send(wire.ResponseCreate(event_id=event_id))

    async def send_audio(self, pcm16: bytes) -> None:
        resampler = self._resampler
        if resampler is None:
            raise RuntimeError(
                "send_audio needs a voice session: open(..., voice=VoiceConfig(audio_in=...))"
            )
        await self._send(wire.InputAudioBufferAppend(audio=resampler.push(pcm16)))

    def tap_frames(self, tap: FrameTap) -> bool:
        self._socket.tap = tap
        return True

    def send_audio_now(self, pcm16: bytes) -> bool:
        resampler = self._resampler
        socket = self._socket
        if resampler is None or not socket.can_send_now():
            return False
        return socket.send_now(
            wire.encode(wire.InputAudioBufferAppend(audio=resampler.push(pcm16)))
        )

    async def commit_audio(self) -> None:
        await self._send(wire.InputAudioBufferCommit(event_id=self._event_id()))
        await self.start_response()

    async def send_function_output(self, call_id: str, output: str) -> None:
        item = wire.Item(type="function_call_output", call_id=call_id, output=output)
        await self._send(wire.ConversationItemCreate(item=item))

    async def cancel_response(self) -> None:
        await self._send(wire.ResponseCancel(event_id=self._event_id()))

    async def replace_response(self, text: str, *, heard_ms: int | None = None) -> None:
        items, self._items = self._items, []
        if heard_ms is not None and items and self._spoken:
            # A barge-in: the answer's audio is cut where the user stopped hearing it,
            # so the model's memory is what was heard (not the whole answer it wrote).
            await self._send(wire.ConversationItemTruncate(item_id=items[0], audio_end_ms=heard_ms))
            for item_id in items[1:]:
                await self._send(wire.ConversationItemDelete(item_id=item_id))
            return
        for item_id in items:
            await self._send(wire.ConversationItemDelete(item_id=item_id))
        if text:
            await self.add_message(Message(role="assistant", content=text))

    # --- events -----------------------------------------------------------------

    def stream_text_to(self, sink: Callable[[str], bool] | None) -> bool:
        if not self._intercepting:
            return False
        self._text_sink = sink
        return True

    def _intercept(self, data: bytes, text: bool) -> bool:
        """The read callback's offer of a frame while ``recv()`` waits: take a
        delta of the current response to the sink; leave anything else to ``recv()``."""
        sink = self._text_sink
        if sink is None or self._queued_events:
            return False
        try:
            event = wire.decode_upstream(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False  # recv() reports it
        if (
            type(event) is not wire.ResponseOutputTextDelta
            or event.response_id != self._current
            or self._pending_create is not None
        ):
            self._decoded = (data, event)
            return False
        if sink(event.delta):
            self._socket.nudge()
        return True

    async def recv(self) -> UpstreamEvent:
        socket = self._socket
        while True:
            if self._queued_events:
                return self._queued_events.popleft()
            data = await socket.recv()
            if data is None:
                return Woken()
            decoded, self._decoded = self._decoded, None
            if decoded is not None and decoded[0] is data:
                event = decoded[1]
            else:
                try:
                    event = wire.decode_upstream(data)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    return UpstreamError(
                        code="upstream_protocol",
                        message=f"unreadable {socket.label} frame ({exc}): {bytes(data[:200])!r}",
                    )
            if event is None:
                continue
            # Most frames are deltas: test for them first.
            if isinstance(event, wire.ResponseOutputTextDelta):
                if event.response_id == self._current and self._pending_create is None:
                    return TextDelta(event.delta)
            elif isinstance(event, wire.ResponseDone):
                done = self._response_done(event.response)
                if done is not None:
                    return done
            elif isinstance(event, wire.ResponseOutputItemAdded):
                if event.response_id == self._current and event.item.id:
                    self._items.append(event.item.id)
            elif isinstance(event, wire.ResponseCreated):
                if self._pending_create is not None:
                    self._pending_create = None
                    self._current = event.response.id
                    self._items = []
                elif self._server_responses:
                    # Server VAD answered the user: this response is the session's now.
                    self._current = event.response.id
                    self._items = []
                    return ResponseBegan()
            elif isinstance(event, wire.ErrorEvent):
                error = self._error(event.error)
                if error is not None:
                    return error
            elif isinstance(event, wire.ResponseOutputAudioDelta):
                if event.response_id == self._current and self._pending_create is None:
                    return AudioDelta(event.delta, AUDIO_RATE)
            elif isinstance(event, wire.ResponseOutputAudioTranscriptDelta):
                if event.response_id == self._current and self._pending_create is None:
                    return Spoken(event.delta)
            elif isinstance(event, wire.InputAudioBufferSpeechStarted):
                return SpeechBegan(event.audio_start_ms)
            elif isinstance(event, wire.InputAudioBufferSpeechStopped):
                return SpeechEnded(event.audio_end_ms)
            elif isinstance(event, wire.InputAudioTranscriptionCompleted):
                return Transcript(event.transcript)
            elif isinstance(event, wire.InputAudioBufferTimeoutTriggered):
                # Server VAD's idle timeout: the silence is the user's turn, and the
                # model speaks again (its response follows by itself).
                seconds = (event.audio_end_ms - event.audio_start_ms) / 1000
                self._queued_events.append(Transcript(f"(no speech for {seconds:g} s)"))
                return SpeechEnded(event.audio_end_ms)
            elif (
                isinstance(event, wire.ResponseFunctionCallArgumentsDone)
                and event.response_id == self._current
                and self._pending_create is None
            ):
                return NativeCall(event.call_id, event.name, event.arguments)
            # session.created after open: nothing to do.

    def _response_done(self, response: wire.Response) -> ResponseDone | None:
        if response.id != self._current or self._pending_create is not None:
            return None  # a stale response finishing after we asked for a new one
        for item in response.output:
            if item.id and item.id not in self._items:
                self._items.append(item.id)
        usage = None if response.usage is None else _usage(response.usage)
        detail = ""
        details = response.status_details
        if details is not None:
            if details.error is not None and details.error.message:
                detail = details.error.message
            elif details.reason:
                detail = details.reason
        return ResponseDone(status=response.status, usage=usage, detail=detail)

    def _error(self, error: wire.ErrorDetail) -> UpstreamError | None:
        code = error.code or error.type
        if code in _HARMLESS_ERRORS:
            return None
        if self._pending_create is not None and (
            error.event_id == self._pending_create or code == _ACTIVE_RESPONSE
        ):
            # Our response.create was refused: the running response (if any)
            # stays current, and its remaining events reach the session.
            self._pending_create = None
        return UpstreamError(code=code, message=error.message, retryable=code not in _NOT_RETRYABLE)

    # --- plumbing ---------------------------------------------------------------

    def _event_id(self) -> str:
        return f"gw_{next(self._event_ids)}"

    async def _send(self, event: wire.ClientEvent) -> None:
        await self._socket.send(wire.encode(event))


def _usage(reported: wire.ResponseUsage) -> Usage:
    """The response's usage with its priced parts: cached input, fresh audio in, audio out.

    ``Usage.cached`` and ``Usage.input_audio`` are disjoint parts of ``input``
    (``gateway.pricing``); OpenAI's ``audio_tokens`` includes cached audio, so
    that is taken out (it is priced as cached).
    """
    cached = input_audio = output_audio = 0
    details = reported.input_token_details
    if details is not None:
        cached = details.cached_tokens
        cached_audio = (
            details.cached_tokens_details.audio_tokens if details.cached_tokens_details else 0
        )
        input_audio = max(0, details.audio_tokens - cached_audio)
    if reported.output_token_details is not None:
        output_audio = reported.output_token_details.audio_tokens
    return Usage(
        input=reported.input_tokens,
        output=reported.output_tokens,
        cached=cached,
        input_audio=input_audio,
        output_audio=output_audio,
    )


def connect(row: Provider, settings: ProviderSettings, model: str) -> Upstream:
    """OpenAI's adapter for ``model``: GPT-Live's wire for a ``gpt-live-*`` model
    (``/v1/live/sessions``), Realtime's for any other (``/v1/realtime``)."""
    if is_live_model(model):
        return GPTLive(
            base_url=settings.base_url,
            api_key=settings.api_key,
            model=model,
            label="OpenAI GPT-Live",
            key_variable=row.key_variable,
            delegation=getattr(settings, "live_delegation", "client"),
            backend_model=getattr(settings, "live_backend_model", ""),
        )
    return OpenAIRealtime(
        base_url=settings.base_url,
        api_key=settings.api_key,
        model=model,
        label=row.label,
        key_variable=row.key_variable,
    )


_GPT_REALTIME_PRICE: Final = Price(
    input=4.0, cached_input=0.4, output=16.0, audio_input=32.0, audio_output=64.0
)
_GPT_REALTIME_2_PRICE: Final = Price(
    input=4.0, cached_input=0.4, output=24.0, audio_input=32.0, audio_output=64.0
)
_MINI_PRICE: Final = Price(
    input=0.6, cached_input=0.06, output=2.4, audio_input=10.0, audio_output=20.0
)
# GPT-Live: $0.05 per minute of active session time, billed per second (model pages,
# read 2026-12-05). Standby ($0.02) is WebRTC only: not used here.
_LIVE_PRICE: Final = Price(per_minute=0.05)

MODELS: Final = (
    # Realtime (GA): every model writes text when asked (output_modalities ["text"]).
    # Prices: developers.openai.com/api/docs/models/<model> (read 2026-12-03).
    ModelFacts("gpt-realtime-2.1", "text", thinking="level", price=_GPT_REALTIME_2_PRICE),
    ModelFacts("gpt-realtime-2.1-mini", "text", price=_MINI_PRICE),
    ModelFacts("gpt-realtime-2", "text", thinking="level", price=_GPT_REALTIME_2_PRICE),
    ModelFacts("gpt-realtime-1.5", "text", price=_GPT_REALTIME_PRICE),
    ModelFacts(
        "gpt-realtime",
        "text",
        shutdown="2027-01-20",
        replacement="gpt-realtime-2.1",
        price=_GPT_REALTIME_PRICE,
    ),
    ModelFacts(
        "gpt-realtime-2025-08-28", "text", shutdown="2027-01-20", replacement="gpt-realtime-2.1"
    ),
    ModelFacts(
        "gpt-realtime-mini",
        "text",
        shutdown="2027-01-20",
        replacement="gpt-realtime-2.1-mini",
        price=_MINI_PRICE,
    ),
    # GPT-Live (OpenAI's /v1/live/sessions wire, picked by the name): speech only, so a
    # text session takes the transcript of its speech as the answer.
    ModelFacts("gpt-live-1.1", "audio", price=_LIVE_PRICE),
    ModelFacts("gpt-live-1", "audio", price=_LIVE_PRICE),
)
"""OpenAI's realtime models: facts and list prices (sources: docs/providers.md)."""

PROVIDER: Final = Provider(
    name="openai",
    label="OpenAI Realtime",
    wire="openai",
    connect=connect,
    model_controls=live_controls,
    default_model=DEFAULT_MODEL,
    base_url=DEFAULT_BASE_URL,
    key_variable="OPENAI_API_KEY",
    sim=SimFlavour(base="/v1", auth="bearer", live=True),
    models=MODELS,
    extra=(
        ExtraSetting(
            "live_delegation",
            Literal["client", "responses"],
            "client",
            "GPT-Live models (gpt-live-*): who does delegated work: client (the gateway "
            "runs the session's tools) or responses (a Responses model run by OpenAI)",
        ),
        ExtraSetting(
            "live_backend_model",
            str,
            "",
            "GPT-Live with Responses delegation: the backend's model (e.g. gpt-5.5)",
        ),
    ),
)
