"""The GPT-Live upstream adapter: one WebSocket to ``/v1/live/sessions`` per session.

The I/O shell around ``LiveConversation`` (``gateway.upstream.live_conversation``,
which holds every rule): it dials ``BASE/live/sessions`` with no query (the
model goes in the session object), sends ``session.start`` and waits for
``session.started`` before anything else, sends what the conversation puts
in its outbox, feeds it every server event, and keeps its one timer (the
model falling quiet ends a turn: GPT-Live sends no turn boundary).

Picked on the OpenAI provider by the model's name (``gpt-live-*``, see
``is_live_model``), so ``--model gpt-live-1.1`` needs nothing else; on Azure
by the deployment name containing ``gpt-live``. Facts and sources:
docs/providers.md, "GPT-Live".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Final, Literal

from gateway.upstream import live_wire as wire
from gateway.upstream.audio import Resampler
from gateway.upstream.base import (
    FrameTap,
    ModelOptions,
    Resume,
    Upstream,
    UpstreamClosed,
    UpstreamError,
    UpstreamEvent,
    VoiceConfig,
    Woken,
)
from gateway.upstream.live_conversation import (
    AUDIO_RATE,
    RETRYABLE_CLOSES,
    LiveConversation,
)
from gateway.upstream.provider_socket import Inbox, ProviderSocket
from protocol.assembly import Message

__all__ = ["QUIET_SECONDS", "GPTLive", "QuietTimer", "is_live_model", "live_controls"]

log = logging.getLogger("gateway.upstream.live")

QUIET_SECONDS: Final = 1.0
"""The model's turn is over once it has sent nothing for this long (GPT-Live has no
turn-done event; its audio comes faster than real time, so this is silence, not playback)."""

CLOSE_SECONDS: Final = 1.0
"""At most this long spent sending ``session.close`` when the adapter closes."""

ANSWER_SECONDS: Final = 20.0
"""A turn asked for whose model says nothing for this long ends ``incomplete``."""


def is_live_model(model: str) -> bool:
    """A model served on GPT-Live's wire, not on Realtime's (``gpt-live-1``, ``gpt-live-1.1``…)."""
    return "gpt-live" in model.removeprefix("openai/")


def live_controls(model: str) -> frozenset[str] | None:
    """A GPT-Live model's session controls: none of ``CONTROLS`` (it decides turns,
    so a client cannot end one with a commit either, and manages its context itself);
    None for any other model (its row's)."""
    return frozenset() if is_live_model(model) else None


class QuietTimer:
    """The shell's one timer (``LiveConversation.timer``): GPT-Live marks no turn's end,
    so a turn the model spoke in ends after ``quiet`` seconds of its silence, and a turn
    asked for waits ``answer`` seconds for its first word. Every change of the
    conversation's ``activity`` starts it again."""

    __slots__ = ("_mark", "_seen", "answer", "quiet")

    def __init__(self, quiet: float, answer: float) -> None:
        self.quiet = quiet
        self.answer = answer
        self._seen = -1  # the conversation's activity the timer counts from
        self._mark = 0.0

    def deadline(self, conversation: LiveConversation, now: float) -> float | None:
        """When the timer runs out (loop time), or None: nothing to wait for."""
        if conversation.activity != self._seen:
            self._seen = conversation.activity
            self._mark = now
        timer = conversation.timer
        if timer is None:
            return None
        return self._mark + (self.quiet if timer == "quiet" else self.answer)


class GPTLive(Upstream):
    """One GPT-Live session (see the module docstring)."""

    provider = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "",
        connect_timeout: float = 10.0,
        open_timeout: float = 10.0,
        quiet_seconds: float = QUIET_SECONDS,
        answer_seconds: float = ANSWER_SECONDS,
        delegation: Literal["client", "responses"] = "client",
        backend_model: str = "",
        label: str = "OpenAI GPT-Live",
        key_variable: str = "OPENAI_API_KEY",
        auth: str = "bearer",
        provider: str = "openai",
    ) -> None:
        """``quiet_seconds``: silence that ends a turn; ``answer_seconds``: how long a turn
        asked for may wait for its first word; ``delegation``/``backend_model``: who does
        delegated work (``responses`` needs the backend's model)."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.auth = auth
        self.provider = provider
        self.connect_timeout = connect_timeout
        self.open_timeout = open_timeout
        self._timer = QuietTimer(quiet_seconds, answer_seconds)
        self.delegation: Literal["client", "responses"] = delegation
        self.backend_model = backend_model
        self._socket = ProviderSocket(label, key_variable)
        self._conversation = LiveConversation(model, "", (), None)
        self._inbox: Inbox[wire.AdapterEvent] = Inbox(self._socket, wire.decode_upstream)
        self._queued = self._inbox.queued
        self._service_closed: str | None = None  # session.closed's reason, once received
        self._resampler: Resampler | None = None
        self._opened = False
        self._closed = False

    @property
    def url(self) -> str:
        base = self.base_url
        if base.startswith("https://"):
            base = "wss://" + base.removeprefix("https://")
        elif base.startswith("http://"):
            base = "ws://" + base.removeprefix("http://")
        return base if base.endswith(wire.PATH) else base + wire.PATH

    def headers(self) -> dict[str, str]:
        if not self.api_key:
            return {}
        if self.auth == "api-key":
            return {"api-key": self.api_key}
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def seconds(self) -> float:
        """The session's billable seconds so far, as GPT-Live last reported them."""
        return self._conversation.seconds

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
        # GPT-Live has no resumption here: ``resume`` is ignored, the history is loaded.
        if self._opened or self._closed:
            raise RuntimeError("a GPTLive is opened once; make a new one to reconnect")
        self._opened = True
        refusal = _refusal(voice, options)
        if refusal is not None:
            raise UpstreamClosed(f"{self._socket.label}: {refusal}", retryable=False)
        backend = None
        if self.delegation == "responses":
            if not self.backend_model:
                raise UpstreamClosed(
                    f"{self._socket.label}: Responses delegation needs the backend's model "
                    "(--openai-live-backend-model)",
                    retryable=False,
                )
            backend = _responses_backend(self.backend_model, voice)
        if voice is not None and voice.audio_in is not None:
            self._resampler = Resampler(voice.audio_in.rate, AUDIO_RATE)
        self._conversation = LiveConversation(
            self.model,
            instructions,
            history,
            voice,
            delegation=self.delegation,
            backend=backend,
        )
        socket = self._socket
        try:
            await socket.connect(
                self.url,
                self.headers(),
                connect_timeout=self.connect_timeout,
                not_found=f"check the base URL: GPT-Live is served at BASE{wire.PATH}",
            )
            await self._send(self._conversation.start())
            try:
                async with asyncio.timeout(self.open_timeout):
                    await self._await_started()
            except TimeoutError as exc:
                raise UpstreamClosed(
                    f"{socket.label} sent no session.started within {self.open_timeout:g}s"
                ) from exc
        except BaseException:
            await self.close()
            raise

    async def _await_started(self) -> None:
        await self._inbox.until(self._started)

    def _started(self, event: wire.AdapterEvent) -> bool:
        if isinstance(event, wire.ErrorEvent):
            error = event.error
            where = f" ({error.param})" if error.param else ""
            raise UpstreamClosed(
                f"{self._socket.label} refused the session ({error.code}{where}): {error.message}",
                retryable=False,
            )
        if isinstance(event, wire.SessionStarted):
            self._conversation.handle(event)
            return True
        return False

    async def close(self) -> None:
        self._closed = True
        socket = self._socket
        if socket.open and self._conversation.started and not self._conversation.closed_reason:
            # Ask the service to finalize (its usage); a congested socket does not hold
            # the close up for long.
            with contextlib.suppress(UpstreamClosed, TimeoutError):
                async with asyncio.timeout(CLOSE_SECONDS):
                    await socket.send(wire.encode(wire.SessionClose()))
        await socket.close()

    # --- requests ---------------------------------------------------------------

    async def _send(self, event: wire.ClientEvent) -> None:
        await self._socket.send(wire.encode(event))

    async def _flush(self) -> None:
        outbox = self._conversation.outbox
        if len(outbox) > 1 and self._socket.can_send_now():
            # A long text is hundreds of appends (``APPEND_CHARS``): one socket write, not
            # one each. Nothing is awaited, so nothing else is sent between them.
            frames = [wire.encode(event) for event in outbox]
            outbox.clear()
            self._socket.write_all_now(frames)
        while outbox:
            await self._send(outbox.pop(0))

    def _ready(self) -> None:
        if self._closed or not self._socket.open:
            raise UpstreamClosed(f"the {self._socket.label} connection is closed")

    async def add_message(self, message: Message) -> None:
        self._ready()
        self._conversation.add_message(message)
        await self._flush()

    async def add_context(self, message: Message) -> bool:
        # A user message here is the caller's next typed one (``add_message``): a context
        # of the user's is told as what the caller said, as an assistant's is.
        self._ready()
        self._conversation.add_context(message)
        await self._flush()
        return True

    async def add_note(self, text: str) -> None:
        # A user message is typed text for the next ``begin``: the note would be asked
        # as the caller's next typed message.
        return

    async def start_response(self) -> None:
        self._ready()
        if self._conversation.turn_running:
            self._queued.append(
                UpstreamError(
                    code="active_response",
                    message="a GPT-Live turn is already running; wait for its end "
                    "before asking for another response",
                )
            )
            return
        self._conversation.begin()
        await self._flush()

    async def commit_audio(self) -> None:
        # GPT-Live decides turns itself (no manual commit): the model answers when it
        # hears the caller stop; the session waits for it as after ``start_response``.
        self._ready()
        if not self._conversation.turn_running:
            self._conversation.begin()
            self._conversation.outbox.clear()  # nothing to ask: the speech is the request

    async def send_audio(self, pcm16: bytes) -> None:
        resampler = self._resampler
        if resampler is None:
            raise RuntimeError(
                "send_audio needs a voice session: open(..., voice=VoiceConfig(audio_in=...))"
            )
        self._ready()
        await self._send(wire.InputAudioAppend(audio=resampler.push(pcm16)))

    def send_audio_now(self, pcm16: bytes) -> bool:
        resampler = self._resampler
        if resampler is None or self._closed or not self._socket.can_send_now():
            return False
        self._socket.write_now(wire.encode(wire.InputAudioAppend(audio=resampler.push(pcm16))))
        return True

    def tap_frames(self, tap: FrameTap) -> bool:
        self._socket.tap = tap
        return True

    async def send_function_output(self, call_id: str, output: str) -> None:
        self._ready()
        self._conversation.function_output(call_id, output)
        await self._flush()

    async def cancel_response(self) -> None:
        done = self._conversation.cancel()
        if done is not None:
            self._queued.append(done)

    async def replace_response(self, text: str, *, heard_ms: int | None = None) -> None:
        # GPT-Live's conversation cannot be edited: what the model said stays said.
        return

    # --- events -----------------------------------------------------------------

    async def recv(self) -> UpstreamEvent:
        conversation = self._conversation
        while True:
            if self._queued:
                return self._queued.popleft()
            if conversation.outbox:
                await self._flush()
            try:
                now = asyncio.get_running_loop().time()
                deadline = self._timer.deadline(conversation, now)
                event = await self._inbox.next(self._handle, deadline=deadline)
            except TimeoutError:
                self._queued.extend(conversation.quiet())
                continue
            except UpstreamClosed as exc:
                raise self._closing(exc) from exc
            if self._service_closed is not None:
                await self._socket.close()
                raise self._closed_by_service(self._service_closed)
            if event is not None and not isinstance(event, Woken):
                return event

    def _handle(self, event: wire.AdapterEvent) -> list[UpstreamEvent]:
        events = self._conversation.handle(event)
        if isinstance(event, wire.SessionClosed):
            # The events it meant wait for a later recv(); this one raises.
            self._queued.extend(events)
            self._service_closed = event.reason
            return []
        return events

    def _closed_by_service(self, reason: str) -> UpstreamClosed:
        retryable = reason in RETRYABLE_CLOSES
        why = {
            "expired": "the session reached its time limit",
            "content": "a safety filter ended it",
            "remote_hangup": "the remote party hung up",
            "connection_lost": "a connection was lost",
            "close_requested": "a close was requested",
        }.get(reason, reason)
        return UpstreamClosed(
            f"{self._socket.label} closed the session ({reason}: {why})", retryable=retryable
        )

    def _closing(self, exc: UpstreamClosed) -> UpstreamClosed:
        reason = self._conversation.closed_reason
        return self._closed_by_service(reason) if reason else exc


def _refusal(voice: VoiceConfig | None, options: ModelOptions | None) -> str | None:
    """What a session asks that GPT-Live has no setting for (refused, never ignored)."""
    if voice is not None and voice.audio_in is not None:
        given = voice.audio_in
        if given.turn_detection == "semantic_vad":
            return "GPT-Live decides turns itself: it has no semantic_vad setting"
        if given.idle_timeout_ms is not None:
            return "GPT-Live has no idle_timeout_ms setting"
        if given.noise_reduction not in (None, "off"):
            return "GPT-Live has no noise_reduction setting"
    if options is not None:
        if options.truncation is not None:
            return "GPT-Live manages its context itself: it has no truncation setting"
        if options.reasoning_effort is not None:
            return "GPT-Live has no reasoning_effort; set the backend's with Responses delegation"
    return None


def _responses_backend(model: str, voice: VoiceConfig | None) -> wire.Delegation:
    """A Responses delegation running ``model`` with the session's tools as functions."""
    tools = [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description or None,
            "parameters": tool.parameters or {"type": "object", "properties": {}},
        }
        for tool in (voice.tools if voice is not None else ())
    ]
    responses: dict[str, object] = {"model": model}
    if tools:
        responses["tools"] = [{k: v for k, v in t.items() if v is not None} for t in tools]
    return wire.Delegation(type="responses", responses=responses)
