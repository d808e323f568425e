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
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Annotated, Final

import msgspec

from gateway.upstream import gemini_wire as wire
from gateway.upstream.audio import Resampler
from gateway.upstream.base import (
    FrameTap,
    ModelOptions,
    Resume,
    TextDelta,
    Upstream,
    UpstreamClosed,
    UpstreamError,
    UpstreamEvent,
    VoiceConfig,
)
from gateway.upstream.gemini_conversation import (
    CANCELLING,
    INPUT_MIME,
    INPUT_RATE,
    RUNNING,
    Compression,
    GeminiConversation,
)
from gateway.upstream.models import ModelFacts, Price
from gateway.upstream.provider import ExtraSetting, Provider, ProviderSettings, SimFlavour
from gateway.upstream.provider_socket import Inbox, ProviderSocket
from protocol.assembly import Message

__all__ = [
    "DEFAULT_API_VERSION",
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "MODELS",
    "PROVIDER",
    "GeminiLive",
]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL: Final = "wss://generativelanguage.googleapis.com"
# The Gemini API serves the Live WebSocket on v1beta (v1alpha for ephemeral tokens).
DEFAULT_API_VERSION: Final = "v1beta"
# Today's Live model (2026-09-15): it answers in audio only, so a text session takes the
# transcript of its speech (MODELS below; docs/providers.md).
DEFAULT_MODEL: Final = "gemini-3.8-live"


def close_hint(key_variable: str) -> Callable[[int, str], str]:
    """What to do about the closes the Live API is known to send (a refused key names
    ``key_variable``)."""

    def hint(code: int, reason: str) -> str:
        lowered = reason.lower()
        if "api key" in lowered or "unregistered callers" in lowered:
            return f": set {key_variable} to a valid Gemini API key"
        if "modalit" in lowered or "non-audio" in lowered:
            return (
                ": the model answers only in audio and was asked for TEXT; name a model "
                f"the gateway knows (e.g. {DEFAULT_MODEL}), so that it asks for audio"
            )
        if "not found" in lowered or "not supported for bidigeneratecontent" in lowered:
            return ": check the model name: it must be a Live model available to this key"
        if "quota" in lowered or "resource_exhausted" in lowered or code == 1013:
            return ": the key's quota or rate limit is exhausted; retry later"
        if code == 1011:
            return ": an error inside Gemini; the gateway retries"
        return ""

    return hint


class GeminiLive(Upstream):
    """One Gemini Live session: the socket and the timers around a ``GeminiConversation``."""

    provider = "gemini"

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        model: str = DEFAULT_MODEL,
        api_key: str = "",
        api_version: str = DEFAULT_API_VERSION,
        connect_timeout: float = 10.0,
        open_timeout: float = 10.0,
        cancel_grace: float = 0.5,
        label: str = "Gemini Live",
        key_variable: str = "GEMINI_API_KEY",
        compression: Compression | None = None,
        model_facts: ModelFacts | None = None,
    ) -> None:
        """``connect_timeout`` bounds the TCP + TLS + WebSocket handshake;
        ``open_timeout`` the wait for ``setupComplete`` after it;
        ``cancel_grace`` how long a cancelled turn may take to end by itself
        before it is abandoned (see the module docstring); ``label`` and
        ``key_variable`` name the API and its key in messages; ``compression``
        how the server compresses a long context (None: not at all);
        ``model_facts``: what the model can do (None: as the Gemini row lists it)."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.api_version = api_version
        self.connect_timeout = connect_timeout
        self.open_timeout = open_timeout
        self.cancel_grace = cancel_grace
        self.compression = compression
        self.model_facts = model_facts
        self._resumed = False
        self._socket = ProviderSocket(label, key_variable, hint=close_hint(key_variable))
        self._conversation = GeminiConversation("", ())
        self._opened = False
        self._closed = False
        # A reconnect started by replace_response; requests wait for it.
        self._reopen: asyncio.Task[None] | None = None
        self._deadline = 0.0  # loop time a cancelled turn is abandoned at
        self._inbox = Inbox(self._socket, wire.decode_server_message, self._hot_text)
        self._queued = self._inbox.queued
        self._resampler: Resampler | None = None

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
        resume: Resume | None = None,
        options: ModelOptions | None = None,
    ) -> None:
        if self._opened or self._closed:
            raise RuntimeError("a GeminiLive is opened once; make a new one to reconnect")
        self._opened = True
        if voice is not None and voice.audio_in is not None:
            self._resampler = Resampler(voice.audio_in.rate, INPUT_RATE)
        self._conversation = GeminiConversation(
            instructions,
            history,
            voice,
            model=self.model_facts or PROVIDER.facts(self.model),
            compression=self.compression,
            resume=resume.handle if resume is not None else "",
            reasoning_effort=options.reasoning_effort if options is not None else None,
            pending=len([m for m in resume.pending if m.content]) if resume is not None else 0,
        )
        try:
            await self._connect()
        except BaseException:
            await self.close()
            raise

    @property
    def resumed(self) -> bool:
        return self._resumed

    @property
    def position(self) -> int:
        return self._conversation.covered

    async def _connect(self) -> None:
        """A new connection, continuing the server's copy of the conversation when a
        handle is known; if the server refuses the handle, a fresh one that is sent the
        transcript instead."""
        conversation = self._conversation
        if conversation.resumable:
            try:
                await self._connect_once(resume=True)
            except UpstreamClosed as exc:
                if not exc.retryable or self._closed:
                    raise
                log.info("Gemini Live: resuming refused (%s); sending the transcript", exc.reason)
                conversation.resume_handle = ""
            else:
                self._resumed = True
                return
        await self._connect_once(resume=False)
        self._resumed = False

    async def close(self) -> None:
        self._closed = True
        task, self._reopen = self._reopen, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved: a failed reconnect needs no report now
        await self._socket.close()

    async def _connect_once(self, *, resume: bool) -> None:
        socket = self._socket
        headers = {"x-goog-api-key": self.api_key} if self.api_key else {}
        await socket.connect(
            self.url,
            headers,
            connect_timeout=self.connect_timeout,
            not_found="check the base URL and the API version (the Live API is served on "
            f"{DEFAULT_API_VERSION})",
        )
        self._inbox.attach()
        socket.suffix = ""
        try:
            setup = self._conversation.setup(self.model_name, resume=resume)
            await socket.send(wire.encode(wire.ClientMessage(setup=setup)))
            try:
                async with asyncio.timeout(self.open_timeout):
                    await self._await_setup_complete()
            except TimeoutError as exc:
                raise UpstreamClosed(
                    f"{socket.label} sent no setupComplete within {self.open_timeout:g}s"
                ) from exc
        except BaseException:
            await socket.close()
            raise
        self._conversation.connected(resumed=resume)
        self._queued.clear()

    async def _await_setup_complete(self) -> None:
        await self._inbox.until(self._setup_complete)

    def _setup_complete(self, message: wire.ServerMessage) -> bool:
        if message.error is not None:
            error = message.error
            raise UpstreamClosed(
                f"{self._socket.label} refused the session ({error.status or error.code}): "
                f"{error.message}"
            )
        return message.setup_complete is not None

    async def _reconnect(self, why: str) -> None:
        """Replace the connection by a new one: continuing the server's copy by its
        newest handle, or sent the transcript."""
        self._read_what_is_left()
        old = self._socket.detach()
        log.debug("Gemini Live: reconnecting with the transcript (%s)", why)
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()  # also stops a turn still running there
        await self._connect()
        if self._closed:
            await self._socket.close()
            raise UpstreamClosed("the Gemini Live adapter was closed while reconnecting")

    def _read_what_is_left(self) -> None:
        """Take in what the old connection already received (a handle given after the
        last turn, before a goAway's close): its events wait for ``recv``, in order."""
        for data in self._socket.take_ready():
            try:
                message = wire.decode_server_message(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            self._queued.extend(self._conversation.handle(message))

    def _begin_reconnect(self, why: str) -> None:
        if self._reopen is None:
            self._reopen = asyncio.create_task(self._reconnect(why), name="gemini-reconnect")

    async def _join_reconnect(self) -> None:
        task, self._reopen = self._reopen, None
        if task is not None:
            await task  # raises UpstreamClosed when the reconnect failed

    async def _ready(self) -> ProviderSocket:
        """The connection to send the next request on (reconnecting first if needed)."""
        if self._closed:
            raise UpstreamClosed("the Gemini Live connection is closed")
        if self._reopen is not None:
            await self._join_reconnect()
        else:
            why = self._conversation.reconnect_reason()
            if why is not None:
                await self._reconnect(why)
        if not self._socket.open:
            raise UpstreamClosed("the Gemini Live connection is closed")
        return self._socket

    # --- requests ---------------------------------------------------------------

    async def add_message(self, message: Message) -> None:
        if self._closed:
            raise UpstreamClosed("the Gemini Live connection is closed")
        self._conversation.add_message(message)

    async def add_context(self, message: Message) -> bool:
        # A turn appended here would be counted as sent in place of the model's next one
        # (``add_note``): a connection opened from history has it where it belongs.
        return False

    async def add_note(self, text: str) -> None:
        # A transcript turn waits for the next request: the spoken turn the note comes
        # before would be counted as sent in its place, and sent again with that request.
        return

    async def start_response(self) -> None:
        if self._conversation.turn_running:
            self._queued.append(
                UpstreamError(
                    code="active_response",
                    message="a Gemini Live turn is already running; wait for its end "
                    "before asking for another response",
                )
            )
            return
        socket = await self._ready()
        await socket.send(wire.encode(self._conversation.request()))

    async def send_audio(self, pcm16: bytes) -> None:
        resampler = self._resampler
        if resampler is None:
            raise RuntimeError(
                "send_audio needs a voice session: open(..., voice=VoiceConfig(audio_in=...))"
            )
        socket = await self._ready()
        opening = self._conversation.audio_opening()
        if opening is not None:
            await socket.send(wire.encode(opening))
        blob = wire.Blob(mime_type=INPUT_MIME, data=resampler.push(pcm16))
        await socket.send(
            wire.encode(wire.ClientMessage(realtime_input=wire.RealtimeInput(audio=blob)))
        )

    def tap_frames(self, tap: FrameTap) -> bool:
        self._socket.tap = tap
        return True

    def send_audio_now(self, pcm16: bytes) -> bool:
        resampler = self._resampler
        conversation = self._conversation
        if (
            resampler is None
            or self._closed
            or self._reopen is not None
            or conversation.reconnect_reason() is not None
            or conversation.audio_needs_opening
            or not self._socket.can_send_now()
        ):
            return False  # something to await first: send_audio does it
        blob = wire.Blob(mime_type=INPUT_MIME, data=resampler.push(pcm16))
        data = wire.encode(wire.ClientMessage(realtime_input=wire.RealtimeInput(audio=blob)))
        self._socket.write_now(data)
        return True

    async def commit_audio(self) -> None:
        socket = await self._ready()
        for message in self._conversation.commit():
            await socket.send(wire.encode(message))

    async def send_function_output(self, call_id: str, output: str) -> None:
        self._conversation.function_output(call_id, output)

    async def cancel_response(self) -> None:
        conversation = self._conversation
        if conversation.state != RUNNING:
            return
        unseen = any(isinstance(event, TextDelta) for event in self._queued)
        abandoned = conversation.cancel(unseen)
        if abandoned is not None:
            # Text the session has not seen yet: the model already wrote past the stop.
            self._queued.clear()
            self._queued.append(abandoned)
            return
        self._deadline = asyncio.get_running_loop().time() + self.cancel_grace

    async def replace_response(self, text: str, *, heard_ms: int | None = None) -> None:
        # Gemini keeps what it keeps of an interrupted spoken turn: ``heard_ms`` has no use here.
        if self._closed:
            raise UpstreamClosed("the Gemini Live connection is closed")
        conversation = self._conversation
        conversation.replace(text)
        if conversation.dirty:
            self._begin_reconnect("a response was replaced")
        elif conversation.go_away is not None:
            self._begin_reconnect(f"goAway (timeLeft={conversation.go_away})")

    # --- events -----------------------------------------------------------------

    async def recv(self) -> UpstreamEvent:
        conversation = self._conversation
        while True:
            if self._queued:
                return self._queued.popleft()
            if self._reopen is not None:
                await self._join_reconnect()
            deadline = None
            if conversation.state == CANCELLING:
                deadline = self._deadline
                if deadline <= asyncio.get_running_loop().time():
                    return conversation.abandon(
                        f"the turn did not end within {self.cancel_grace:g}s of the cancel"
                    )
            try:
                event = await self._inbox.next(self._handle, deadline=deadline)
            except TimeoutError:
                continue  # the deadline is checked at the top
            if event is not None:
                return event

    def _handle(self, message: wire.ServerMessage) -> list[UpstreamEvent]:
        conversation = self._conversation
        events = conversation.handle(message)
        if conversation.go_away is not None:
            self._socket.suffix = f" after goAway (timeLeft={conversation.go_away})"
        return events

    def stream_text_to(self, sink: Callable[[str], bool] | None) -> bool:
        return self._inbox.stream_text_to(sink)

    def _hot_text(self, message: wire.ServerMessage) -> str | None:
        """A text part of the running turn, taken for the sink while ``recv()`` waits."""
        if self._reopen is not None:
            return None
        part = self._conversation.hot_part(message)
        if part is None or not part.text or part.thought:
            return None
        self._conversation.took_text(part.text)
        return part.text


def connect(row: Provider, settings: ProviderSettings, model: str) -> GeminiLive:
    """An adapter of a provider on Gemini Live's wire (its row names it and its key)."""
    trigger = int(getattr(settings, "compression_trigger_tokens", 0))
    return GeminiLive(
        base_url=settings.base_url,
        api_key=settings.api_key,
        model=model,
        label=row.label,
        key_variable=row.key_variable,
        compression=Compression(trigger_tokens=trigger)
        if getattr(settings, "compression", True)
        else None,
        model_facts=row.facts(model),
    )


_NATIVE_AUDIO_2_5: Final = "gemini-2.5-flash-native-audio-preview-12-2025"

MODELS: Final = (
    # Gemini Live (Gemini Developer API): today's models answer in audio only and close
    # a TEXT setup; 2.0 and the half-cascade 2.5 were shut down on 2025-12-09.
    ModelFacts("gemini-3.8-live", "audio"),
    ModelFacts("gemini-3.8-live-extended-thinking", "audio", thinking="level"),
    ModelFacts(
        "gemini-3.1-flash-live-preview",
        "audio",
        thinking="level",
        text_refusal=(1011, "Internal error encountered."),
    ),
    ModelFacts(_NATIVE_AUDIO_2_5, "audio", thinking="budget"),
    ModelFacts("gemini-2.5-flash-native-audio-preview-09-2025", "audio", thinking="budget"),
    ModelFacts(
        "gemini-live-2.5-flash-preview",
        "text",
        shutdown="2025-12-09",
        replacement=_NATIVE_AUDIO_2_5,
    ),
    ModelFacts(
        "gemini-2.0-flash-live-001", "text", shutdown="2025-12-09", replacement=_NATIVE_AUDIO_2_5
    ),
)
"""Gemini's Live models (sources: docs/providers.md, "Models")."""


PROVIDER: Final = Provider(
    name="gemini",
    label="Gemini Live",
    wire="gemini",
    connect=connect,
    default_model=DEFAULT_MODEL,
    base_url=DEFAULT_BASE_URL,
    key_variable="GEMINI_API_KEY",
    sim=SimFlavour(),
    models=MODELS,
    price=Price(input=0.5, output=2.0, audio_input=3.0, audio_output=12.0),
    # Automatic activity detection (tuned) or manual activity signals (no semantic VAD,
    # idle timeout, noise reduction); context compression instead of truncation;
    # thinkingLevel.
    controls=frozenset({"reasoning_effort", "manual_turns", "vad_tuning"}),
    extra=(
        ExtraSetting(
            "compression",
            bool,
            True,
            "Gemini Live context window compression (sliding window): sessions are not "
            "ended by their context's size (15 minutes of audio without it)",
        ),
        ExtraSetting(
            "compression_trigger_tokens",
            Annotated[int, msgspec.Meta(ge=0)],
            0,
            "tokens of context past which Gemini Live compresses it; 0: the server's default",
        ),
    ),
)
