"""An OpenAI Realtime conversation as the adapter keeps it: pure state, no socket, no clock.

``OpenAIRealtime`` (``gateway.upstream.openai``) is the I/O shell: it dials,
sends what this object says to send and feeds it every server event. This
object decides the rest, so its rules are tested without sockets
(``tests/upstream/test_openai_conversation.py``):

- **the session** a connection asks for (``session_update``: text, or voice
  with its input, VAD, transcription, output voice and tools);
- **the current response**: the id from ``response.created`` after our
  ``response.create`` (``create_response``). Deltas and ``response.done`` of
  any other response are stale (a cancelled response still draining) and are
  dropped, so the session only ever sees the response it asked for. With
  server VAD the API starts responses itself: a ``response.created`` nobody
  asked for becomes the current response (``ResponseBegan``);
- **its output items**, so ``replace`` can delete them and put the text the
  parser accepted in their place (or, after a barge-in in a spoken session,
  truncate the answer's audio where the user stopped hearing it);
- **events**: ``handle`` turns a server event into the session's events
  (``TextDelta``, ``ResponseDone``… — the turn machine's inputs); ``hot_text``
  is its fast path for the read callback. An ``error`` becomes an
  ``UpstreamError`` (except ``response_cancel_not_active``: a cancel that raced
  with the end of the response is harmless); a refused ``response.create``
  leaves the running response current.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

import msgspec

from gateway.upstream import openai_wire as wire
from gateway.upstream.base import (
    AudioDelta,
    AudioIn,
    ModelOptions,
    NativeCall,
    ResponseBegan,
    ResponseDone,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    TextDelta,
    Transcript,
    UpstreamError,
    UpstreamEvent,
    VoiceConfig,
)
from protocol.assembly import Message
from protocol.events import Usage

__all__ = [
    "AUDIO_RATE",
    "DEFAULT_TRANSCRIPTION_MODEL",
    "OpenAIConversation",
    "message_item",
    "session_update",
    "usage_of",
]

# Errors that need no action: a cancel that arrived after the response had ended.
_HARMLESS_ERRORS: Final = frozenset({"response_cancel_not_active"})

_ACTIVE_RESPONSE: Final = "conversation_already_has_active_response"

# Error codes a retry on OpenAI will not fix: a session falls back (if it can).
_NOT_RETRYABLE: Final = frozenset(
    {"invalid_api_key", "insufficient_quota", "model_not_found", "billing_hard_limit_reached"}
)

# The API's audio rate, in and out (PCM16 mono).
AUDIO_RATE: Final = 24000
DEFAULT_TRANSCRIPTION_MODEL: Final = "gpt-4o-mini-transcribe"


def _content_type(role: str) -> str:
    return "output_text" if role == "assistant" else "input_text"


def message_item(message: Message) -> wire.Item:
    """A history message as a conversation item."""
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
        threshold=given.threshold,
        prefix_padding_ms=given.prefix_padding_ms,
        silence_duration_ms=given.silence_duration_ms,
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
            speed=voice.audio_out.speed,
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


def usage_of(reported: wire.ResponseUsage) -> Usage:
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


class OpenAIConversation:
    """What the adapter keeps of one Realtime conversation (see the module docstring)."""

    __slots__ = ("_event_ids", "current", "items", "pending_create", "server_responses", "spoken")

    def __init__(self, voice: VoiceConfig | None = None) -> None:
        self._event_ids = itertools.count(1)
        # The response whose events reach the session, and the event id of a
        # ``response.create`` waiting for its ``response.created``.
        self.current: str | None = None
        self.pending_create: str | None = None
        self.items: list[str] = []  # output item ids of the current (or last) response
        # The model answers in audio: a barge-in truncates its item.
        self.spoken = voice is not None and voice.audio_out is not None
        # Server VAD: the server starts responses itself.
        self.server_responses = (
            voice is not None
            and voice.audio_in is not None
            and voice.audio_in.turn_detection != "none"
        )

    def event_id(self) -> str:
        return f"gw_{next(self._event_ids)}"

    # --- requests ---------------------------------------------------------------

    def create_response(self) -> wire.ResponseCreate:
        """Ask for a response: until its ``response.created``, every earlier one is stale."""
        event_id = self.event_id()
        self.pending_create = event_id
        return wire.ResponseCreate(event_id=event_id)

    def commit(self) -> list[wire.ClientEvent]:
        """The user's audio is done: commit it and ask for the answer."""
        return [wire.InputAudioBufferCommit(event_id=self.event_id()), self.create_response()]

    def cancel(self) -> wire.ResponseCancel:
        return wire.ResponseCancel(event_id=self.event_id())

    def replace(self, text: str, heard_ms: int | None = None) -> list[wire.ClientEvent]:
        """What puts ``text`` in place of the last response's items: their deletion and
        ``text`` as an assistant message; after a barge-in in a spoken session
        (``heard_ms``), the answer truncated where the user stopped hearing it."""
        items, self.items = self.items, []
        if heard_ms is not None and items and self.spoken:
            # The model's memory is what was heard (not the whole answer it wrote).
            truncate = wire.ConversationItemTruncate(item_id=items[0], audio_end_ms=heard_ms)
            return [truncate, *(wire.ConversationItemDelete(item_id=i) for i in items[1:])]
        events: list[wire.ClientEvent] = [wire.ConversationItemDelete(item_id=i) for i in items]
        if text:
            item = message_item(Message(role="assistant", content=text))
            events.append(wire.ConversationItemCreate(item=item))
        return events

    # --- events -----------------------------------------------------------------

    def _ours(self, response_id: str) -> bool:
        return response_id == self.current and self.pending_create is None

    def hot_text(self, event: wire.UpstreamServerEvent) -> str | None:
        """The text of a delta of the current response (the read callback's fast path);
        None for any other event (``handle`` takes it)."""
        if type(event) is wire.ResponseOutputTextDelta and self._ours(event.response_id):
            return event.delta
        return None

    def handle(self, event: wire.UpstreamServerEvent) -> list[UpstreamEvent]:
        """The session's events for one server event, in order (none for most)."""
        match event:
            # Most frames are deltas: they come first.
            case wire.ResponseOutputTextDelta():
                return [TextDelta(event.delta)] if self._ours(event.response_id) else []
            case wire.ResponseDone():
                done = self._response_done(event.response)
                return [] if done is None else [done]
            case wire.ResponseOutputItemAdded():
                if event.response_id == self.current and event.item.id:
                    self.items.append(event.item.id)
                return []
            case wire.ResponseCreated():
                return self._response_created(event.response.id)
            case wire.ErrorEvent():
                error = self._error(event.error)
                return [] if error is None else [error]
            case wire.ResponseOutputAudioDelta():
                ours = self._ours(event.response_id)
                return [AudioDelta(event.delta, AUDIO_RATE)] if ours else []
            case wire.ResponseOutputAudioTranscriptDelta():
                return [Spoken(event.delta)] if self._ours(event.response_id) else []
            case wire.InputAudioBufferSpeechStarted():
                return [SpeechBegan(event.audio_start_ms)]
            case wire.InputAudioBufferSpeechStopped():
                return [SpeechEnded(event.audio_end_ms)]
            case wire.InputAudioTranscriptionCompleted():
                return [Transcript(event.transcript)]
            case wire.InputAudioBufferTimeoutTriggered():
                # Server VAD's idle timeout: the silence is the user's turn, and the
                # model speaks again (its response follows by itself).
                seconds = (event.audio_end_ms - event.audio_start_ms) / 1000
                return [
                    SpeechEnded(event.audio_end_ms),
                    Transcript(f"(no speech for {seconds:g} s)"),
                ]
            case wire.ResponseFunctionCallArgumentsDone():
                if self._ours(event.response_id):
                    return [NativeCall(event.call_id, event.name, event.arguments)]
                return []
        return []  # session.created after open, and the rest: nothing to do

    def _response_created(self, response_id: str) -> list[UpstreamEvent]:
        if self.pending_create is not None:
            self.pending_create = None
            self.current = response_id
            self.items = []
        elif self.server_responses:
            # Server VAD answered the user: this response is the session's now.
            self.current = response_id
            self.items = []
            return [ResponseBegan()]
        return []

    def _response_done(self, response: wire.Response) -> ResponseDone | None:
        if not self._ours(response.id):
            return None  # a stale response finishing after we asked for a new one
        for item in response.output:
            if item.id and item.id not in self.items:
                self.items.append(item.id)
        usage = None if response.usage is None else usage_of(response.usage)
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
        if self.pending_create is not None and (
            error.event_id == self.pending_create or code == _ACTIVE_RESPONSE
        ):
            # Our response.create was refused: the running response (if any)
            # stays current, and its remaining events reach the session.
            self.pending_create = None
        return UpstreamError(code=code, message=error.message, retryable=code not in _NOT_RETRYABLE)
