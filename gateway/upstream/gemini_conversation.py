"""A Gemini Live conversation as the adapter keeps it: pure state, no socket, no clock.

``GeminiLive`` (``gateway.upstream.gemini``) is the I/O shell: it dials,
sends what this object says to send, feeds it every server message, and
keeps the timers. This object decides the rest, so its rules are tested
without sockets (``tests/upstream/test_gemini_conversation.py``):

- **the setup** a connection opens with (model, modalities, instructions,
  tools, voice and transcription), written by ``gateway.upstream.gemini_setup``
  from the session's ``LiveSettings``;
- **the transcript**: the conversation as it was sent (the instructions,
  every message, each model turn as the model wrote it) and how many of its
  turns the server holds (``sent``, a prefix). Gemini's conversation cannot
  be edited, so when the server's copy stops matching (``dirty``: a replaced
  or interrupted turn) or the server announced its end (``goAway``), the
  shell reconnects (``reconnect_reason``) and the next request sends the
  transcript again;
- **requests**: ``request`` gives the one message that asks for the next
  model turn (every turn the server lacks, in one ``clientContent`` with
  ``turnComplete``; or the function responses of a tool step);
- **the model's turn**: ``handle`` turns a server message into the session's
  events (``TextDelta``, ``ResponseDone``… — the turn machine's inputs) and
  tracks the turn (idle, running, cancelling, stale); ``cancel`` and
  ``abandon`` implement a cancel on an API that has none (see the adapter's
  docstring).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Final

import msgspec

from gateway.upstream import gemini_wire as wire
from gateway.upstream.base import (
    AudioDelta,
    NativeCall,
    ResponseBegan,
    ResponseDone,
    Resumable,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    TextDelta,
    Thought,
    Transcript,
    UpstreamError,
    UpstreamEvent,
    VoiceConfig,
)
from gateway.upstream.gemini_setup import Compression, LiveSettings
from gateway.upstream.models import ModelFacts
from protocol.assembly import Message
from protocol.events import Usage
from protocol.metering import billed_tokens_estimate

__all__ = ["IDLE", "Compression", "GeminiConversation"]

log = logging.getLogger("gateway.upstream.gemini")

# The Live API's audio rates (PCM16 mono): what it hears and how it speaks.
INPUT_RATE: Final = 16000
OUTPUT_RATE: Final = 24000
INPUT_MIME: Final = f"audio/pcm;rate={INPUT_RATE}"
_RATE: Final = re.compile(r"rate=(\d+)")

# Where the current model turn is.
IDLE: Final = 0  # no turn requested, or it ended
RUNNING: Final = 1  # requested; its text reaches the session
CANCELLING: Final = 2  # cancel asked: waiting (bounded) for the turn to end by itself
STALE: Final = 3  # the session was told it ended, but it still runs on the server

_ROLES: Final = {"user": "user", "assistant": "model", "system": "user"}

# Google API statuses a retry will not fix: a session falls back (if it can).
_NOT_RETRYABLE: Final = frozenset(
    {"PERMISSION_DENIED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "NOT_FOUND"}
)


def _offset_ms(duration: str | None) -> int:
    """A protobuf Duration (``"1.200s"``) in milliseconds (0 if absent or unreadable)."""
    try:
        return round(float((duration or "0s").removesuffix("s")) * 1000)
    except ValueError:
        return 0


def _rate(mime_type: str | None) -> int:
    match = _RATE.search(mime_type or "")
    return int(match.group(1)) if match else OUTPUT_RATE


def _turn(message: Message) -> wire.Content:
    return wire.text_content(_ROLES[message.role], message.content)


def turn_text(turn: wire.Content) -> str:
    return "".join(part.text or "" for part in turn.parts)


def _audio_tokens(details: list[wire.ModalityTokenCount] | None) -> int:
    """The AUDIO entry of a usage breakdown by modality (0 when there is none)."""
    if not details:
        return 0
    return sum(d.token_count or 0 for d in details if d.modality == "AUDIO")


class GeminiConversation:
    """One session's conversation with Gemini Live (see the module docstring).

    ``voice``, ``model`` (the facts of the model: how it thinks),
    ``compression`` (how the server compresses a long context; None: it does
    not) and ``reasoning_effort`` are the ``settings`` every connection's setup
    says (``gateway.upstream.gemini_setup``); ``resume``: a
    handle to continue the server's own copy of the conversation, with the
    messages it does not hold yet (``pending``) at the end of ``history``.
    """

    __slots__ = (
        "_activity_open",
        "_calls",
        "_heard",
        "_outputs",
        "_reply_at",
        "_reply_index",
        "_reply_on_server",
        "_text",
        "_usage",
        "covered",
        "dirty",
        "go_away",
        "instructions",
        "resume_handle",
        "resume_position",
        "sent",
        "settings",
        "state",
        "transcript",
    )

    def __init__(
        self,
        instructions: str,
        history: Sequence[Message],
        voice: VoiceConfig | None = None,
        *,
        model: ModelFacts | None = None,
        compression: Compression | None = None,
        resume: str = "",
        pending: int = 0,
        reasoning_effort: str | None = None,
    ) -> None:
        self.instructions = instructions
        self.settings = LiveSettings(voice, model, compression, reasoning_effort)
        # The newest resumption handle: the server's copy of this conversation, which a
        # new connection continues (goAway) instead of being sent the transcript.
        self.resume_handle = resume
        self._activity_open = False
        # Empty messages are left out: the API refuses an empty text part.
        self.transcript: list[wire.Content] = [_turn(m) for m in history if m.content]
        # How many transcript turns the server holds (a prefix): with a handle, all but the
        # ``pending`` turns logged after it was given; after ``connected(resumed=False)``, none.
        self.sent = max(0, len(self.transcript) - pending) if resume else 0
        # What the server held at its last turn end: the position its handles refer to;
        # and the position of the handle kept (what a connection resuming it holds).
        self.covered = self.sent
        self.resume_position = self.sent
        # The server's conversation differs from the transcript, or a stale turn
        # still runs on it: reconnect before the next request.
        self.dirty = False
        self.go_away: str | None = None  # timeLeft of the goAway received, if any
        # The current (or last) model turn.
        self.state = IDLE
        self._text: list[str] = []  # its text given to the session
        self._usage: Usage | None = None
        # Where the last response's text goes in the transcript (right after the
        # turns of its request), where it is, and whether the server holds exactly it.
        self._reply_at = len(self.transcript)
        self._reply_index: int | None = None
        self._reply_on_server = False
        self._heard: list[str] = []  # input transcription pieces of the current user turn
        self._calls: dict[str, str] = {}  # call id -> function name, until answered
        self._outputs: list[wire.FunctionResponse] = []

    # --- connections --------------------------------------------------------------------

    def setup(self, model_name: str, *, resume: bool = True) -> wire.Setup:
        """The ``setup`` a new connection opens with (continuing ``handle`` if ``resume``)."""
        handle = self.resume_handle if resume else ""
        return self.settings.setup(model_name, self.instructions, handle)

    @property
    def resumable(self) -> bool:
        """A new connection may continue the server's copy: there is a handle, and the
        copy is what the transcript says (not ``dirty``)."""
        return bool(self.resume_handle) and not self.dirty

    def connected(self, *, resumed: bool) -> None:
        """A new connection is set up. ``resumed``: it continues the server's copy (which
        holds what it held); otherwise it holds none of the transcript yet."""
        if resumed:
            self.sent = self.resume_position
        else:
            self.sent = 0
            self.resume_handle = ""  # a new copy on the server: the old handle names another
        self.covered = self.resume_position = self.sent
        self.dirty = False
        self.go_away = None
        self.state = IDLE
        self._reply_on_server = False

    def reconnect_reason(self) -> str | None:
        """Why the next request needs a new connection first, or None."""
        if self.dirty:
            return "the server's conversation differs from the transcript"
        if self.go_away is not None:
            return f"goAway (timeLeft={self.go_away})"
        return None

    # --- requests -----------------------------------------------------------------------

    def add_message(self, message: Message) -> None:
        if message.content:  # the API refuses an empty text part
            self.transcript.append(_turn(message))

    @property
    def turn_running(self) -> bool:
        return self.state == RUNNING or self.state == CANCELLING

    def request(self) -> wire.ClientMessage:
        """The message that asks for the next model turn (the turn begins now)."""
        if self._outputs:
            outputs, self._outputs = self._outputs, []
            self.begin_turn()
            response = wire.ToolResponse(function_responses=outputs)
            return wire.ClientMessage(tool_response=response)
        pending = self.transcript[self.sent :]
        self.begin_turn()
        content = wire.ClientContent(turns=pending or None, turn_complete=True)
        self.sent = self._reply_at = len(self.transcript)
        return wire.ClientMessage(client_content=content)

    def begin_turn(self) -> None:
        """A model turn starts: its text and usage are collected from here."""
        self.state = RUNNING
        self._text = []
        self._usage = None
        self._reply_index = None
        self._reply_on_server = False
        self._reply_at = len(self.transcript)

    def audio_opening(self) -> wire.ClientMessage | None:
        """What must precede the user's audio now: ``activityStart`` when the client
        ends its turns itself (turn detection ``none``) and none is open yet."""
        if self.settings.manual_activity and not self._activity_open:
            self._activity_open = True
            return wire.ClientMessage(
                realtime_input=wire.RealtimeInput(activity_start=wire.ActivityMarker())
            )
        return None

    @property
    def audio_needs_opening(self) -> bool:
        return self.settings.manual_activity and not self._activity_open

    def commit(self) -> list[wire.ClientMessage]:
        """End the user's spoken turn (``activityEnd``, after an ``activityStart`` if none
        was sent); the model's turn begins."""
        out: list[wire.ClientMessage] = []
        if not self._activity_open:
            start = wire.RealtimeInput(activity_start=wire.ActivityMarker())
            out.append(wire.ClientMessage(realtime_input=start))
        self._activity_open = False
        self.begin_turn()
        end = wire.RealtimeInput(activity_end=wire.ActivityMarker())
        out.append(wire.ClientMessage(realtime_input=end))
        return out

    def function_output(self, call_id: str, output: str) -> None:
        name = self._calls.pop(call_id, None)
        # A NON_BLOCKING call's late response: the model tells it once it is idle.
        scheduling = "WHEN_IDLE" if name in self.settings.background else None
        self._outputs.append(
            wire.FunctionResponse(
                id=call_id, name=name, response={"output": output}, scheduling=scheduling
            )
        )

    def replace(self, text: str) -> None:
        """Make the last model turn read ``text`` (see ``Upstream.replace_response``)."""
        index = self._reply_index
        if index is not None:
            if self._reply_on_server and turn_text(self.transcript[index]) == text:
                return  # the server holds exactly this turn
            if text:
                self.transcript[index] = wire.text_content("model", text)
            else:
                del self.transcript[index]
                self._reply_index = None
            if self._reply_on_server:
                self._reply_on_server = False
                self.dirty = True
        elif text:
            # The server holds no text of that response: send it with the next request.
            self.transcript.insert(self._reply_at, wire.text_content("model", text))
            self._reply_index = self._reply_at

    # --- the model's turn ---------------------------------------------------------------

    def hot_part(self, message: wire.ServerMessage) -> wire.Part | None:
        """The message's one part when it is the running turn's and nothing else."""
        content = message.server_content
        if (
            content is not None
            and self.state == RUNNING
            and content.model_turn is not None
            and len(content.model_turn.parts) == 1
            and not (content.turn_complete or content.interrupted)
            and message.usage_metadata is None
            and message.go_away is None
            and message.error is None
        ):
            return content.model_turn.parts[0]
        return None

    def took_text(self, text: str) -> None:
        """The shell gave ``text`` of the running turn to the session (its fast path)."""
        self._text.append(text)

    def handle(self, message: wire.ServerMessage) -> list[UpstreamEvent]:
        """The session's events for one server message, in order."""
        content = message.server_content
        # The hot path: one text part of the running turn, and nothing else.
        part = self.hot_part(message)
        if part is not None and content is not None:
            if part.text and not part.thought:
                self._text.append(part.text)
                return [TextDelta(part.text)]
            if not part.text and part.inline_data is None and content.output_transcription is None:
                return []
            # Spoken output or a thought: the general path below.
        events: list[UpstreamEvent] = []
        if self.settings.voice is not None:
            self._voice_events(message, events)
        usage = message.usage_metadata
        if usage is not None and self.turn_running:
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
        update = message.session_resumption_update
        if update is not None and update.resumable and update.new_handle and not self.dirty:
            self.resume_handle = update.new_handle
            self.resume_position = self.covered
            events.append(Resumable(update.new_handle, self.covered))
        if message.go_away is not None:
            self.go_away = message.go_away.time_left or "unknown"
            log.info(
                "Gemini Live: goAway (timeLeft=%s): reconnecting after this turn", self.go_away
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
        return events

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
        if (model_output or message.tool_call is not None) and self.state == IDLE:
            # The server answers the user by itself (its VAD heard the end of speech).
            self._flush_heard(events)
            self.begin_turn()
            events.append(ResponseBegan())
        if content is not None and content.output_transcription is not None:
            text = content.output_transcription.text
            if text and self.state == RUNNING:
                self._text.append(text)
                events.append(Spoken(text))
        if message.tool_call is not None and self.state == RUNNING:
            for call in message.tool_call.function_calls or ():
                call_id = call.id or ""
                self._calls[call_id] = call.name or ""
                arguments = msgspec.json.encode(call.args or {}).decode()
                events.append(NativeCall(call_id, call.name or "", arguments))
            calls = message.tool_call.function_calls or ()
            if calls and all(call.name in self.settings.background for call in calls):
                return  # NON_BLOCKING: the model goes on; its turnComplete ends the turn
            self._end_turn(clean=True)
            events.append(ResponseDone(status="completed", usage=self._usage))

    def _flush_heard(self, events: list[UpstreamEvent]) -> None:
        """The user's spoken turn, heard whole: a ``Transcript``, a transcript turn."""
        if not self._heard:
            return
        text, self._heard = "".join(self._heard), []
        events.append(Transcript(text))
        held = self.sent == len(self.transcript)
        self.transcript.append(wire.text_content("user", text))
        if held:
            self.sent += 1  # the server heard it: it holds this turn

    def _content(self, content: wire.ServerContent, events: list[UpstreamEvent]) -> None:
        if content.model_turn is not None:
            for part in content.model_turn.parts:
                blob = part.inline_data
                if blob is not None and blob.data and self.state == RUNNING:
                    events.append(AudioDelta(blob.data, _rate(blob.mime_type)))
                    continue
                text = part.text
                if not text:
                    continue  # non-text parts are not output
                if part.thought:
                    if self.state == RUNNING:
                        events.append(Thought(text))  # the model's thinking, as it reports it
                    continue
                if self.state == RUNNING:
                    self._text.append(text)
                    events.append(TextDelta(text))
                elif self.state == CANCELLING:
                    # The rest of the frame's parts are ignored: the turn is stale now.
                    events.append(self.abandon("the model wrote past the point it was stopped at"))
        if content.interrupted:
            # In a voice session interruptions are barge-in: no reconnect (see the adapter).
            voice = self.settings.voice is not None
            if self.turn_running:
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
            self.state = IDLE
            self.dirty = self.dirty or not voice
        elif content.turn_complete:
            if self.turn_running:
                usage, estimated = self._turn_usage()
                self._end_turn(clean=True)
                events.append(ResponseDone(status="completed", usage=usage, estimated=estimated))
            self.state = IDLE  # a stale turn is over: the connection stays dirty

    # --- cancel -------------------------------------------------------------------------

    def cancel(self, unseen_text: bool) -> ResponseDone | None:
        """The session asks to stop the running turn (Gemini has no cancel).

        ``unseen_text``: text of the turn the session has not read yet (the
        model already wrote past the stop): the turn is abandoned at once.
        Otherwise None: wait (the shell bounds it) for the turn to end by itself.
        """
        if self.state != RUNNING:
            return None
        if unseen_text:
            return self.abandon("the model wrote past the point it was stopped at")
        self.state = CANCELLING
        return None

    def abandon(self, why: str) -> ResponseDone:
        """End a cancelled turn for the session while it still runs on the server."""
        usage, estimated = self._turn_usage()
        self._end_turn(clean=False)
        self.state = STALE
        return ResponseDone(
            status="cancelled",
            usage=usage,
            detail=f"{why} (Gemini Live has no cancel)",
            estimated=estimated,
        )

    def _end_turn(self, *, clean: bool) -> None:
        """Record the turn in the transcript; ``clean``: the server holds exactly its text."""
        self.state = IDLE
        text = "".join(self._text)
        if text:
            self.transcript.insert(self._reply_at, wire.text_content("model", text))
            self._reply_index = self._reply_at
            if clean:
                self.sent += 1  # == _reply_at + 1: the server holds it, after its request
                self._reply_on_server = True
        if clean:
            self.covered = self.sent
        else:
            self.dirty = True

    def _turn_usage(self) -> tuple[Usage, bool]:
        """The running turn's usage: as reported, or estimated (then True) from characters.

        Gemini reports usage only at the end of a turn; a turn the adapter stops
        waiting for (no cancel on Gemini) or that the server interrupted is still
        billed, so it is counted at about 4 characters a token: the context up to
        the request (instructions and transcript) in, the text received out.
        """
        if self._usage is not None:
            return self._usage, False
        context = len(self.instructions) + sum(
            len(turn_text(turn)) for turn in self.transcript[: self._reply_at]
        )
        output = sum(len(text) for text in self._text)
        return Usage(
            input=billed_tokens_estimate(context), output=billed_tokens_estimate(output)
        ), True
