"""A GPT-Live conversation as the adapter keeps it: pure state, no socket, no clock.

``GPTLive`` (``gateway.upstream.live``) is the I/O shell: it dials, sends what
this object puts in ``outbox``, feeds it every server event, and keeps the
one timer (``timer``). This object decides the rest, so its rules are tested
without sockets (``tests/upstream/test_live_conversation.py``). The facts it
relies on, with their sources, are in docs/providers.md ("GPT-Live"):

- **the start**: ``session.start`` with the model, the instructions, the
  startup history (``input``: at most 128 messages of one text part; the
  newest kept within a size budget), PCM16 24 kHz audio, the voice, and the
  delegation (``client`` by default): the session's ``LiveSettings``, written
  by ``gateway.upstream.live_setup``;
- **turns**: GPT-Live sends transcripts, never a turn boundary ("these events
  do not define complete turns"). A model turn begins when the session asks
  (``begin``) or when the model speaks unasked (``ResponseBegan``); it ends
  when the model has been quiet for a while (``quiet``, the shell's timer),
  as LiveKit's plugin reads it too. The caller's speech over the model's
  ends the model's turn (``SpeechBegan`` then ``ResponseDone`` ``cancelled``);
- **typed text**: the protocol takes no user text after the start; a typed
  message goes as ``session.commentary.append`` asking for a spoken answer
  (LiveKit's reading), long ones with their head as silent
  ``session.thinking.append`` context;
- **delegation** (``client``): a ``session.delegation.created`` names no tool
  and carries no task text, so it becomes a call of the session's delegation
  tool (one named ``delegate``, else the client's only one, else the
  session's only tool: ``live_setup.delegation_tool``) with
  ``{"task": <the caller's current turn>}``, given to the session when the
  turn ends (after the model's spoken acknowledgement); its output goes back as
  ``session.commentary.append`` with the delegation's id, and the model
  speaks it. With no such tool the delegation is answered at once, silently,
  that nothing can do it. (``responses``): the backend's ``response.event``
  stream is logged; a function call in it becomes a call of the gateway's
  tool, answered with ``response.item.create`` and ``response.create``;
- **cancel**: GPT-Live has none; a cancelled turn ends for the session at
  once and the model's speech is dropped until it falls quiet (``STALE``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from gateway.upstream import live_wire as wire
from gateway.upstream.base import (
    AudioDelta,
    NativeCall,
    ResponseBegan,
    ResponseDone,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    Transcript,
    UpstreamError,
    UpstreamEvent,
    VoiceConfig,
)
from gateway.upstream.live_setup import AUDIO_RATE, DELEGATE_TOOL, LiveSettings
from protocol.assembly import Message
from protocol.events import Usage

__all__ = [
    "APPEND_CHARS",
    "AUDIO_RATE",
    "DELEGATE_TOOL",
    "IDLE",
    "RUNNING",
    "STALE",
    "TYPED_PREFIX",
    "LiveConversation",
]

log = logging.getLogger("gateway.upstream.live")

APPEND_CHARS: Final = 1500
"""Characters per ``*.append`` command: the service caps each at 500 tokens, and 1500
characters stays under it at 3 characters a token (a conservative count)."""

TYPED_PREFIX: Final = (
    "The caller typed this message instead of saying it. Answer it aloud now, "
    "without repeating it:\n\n"
)
ASK_BARE: Final = "Answer the caller's last message aloud now."
DROPPED: Final = "The caller interrupted: this task was not done."
NO_BACKEND: Final = (
    "No backend can do this task in this session. Tell the caller it cannot be done here."
)

# Where the model's turn is.
IDLE: Final = 0  # no turn: the model is quiet, or speaks unasked (a server-driven turn begins)
RUNNING: Final = 1  # the session's turn: its speech is the answer
STALE: Final = 2  # cancelled for the session; its speech is dropped until it falls quiet

Timer = Literal["quiet", "answer"]

# Error codes a retry will not fix: a session falls back (if it can).
_NOT_RETRYABLE: Final = frozenset(
    {
        "invalid_api_key",
        "insufficient_quota",
        "model_not_found",
        "billing_hard_limit_reached",
        "account_deactivated",
        "unknown_parameter",
        "invalid_model",
    }
)
# ``session.closed`` reasons after which a new connection may go on.
RETRYABLE_CLOSES: Final = frozenset({"expired", "connection_lost"})


def _chunks(text: str, size: int) -> list[str]:
    return [text[at : at + size] for at in range(0, len(text), size)] or [""]


PAUSE_MS: Final = 200
"""A pause of at least this much on the session's timeline between two pieces of the
caller's transcript parts two utterances: the service gives each its own pieces, and a
piece need not start with a space, so one is put between them (``Hearing.add``)."""


class Hearing:
    """The caller's spoken turn so far: its transcript pieces and where it ends."""

    __slots__ = ("end_ms", "pieces", "speaking")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.speaking = False
        self.end_ms = 0

    def add(self, delta: str, start_ms: int, end_ms: int) -> None:
        """One more piece; after a pause, with a space unless one side has it already.

        Two utterances heard before the model answers are one turn, and without the
        space their words would run together ("…today.Call him")."""
        pieces = self.pieces
        if (
            pieces
            and delta
            and start_ms - self.end_ms >= PAUSE_MS
            and not pieces[-1][-1:].isspace()
            and not delta[0].isspace()
        ):
            pieces.append(" ")
        pieces.append(delta)
        self.end_ms = max(self.end_ms, end_ms)

    def take(self) -> str:
        """The turn, heard whole; the next one starts empty."""
        text, self.pieces, self.speaking = "".join(self.pieces), [], False
        return text


class LiveConversation:
    """One GPT-Live session's state (see the module docstring)."""

    def __init__(
        self,
        model: str,
        instructions: str,
        history: Sequence[Message],
        voice: VoiceConfig | None,
        *,
        delegation: Literal["client", "responses"] = "client",
        backend: wire.Delegation | None = None,
    ) -> None:
        self.settings = LiveSettings(
            model, instructions, tuple(history), voice, delegation, backend
        )
        self.outbox: list[wire.ClientEvent] = []
        self.state = IDLE
        self.started = False
        self.session_id = ""
        self.seconds = 0.0  # cumulative billable seconds, as last reported
        self._billed = 0.0  # of which the session was told (``ResponseDone.usage``)
        self.closed_reason = ""
        # The activity counter: bumped on every event that restarts the shell's timer.
        self.activity = 0
        self._said = False  # the running turn has output (speech or a delegation)
        self._typed: list[str] = []  # typed messages waiting for the next ``begin``
        self._hearing = Hearing()  # the caller's current spoken turn
        self._last_user = ""  # the caller's last turn (typed or heard): a delegation's task
        self._delegations: set[str] = set()  # client delegations not answered yet
        # Calls of the running turn, given to the session when it ends: the model
        # acknowledges a delegation aloud after making it, and that speech belongs
        # to the turn before its calls run.
        self._calls: list[NativeCall] = []
        self._responses_calls: dict[str, str] = {}  # call_id -> delegation (responses mode)
        self._responses_pending = False  # function outputs sent: a response.create is due
        self._answered = False  # outputs went as commentary: the next ``begin`` sends nothing
        self._event_ids = 0

    # --- the start --------------------------------------------------------------------

    def _eid(self) -> str:
        self._event_ids += 1
        return f"gw_{self._event_ids}"

    def start(self) -> wire.SessionStart:
        """The connection's first frame."""
        settings = self.settings
        last = next((m for m in reversed(settings.history) if m.role == "user" and m.content), None)
        if last is not None:
            self._last_user = last.content
        return settings.session_start(self._eid())

    # --- what the session asks --------------------------------------------------------

    @property
    def turn_running(self) -> bool:
        return self.state == RUNNING

    def add_message(self, message: Message) -> None:
        """A message after the start: typed user text waits for ``begin``; the rest is
        context (system: ``instructions.append``; assistant: silent ``thinking.append``)."""
        if not message.content:
            return
        if message.role == "user":
            self._typed.append(message.content)
        elif message.role == "assistant":
            self._append_thinking(f"You said earlier: {message.content}")
        else:
            for part in _chunks(message.content, APPEND_CHARS):
                self.outbox.append(
                    wire.InstructionsAppend(content=part, delegation_id=None, event_id=self._eid())
                )

    def add_context(self, message: Message) -> None:
        """A ``context`` message: as ``add_message``, but a user's is context too (what the
        caller said, told as thinking), not typed text for the next ``begin``."""
        if message.role == "user" and message.content:
            self._append_thinking(f"The caller said earlier: {message.content}")
        else:
            self.add_message(message)

    def _append_thinking(self, text: str, delegation_id: str | None = None) -> None:
        for part in _chunks(text, APPEND_CHARS):
            self.outbox.append(
                wire.ThinkingAppend(content=part, delegation_id=delegation_id, event_id=self._eid())
            )

    def begin(self) -> None:
        """The session asks for the model's answer: to the typed messages, to the
        delegations' results just returned, or to the last message of the history."""
        self._begin()
        if self._responses_pending:
            self._responses_pending = False
            self.outbox.append(wire.ResponseCreate(event_id=self._eid()))
            return
        if self._answered:
            self._answered = False
            return  # the results' commentary asks for the speech
        typed, self._typed = "\n\n".join(self._typed), []
        if not typed:
            self.outbox.append(
                wire.CommentaryAppend(content=ASK_BARE, delegation_id=None, event_id=self._eid())
            )
            return
        self._last_user = typed
        ask = TYPED_PREFIX + typed
        if len(ask) > APPEND_CHARS:
            cut = len(typed) - (APPEND_CHARS - len(TYPED_PREFIX))
            head, tail = typed[:cut], typed[cut:]
            self._append_thinking(f"The start of the caller's typed message: {head}")
            ask = TYPED_PREFIX + tail
        self.outbox.append(
            wire.CommentaryAppend(content=ask, delegation_id=None, event_id=self._eid())
        )

    def _begin(self) -> None:
        self.state = RUNNING
        self._said = False
        self.activity += 1

    def function_output(self, call_id: str, output: str) -> None:
        """A delegation's (or a backend call's) result, back the way GPT-Live takes it."""
        if call_id in self._responses_calls:
            del self._responses_calls[call_id]
            item = {"type": "function_call_output", "call_id": call_id, "output": output}
            self.outbox.append(wire.ResponseItemCreate(item=item, event_id=self._eid()))
            self._responses_pending = True
            return
        if call_id not in self._delegations:
            log.warning("GPT-Live: output for an unknown delegation %s dropped", call_id)
            return
        self._delegations.discard(call_id)
        parts = _chunks(output, APPEND_CHARS)
        for part in parts[:-1]:
            self._append_thinking(part, call_id)
        self.outbox.append(
            wire.CommentaryAppend(content=parts[-1], delegation_id=call_id, event_id=self._eid())
        )
        self._answered = True

    def _drop_calls(self) -> None:
        """The turn ended early: its delegations will not run; the model is told, silently."""
        calls, self._calls = self._calls, []
        for call in calls:
            self._delegations.discard(call.call_id)
            self._responses_calls.pop(call.call_id, None)
            if self.settings.delegation == "client":
                self._append_thinking(DROPPED, call.call_id)

    def _usage(self) -> Usage:
        """The billable seconds reported since the last turn ended (no tokens: GPT-Live
        is priced by duration)."""
        seconds, self._billed = self.seconds - self._billed, self.seconds
        return Usage(input=0, output=0, seconds=max(0.0, seconds))

    def cancel(self) -> ResponseDone | None:
        """Stop the running turn for the session (GPT-Live has no cancel)."""
        if self.state != RUNNING:
            return None
        self._drop_calls()
        self.state = STALE
        self.activity += 1
        return ResponseDone(
            status="cancelled",
            usage=self._usage(),
            detail="GPT-Live has no cancel: the rest of its speech is dropped",
        )

    # --- the timer --------------------------------------------------------------------

    @property
    def timer(self) -> Timer | None:
        """What the shell's timer waits for: the model falling ``quiet`` (a turn with
        output, or a cancelled one), or the first ``answer`` of a turn asked for."""
        if self.state == STALE or (self.state == RUNNING and self._said):
            return "quiet"
        if self.state == RUNNING:
            return "answer"
        return None

    def quiet(self) -> list[UpstreamEvent]:
        """The timer ran out: the turn is over (or never began)."""
        state = self.state
        self.state = IDLE
        self.activity += 1
        if state == STALE:
            return []
        if state == RUNNING and self._said:
            calls, self._calls = self._calls, []
            return [*calls, ResponseDone(status="completed", usage=self._usage())]
        if state == RUNNING:
            return [ResponseDone(status="incomplete", detail="GPT-Live did not answer in time")]
        return []

    # --- what the service says --------------------------------------------------------

    def handle(self, event: wire.AdapterEvent) -> list[UpstreamEvent]:
        """The session's events for one server event, in order (frames to send go to
        ``outbox``)."""
        match event:
            case wire.OutputAudioDelta():
                events = self._output()
                voice = self.settings.voice
                if self.state == RUNNING and voice is not None and voice.audio_out:
                    events.append(AudioDelta(event.delta, AUDIO_RATE))
                return events
            case wire.OutputTranscriptDelta():
                events = self._output()
                if self.state == RUNNING and event.delta:
                    events.append(Spoken(event.delta))
                return events
            case wire.InputTranscriptDelta():
                return self._heard_delta(event)
            case wire.DelegationCreated():
                return self._delegated(event)
            case wire.ResponseEvent():
                return self._response_event(event)
            case wire.SessionUsageUpdated():
                self.seconds = max(self.seconds, event.usage.seconds)
                return []
            case wire.SessionClosed():
                self.seconds = max(self.seconds, event.usage.seconds)
                self.closed_reason = event.reason
                return []
            case wire.ErrorEvent():
                error = event.error
                return [
                    UpstreamError(
                        code=error.code,
                        message=error.message,
                        retryable=error.code not in _NOT_RETRYABLE,
                    )
                ]
            case wire.SessionStarted():
                self.started = True
                self.session_id = event.session.id
                return []
        return []  # pragma: no cover - the union is exhausted above

    def _output(self) -> list[UpstreamEvent]:
        """The model speaks: a turn of its own begins if none runs (after the caller's
        turn, heard whole)."""
        self.activity += 1
        if self.state == STALE:
            return []
        events: list[UpstreamEvent] = []
        if self.state == IDLE:
            self._flush_heard(events)
            self._begin()
            events.append(ResponseBegan())
        self._said = True
        return events

    def _flush_heard(self, events: list[UpstreamEvent]) -> None:
        hearing = self._hearing
        if not hearing.speaking:
            return
        end, text = hearing.end_ms, hearing.take()
        events.append(SpeechEnded(end))
        if text:
            self._last_user = text
            events.append(Transcript(text))

    def _heard_delta(self, event: wire.InputTranscriptDelta) -> list[UpstreamEvent]:
        events: list[UpstreamEvent] = []
        hearing = self._hearing
        if not hearing.speaking:
            hearing.speaking = True
            if self.state == IDLE:
                events.append(SpeechBegan(event.start_ms))
            elif self.state == RUNNING and self._said:
                # The caller speaks over the model: its turn is over (barge-in).
                events.append(SpeechBegan(event.start_ms))
                events.append(
                    ResponseDone(
                        status="cancelled",
                        usage=self._usage(),
                        detail="the caller spoke over the model",
                    )
                )
                self._drop_calls()
                self.state = IDLE
                self.activity += 1
        hearing.add(event.delta, event.start_ms, event.end_ms)
        return events

    def _delegated(self, event: wire.DelegationCreated) -> list[UpstreamEvent]:
        delegation = event.delegation
        if delegation.target != "client":
            log.info(
                "GPT-Live: delegation %s to %s (its events follow as response.event)",
                delegation.id,
                delegation.target,
            )
            return []
        events = self._output()
        if self.state != RUNNING:
            # A cancelled turn's delegation: nobody will do it; say so silently.
            self._append_thinking(NO_BACKEND, delegation.id)
            return events
        tool = self.settings.delegate
        if tool is None:
            voice = self.settings.voice
            tools = voice.tools if voice is not None else ()
            log.warning(
                "GPT-Live delegated work (%s) but the session declares %s: declare one tool, "
                "or one named %r, to receive delegated tasks",
                delegation.id,
                f"{len(tools)} tools" if tools else "no tools",
                DELEGATE_TOOL,
            )
            self._append_thinking(NO_BACKEND, delegation.id)
            return events
        self._delegations.add(delegation.id)
        hearing = self._hearing
        task = "".join(hearing.pieces) if hearing.speaking else self._last_user
        arguments = msgspec.json.encode({"task": task}).decode()
        self._calls.append(NativeCall(delegation.id, tool.name, arguments))
        return events

    def _response_event(self, event: wire.ResponseEvent) -> list[UpstreamEvent]:
        """A Responses delegation's stream: logged; its function calls run as the gateway's."""
        inner = event.event
        kind = inner.get("type")
        log.debug("GPT-Live response.event %s (delegation %s)", kind, event.delegation_id)
        if kind != "response.output_item.done":
            return []
        item = inner.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call":
            return []
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            return []
        arguments = item.get("arguments")
        events = self._output()
        self._responses_calls[call_id] = event.delegation_id or ""
        self._calls.append(
            NativeCall(call_id, name, arguments if isinstance(arguments, str) else "{}")
        )
        return events
