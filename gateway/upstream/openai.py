"""The OpenAI Realtime (GA) upstream adapter: one WebSocket per session.

It speaks the wire modelled in ``openai_wire`` over a raw ``websockets``
client (no SDK: the hot path is one ``recv`` and one msgspec decode per text
delta). Compression is off: per-message deflate costs CPU on every token
and the frames are small.

The I/O shell around ``OpenAIConversation`` (``gateway.upstream.openai_conversation``,
which holds every rule: the current response, its output items, which events
are stale): it dials, sends what the conversation says to send, and feeds it
every server event through the shared receive loop (``provider_socket.Inbox``).

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
import logging
from collections.abc import Callable, Sequence
from typing import Final, Literal
from urllib.parse import quote

from gateway.upstream import openai_wire as wire
from gateway.upstream.audio import Resampler
from gateway.upstream.base import (
    FrameTap,
    ModelOptions,
    Resume,
    Upstream,
    UpstreamClosed,
    UpstreamEvent,
    VoiceConfig,
)
from gateway.upstream.live import GPTLive, is_live_model, live_controls
from gateway.upstream.models import ModelFacts, Price
from gateway.upstream.openai_conversation import (
    AUDIO_RATE,
    DEFAULT_TRANSCRIPTION_MODEL,
    OpenAIConversation,
    message_item,
    session_update,
)
from gateway.upstream.provider import ExtraSetting, Provider, ProviderSettings, SimFlavour
from gateway.upstream.provider_socket import Inbox, ProviderSocket
from protocol.assembly import Message

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "MODELS", "PROVIDER", "OpenAIRealtime"]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL: Final = "wss://api.openai.com/v1"
DEFAULT_MODEL: Final = "gpt-realtime-2.1"


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
        self._conversation = OpenAIConversation()
        self._inbox: Inbox[wire.UpstreamServerEvent] = Inbox(
            self._socket, wire.decode_upstream, self._hot_text
        )
        self._resampler: Resampler | None = None

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
        self._inbox.attach()
        try:
            try:
                async with asyncio.timeout(self.open_timeout):
                    await self._await_session_created()
            except TimeoutError as exc:
                raise UpstreamClosed(
                    f"{self._socket.label} sent no session.created within {self.open_timeout:g}s"
                ) from exc
            session = self.session_update(instructions, voice, options)
            self._conversation = OpenAIConversation(voice)
            if voice is not None and voice.audio_in is not None:
                self._resampler = Resampler(voice.audio_in.rate, AUDIO_RATE)
            event_id = self._conversation.event_id()
            await self._send(wire.SessionUpdate(session=session, event_id=event_id))
            for message in history:
                await self.add_message(message)
        except BaseException:
            await self.close()
            raise

    async def _await_session_created(self) -> None:
        await self._inbox.until(self._session_created)

    def _session_created(self, event: wire.UpstreamServerEvent) -> bool:
        if isinstance(event, wire.ErrorEvent):
            error = event.error
            raise UpstreamClosed(
                f"{self._socket.label} refused the session ({error.code or error.type}): "
                f"{error.message}"
            )
        return isinstance(event, wire.SessionCreated)

    async def close(self) -> None:
        self._closed = True
        await self._socket.close()

    # --- requests ---------------------------------------------------------------

    async def add_message(self, message: Message) -> None:
        await self._send(wire.ConversationItemCreate(item=message_item(message)))

    async def start_response(self) -> None:
        await self._send(self._conversation.create_response())

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
        socket.write_now(wire.encode(wire.InputAudioBufferAppend(audio=resampler.push(pcm16))))
        return True

    async def commit_audio(self) -> None:
        for event in self._conversation.commit():
            await self._send(event)

    async def clear_audio(self) -> None:
        await self._send(wire.InputAudioBufferClear(event_id=self._conversation.event_id()))

    async def send_function_output(self, call_id: str, output: str) -> None:
        item = wire.Item(type="function_call_output", call_id=call_id, output=output)
        await self._send(wire.ConversationItemCreate(item=item))

    async def cancel_response(self) -> None:
        await self._send(self._conversation.cancel())

    async def replace_response(self, text: str, *, heard_ms: int | None = None) -> None:
        for event in self._conversation.replace(text, heard_ms):
            await self._send(event)

    # --- events -----------------------------------------------------------------

    def stream_text_to(self, sink: Callable[[str], bool] | None) -> bool:
        return self._inbox.stream_text_to(sink)

    def _hot_text(self, event: wire.UpstreamServerEvent) -> str | None:
        return self._conversation.hot_text(event)

    async def recv(self) -> UpstreamEvent:
        return await self._inbox.recv(self._conversation.handle)

    # --- plumbing ---------------------------------------------------------------

    async def _send(self, event: wire.ClientEvent) -> None:
        await self._socket.send(wire.encode(event))


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
