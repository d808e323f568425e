"""The OpenAI door's conversation: OpenAI client events in, gateway commands out;
the gateway's logged events in, OpenAI server events out. Pure: no I/O, no clock.

One object per client connection (``gateway.edge.openai_door`` drives it).
Everything it emits for a logged event is derived from the log alone, with ids
made from the event's ``seq`` (``event_id`` ``evt_SEQ_N``, ``item_SEQ``,
``resp_SEQ``): a client that reconnects replays the log through a fresh
conversation and is sent only what follows the last ``event_id`` it saw.

The mapping (docs/openai-door.md):

- ``session.update`` → ``configure``; the logged ``configured`` → ``session.created``
  (the first) or ``session.updated``.
- ``conversation.item.create`` of a user message is held until ``response.create``,
  which sends it as the turn's ``user`` message; the logged ``user`` →
  ``conversation.item.added``/``done``.
- ``respond`` chunks → a response's message item with one text part
  (``response.output_text.delta``) or, for audio output, its transcript
  (``response.output_audio_transcript.delta``).
- a ``call`` the client runs (a tool it declared) → a ``function_call`` item, then
  ``response.done``; its ``function_call_output`` → ``tool_result``, and the
  gateway's turn goes on by itself (the ``response.create`` that follows opens
  nothing new). Calls that run in the gateway are not shown to the client.
- ``end`` + ``metric`` → ``response.done`` with usage; ``cancelled`` → a cancelled one; an
  ``error`` or a blocking ``guardrail`` → ``error`` (the client's ``event_id``, where known).
"""

from __future__ import annotations

import base64
import binascii
from collections import deque
from typing import Any

import msgspec

from protocol.configuration import InputAudio, SessionConfig
from protocol.events import (
    COMMAND_ID_MAX,
    AudioCleared,
    Call,
    Cancel,
    Cancelled,
    ClearAudio,
    Commit,
    Configure,
    Configured,
    End,
    Error,
    Event,
    Forget,
    Forgotten,
    Guardrail,
    Interrupt,
    Metric,
    Played,
    Respond,
    Session,
    SpeechStarted,
    SpeechStopped,
    Think,
    ToolResultMessage,
    Usage,
    User,
    UserMessage,
)
from protocol.openai_events import (
    BadEvent,
    ClientEvent,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
)
from protocol.openai_items import Spans
from protocol.openai_response import TOKEN_REFUSAL, ResponseOverrides, response_overrides
from protocol.openai_session import call_parts, config_change, session_of, usage_of

__all__ = ["KEPT_ITEMS", "Command", "Conversation", "Emit"]

KEPT_ITEMS = 256  # items conversation.item.retrieve can show (the newest)
_SHOWS_ITEM = frozenset(
    (
        "conversation.item.added",
        "conversation.item.done",
        "response.output_item.added",
        "response.output_item.done",
    )
)

ServerEvent = dict[str, Any]
Command = (
    UserMessage
    | Cancel
    | Configure
    | ToolResultMessage
    | Commit
    | Played
    | Forget
    | ClearAudio
    | bytes
)
"""A gateway command; ``bytes`` is user audio (a binary frame)."""


def _named(command: Command, eid: str) -> Command:
    """``command`` with the client's ``event_id`` as its ``id`` (a tool result's id is its
    call's; the door's own configures keep theirs)."""
    if isinstance(command, bytes | ToolResultMessage) or command.id is not msgspec.UNSET:
        return command
    return msgspec.structs.replace(command, id=eid)


class Emit(msgspec.Struct, frozen=True):
    """What one client event yields: commands for the session, events for the client."""

    commands: list[Command]
    events: list[ServerEvent]


class _Response:
    """The response being streamed: its id, its items so far, its open message."""

    __slots__ = ("audio", "first", "id", "last", "message", "metadata", "output", "text")

    def __init__(self, rid: str) -> None:
        self.id = rid
        self.audio = False  # audio of its open message was sent
        self.output: list[dict[str, Any]] = []
        self.message: str | None = None  # the open message item's id
        self.text: list[str] = []
        self.first = self.last = 0  # seqs of the open message's first and last chunks
        self.metadata: dict[str, str] | None = None  # response.create's, echoed


class Conversation:
    """One OpenAI client's view of one session (see the module docstring)."""

    def __init__(
        self, sid: str, model: str, *, audio_out: bool = False, input_rate: int = 24000
    ) -> None:
        """``input_rate``: the rate of the client's audio (24 kHz PCM16 on a WebSocket;
        a WebRTC call's microphone is decoded at 48 kHz and goes in as it is, so the
        gateway converts it once, to the provider's rate)."""
        self.sid = sid
        self.model = model
        self.audio_out = audio_out
        self.input_rate = input_rate
        self._held: list[str] = []  # user text created, not yet sent (response.create sends)
        self._response: _Response | None = None
        self._ending = False
        self._continues = False  # a tool output went back: the gateway's turn goes on
        self._created = False  # session.created sent
        self._client_calls: set[str] = set()
        self._last_item: str | None = None
        self._pending_reply: str | None = None  # event_id of the command an error answers
        self._named: deque[str] = deque(maxlen=64)  # event_ids sent on as command ids
        self._unlogged = 0
        self._seq = 0
        self._n = 0
        self._turn = 0  # seq of the turn's user event: responses' and messages' ids
        self._responses = 0  # responses of this turn so far
        self._speech: str | None = None  # the spoken user item being heard
        self._hearing = False  # input audio configured
        self._audio_tag = 0  # seq tag of the newest audio frame of the answer
        # The newest items as last shown (``…item.added``/``done``), for conversation.item.retrieve.
        self._items: dict[str, dict[str, Any]] = {}
        self._spans = Spans(KEPT_ITEMS)  # what conversation.item.delete names (``forget``)
        # Per-response overrides (``protocol.openai_response``); their ``due`` configures
        # are the shell's to send (``take_due``).
        self.overrides = ResponseOverrides()

    # ------------------------------------------------------------ ids

    def _eid(self) -> str:
        if self._seq == 0:
            self._unlogged += 1
            return f"evt_x{self._unlogged}"
        self._n += 1
        return f"evt_{self._seq}_{self._n}"

    @staticmethod
    def position(event_id: str) -> tuple[int, int] | None:
        """``(seq, n)`` of a logged event's ``event_id``; None for any other id."""
        parts = event_id.split("_")
        if len(parts) != 3 or parts[0] != "evt" or not (parts[1] + parts[2]).isdecimal():
            return None
        return int(parts[1]), int(parts[2])

    def _ev(self, kind: str, **fields: Any) -> ServerEvent:
        return {"type": kind, "event_id": self._eid(), **fields}

    def error(self, message: str, *, code: str = "invalid_request_error", **kw: Any) -> ServerEvent:
        """An ``error`` event (unlogged): OpenAI's shape."""
        error = {
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "event_id": kw.get("event_id"),
            "param": kw.get("param"),
        }
        return self._unlogged_ev("error", error=error)

    def _unlogged_ev(self, kind: str, **fields: Any) -> ServerEvent:
        """An event of no logged event (a reply): its id is ``evt_xN``."""
        seq, self._seq = self._seq, 0
        try:
            return self._ev(kind, **fields)
        finally:
            self._seq = seq

    def rate_limits(self, limits: list[tuple[str, int, int, float]]) -> ServerEvent:
        """``rate_limits.updated`` (unlogged): ``(name, limit, remaining, reset_seconds)``."""
        return self._ev(
            "rate_limits.updated",
            rate_limits=[
                {"name": n, "limit": lim, "remaining": left, "reset_seconds": round(reset, 3)}
                for n, lim, left, reset in limits
            ],
        )

    def created(self, config: SessionConfig) -> ServerEvent:
        """``session.created`` for a session configured before this connection (unlogged)."""
        self._created = True
        self.overrides.config = config
        self.audio_out = config.output == "audio"
        return self._ev("session.created", session=session_of(config, self.sid, self.model))

    # ------------------------------------------------------------ client → session

    def client(self, event: ClientEvent | BadEvent, *, model_route: tuple[str, str]) -> Emit:
        """One client event: the commands to send and the events to answer with now."""
        if isinstance(event, BadEvent):
            return Emit([], [self.error(event.message, event_id=event.event_id, param=event.param)])
        emit = self._client(event, model_route)
        if any(not isinstance(c, bytes) for c in emit.commands):
            self._pending_reply = event.event_id  # an error that answers it names it
            eid = event.event_id
            if eid and len(eid) <= COMMAND_ID_MAX:
                # The gateway's command id is the client's event_id: its error's
                # reply_to says which event it answers, even with several in flight.
                self._named.append(eid)
                emit = Emit([_named(c, eid) for c in emit.commands], emit.events)
        return emit

    def _client(self, event: ClientEvent, model_route: tuple[str, str]) -> Emit:
        eid = event.event_id
        match event:
            case SessionUpdate(session=body):
                if body.model not in (None, self.model):
                    return self._refusal(
                        "session.model cannot change on this connection: choose the model "
                        "with ?model= when connecting",
                        eid,
                        "session.model",
                    )
                change = config_change(body, model_route=None)  # routed at connect
                if isinstance(change, str):
                    return self._refusal(change, eid, "session")
                if change.input_audio is not msgspec.UNSET:
                    self._hearing = True
                    if change.input_audio is not None and self.input_rate != 24000:
                        heard = msgspec.structs.replace(change.input_audio, rate=self.input_rate)
                        change = msgspec.structs.replace(change, input_audio=heard)
                self._pending_reply = eid
                return Emit([change], [])
            case ConversationItemCreate(item=item, previous_item_id=previous):
                if previous is not None and previous != self._last_item:
                    return self._refusal(
                        "items are appended to the end of the conversation on this gateway: "
                        "leave previous_item_id unset (or the last item's id)",
                        eid,
                        "previous_item_id",
                    )
                return self._item(item, eid)
            case ResponseCreate(response=body):
                made = response_overrides(body) if body else None
                if isinstance(made, tuple):
                    return self._refusal(made[0], eid, made[1])
                if made is not None and made.change is not None and not self.overrides.allowed:
                    return self._refusal(TOKEN_REFUSAL, eid, "response")
                if made is not None:
                    self.overrides.metadata = made.metadata
                if self._held:
                    text = "\n".join(self._held)
                    self._held = []
                    self._pending_reply = eid
                    if made is None or made.change is None:
                        return Emit([UserMessage(content=text)], [])
                    self.overrides.start(made.change)
                    return Emit([made.change, UserMessage(content=text)], [])
                if made is not None and made.change is not None:
                    return self._refusal(
                        "instructions, tools and output of a response are set with the user "
                        "message that starts it on this gateway: after a function_call_output "
                        "the answer goes on with the session's; send response.create without "
                        "them",
                        eid,
                        "response",
                    )
                if self._continues:
                    self._continues = False  # the gateway's turn already goes on
                    return Emit([], [])
                return self._refusal(
                    "response.create needs a user message first on this gateway "
                    "(conversation.item.create with role 'user'), or a function_call_output",
                    eid,
                )
            case ResponseCancel():
                return Emit([Cancel()], [])
            case InputAudioBufferAppend(audio=audio):
                try:
                    pcm = base64.b64decode(audio, validate=True)
                except (binascii.Error, ValueError):
                    return self._refusal("audio is not base64", eid, "audio")
                return self.speech_in(pcm)
            case InputAudioBufferCommit():
                return Emit([Commit()], [])
            case ConversationItemTruncate(item_id=item_id, content_index=index, audio_end_ms=ms):
                # What the listener heard: the gateway cuts the provider's copy there.
                truncated = self._ev(
                    "conversation.item.truncated",
                    item_id=item_id,
                    content_index=index,
                    audio_end_ms=ms,
                )
                return Emit([Played(seq=self._audio_tag, ms=max(0, ms))], [truncated])
            case OutputAudioBufferClear():
                return Emit([], [])  # the client's own playback buffer: nothing is held here
            case ConversationItemRetrieve(item_id=item_id):
                shown = self._items.get(item_id)
                if shown is None:
                    return self._refusal(
                        f"no item {item_id[:64]!r} in this conversation (or it is older than "
                        f"its newest {KEPT_ITEMS} items): pass the id of an item it was sent",
                        eid,
                        "item_id",
                    )
                return Emit([], [self._ev("conversation.item.retrieved", item=shown)])
            case ConversationItemDelete(item_id=item_id):
                return self._delete(item_id, eid)
            case InputAudioBufferClear():
                if not self._hearing:  # no audio was taken: nothing to discard
                    return Emit([], [self._unlogged_ev("input_audio_buffer.cleared")])
                return Emit([ClearAudio()], [])
        return self._refusal("unsupported event", eid)  # pragma: no cover - the match is total

    def _delete(self, item_id: str, eid: str | None) -> Emit:
        span = self._spans.get(item_id)
        if span is not None:
            return Emit([Forget(first=span[0], last=span[1])], [])
        if item_id in self._items:
            return self._refusal(
                f"item {item_id[:64]!r} cannot be deleted on this gateway: function calls "
                "(and their outputs) stay in the model's context; delete the messages "
                "around them",
                eid,
                "item_id",
            )
        return Emit(
            [],
            [
                self.error(
                    f"Item with id {item_id[:64]!r} not found (in the newest {KEPT_ITEMS} items "
                    "of this conversation): pass the id of a message it was sent",
                    code="item_not_found",
                    event_id=eid,
                    param="item_id",
                )
            ],
        )

    def _forgotten(self, first: int, last: int) -> list[ServerEvent]:
        self._pending_reply = None
        gone = self._spans.gone(first, last)
        for iid in gone:
            self._items.pop(iid, None)
        if self._last_item in gone:
            self._last_item = next(reversed(self._items), None)
        return [self._ev("conversation.item.deleted", item_id=iid) for iid in gone]

    def take_due(self) -> list[Command]:
        """Commands the conversation asks the shell to send now, ahead of the client's next
        (a response's overrides taken back once it is done)."""
        due, self.overrides.due = self.overrides.due, []
        return list(due)

    @property
    def hearing(self) -> bool:
        """Input audio is configured: an append is the user's audio and nothing more
        (the door's read callback relays it without a task: ``DoorConnection``)."""
        return self._hearing

    def speech_in(self, pcm16: bytes) -> Emit:
        """The user's audio at ``input_rate`` (an append's, or a WebRTC microphone's)."""
        commands: list[Command] = []
        if not self._hearing:  # OpenAI hears with server VAD unless told otherwise
            self._hearing = True
            commands.append(Configure(input_audio=InputAudio(rate=self.input_rate)))
        commands.append(pcm16)
        return Emit(commands, [])

    def _refusal(self, message: str, eid: str | None, param: str | None = None) -> Emit:
        return Emit([], [self.error(message, event_id=eid, param=param)])

    def _item(self, item: Any, eid: str | None) -> Emit:
        if item.id is not None:
            return self._refusal(
                "item ids are given by this gateway (they come from its log, so a resumed "
                "client sees the same ones): leave item.id unset",
                eid,
                "item.id",
            )
        if item.type == "function_call_output":
            call = item.call_id or ""
            if call not in self._client_calls:
                return self._refusal(
                    f"no function call {call[:80]!r} is waiting for its output", eid, "item.call_id"
                )
            self._client_calls.discard(call)
            self._continues = True
            return Emit(
                [ToolResultMessage(id=call, status="success", content=item.output or "")], []
            )
        if item.type != "message" or item.role != "user":
            return self._refusal(
                "this gateway takes user messages and function_call_output items from a "
                "client (the instructions are set with session.update)",
                eid,
                "item",
            )
        texts: list[str] = []
        for part in item.content or []:
            if part.type != "input_text" or part.text is None:
                return self._refusal(
                    f"content of type {part.type[:40]!r} is not supported: send input_text",
                    eid,
                    "item.content",
                )
            texts.append(part.text)
        self._held.append("".join(texts))
        return Emit([], [])

    # ------------------------------------------------------------ session → client

    def gateway(self, event: Event) -> list[ServerEvent]:
        """The OpenAI events one gateway event becomes (none for many)."""
        # The stream's hot path, most logged events: a chunk of an answer whose message
        # is open becomes one delta event (``_gateway`` makes the same, in more steps);
        # reasoning is not shown.
        if isinstance(event, Respond):
            resp = self._response
            if resp is not None and resp.message is not None and event.seq:
                content = event.content
                resp.text.append(content)
                resp.last = event.seq  # the message's span, for conversation.item.delete
                return [
                    {
                        "type": "response.output_audio_transcript.delta"
                        if self.audio_out
                        else "response.output_text.delta",
                        "event_id": f"evt_{event.seq}_1",
                        "response_id": resp.id,
                        "item_id": resp.message,
                        "output_index": len(resp.output) - 1,
                        "content_index": 0,
                        "delta": content,
                    }
                ]
        elif isinstance(event, Think):
            return []
        self._seq, self._n = event.seq, 0
        try:
            events = self._gateway(event)
        finally:
            self._seq = 0
        self._remember(events)
        return events

    def _remember(self, events: list[ServerEvent]) -> None:
        """Keep the items ``events`` show, for ``conversation.item.retrieve``."""
        items = self._items
        for ev in events:
            if ev["type"] in _SHOWS_ITEM:
                item = ev["item"]
                items.pop(item["id"], None)
                items[item["id"]] = item
                if len(items) > KEPT_ITEMS:
                    del items[next(iter(items))]

    def _gateway(self, event: Event) -> list[ServerEvent]:
        if type(event) is Guardrail and (blocked := event.refusal()):  # as a bad request is
            self.overrides.put_back()  # the response it would have started never did
            return [self.error(blocked, code="guardrail_blocked", event_id=event.reply_to or None)]
        match event:
            case Session():
                return []
            case Configured(config=config, reply_to=ref):
                self.audio_out = config.output == "audio"
                self._hearing = config.input_audio is not None
                if self.overrides.configured(config, ref):
                    return []  # one response's overrides, or the session's own back
                kind = "session.updated" if self._created else "session.created"
                self._created = True
                self._pending_reply = None
                return [self._ev(kind, session=session_of(config, self.sid, self.model))]
            case SpeechStarted(offset_ms=ms):
                self._speech = f"item_{event.seq}"
                out = self._done("cancelled", reason="turn_detected") if self._response else []
                return [
                    *out,
                    self._ev(
                        "input_audio_buffer.speech_started", audio_start_ms=ms, item_id=self._speech
                    ),
                ]
            case SpeechStopped(offset_ms=ms):
                iid = self._speech or f"item_{event.seq}"
                self._speech = iid
                return [self._ev("input_audio_buffer.speech_stopped", audio_end_ms=ms, item_id=iid)]
            case User(content=content, source=source):
                return self._user(event.seq, content, spoken=source == "audio")
            case Forgotten(first=first, last=last):
                return self._forgotten(first, last)
            case AudioCleared():
                return [self._unlogged_ev("input_audio_buffer.cleared")]
            case Respond(content=content):
                out = self._open_message()
                resp = self._response
                assert resp is not None and resp.message is not None
                resp.text.append(content)
                resp.last = event.seq
                if not resp.first:
                    resp.first = event.seq
                kind = (
                    "response.output_audio_transcript.delta"
                    if self.audio_out
                    else "response.output_text.delta"
                )
                out.append(self._ev(kind, **self._where(resp, resp.message), delta=content))
                return out
            case Call(runs_on="client"):
                return self._client_call(event)
            case End():
                self._ending = True
                self.overrides.put_back()  # the turn is over (also one that showed nothing)
                return []
            case Metric(step=usage):
                if not self._ending or self._response is None:
                    self._ending = False
                    return []
                return self._done("completed", usage=usage)
            case Interrupt(content=content):
                # The turn broke (a node died, the provider dropped) and is run again: the
                # partial response fails, and the rerun is a new response, so no text twice.
                if self._response is None:
                    return []
                return self._done("failed", error=content or "interrupted; the turn runs again")
            case Cancelled(reason=why):
                self.overrides.put_back()
                if self._response is None:
                    return []
                reason = "turn_detected" if why == "barge_in" else "client_cancelled"
                return self._done("cancelled", reason=reason)
            case Error(code=code, content=content, reply_to=ref):
                if self._response is None:
                    self.overrides.put_back()  # the response with overrides never started
                reply, self._pending_reply = self._pending_reply, None
                if isinstance(ref, str) and ref in self._named:
                    reply = ref
                out = [self.error(content, code=code, event_id=reply)]
                if self._response is not None and event.seq:
                    out = [*self._done("failed", error=content), *out]
                return out
        return []

    def _user(self, seq: int, content: str, *, spoken: bool) -> list[ServerEvent]:
        self._pending_reply = None
        self._turn, self._responses = seq, 0
        iid = (self._speech if spoken else None) or f"item_{seq}"
        self._speech = None
        part = (
            {"type": "input_audio", "transcript": content}
            if spoken
            else {"type": "input_text", "text": content}
        )
        item = {
            "id": iid,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [part],
        }
        prev = self._last_item
        self._last_item = iid
        self._spans.add(iid, seq, seq)
        out: list[ServerEvent] = []
        if spoken:
            out.append(self._ev("input_audio_buffer.committed", item_id=iid, previous_item_id=prev))
        out += [
            self._ev("conversation.item.added", item=item, previous_item_id=prev),
            self._ev("conversation.item.done", item=item, previous_item_id=prev),
        ]
        if spoken:
            # The provider's transcript comes whole (it is logged once, with the user's
            # turn): a client that shows transcription deltas gets it as one delta.
            out.append(
                self._ev(
                    "conversation.item.input_audio_transcription.delta",
                    item_id=iid,
                    content_index=0,
                    delta=content,
                )
            )
            out.append(
                self._ev(
                    "conversation.item.input_audio_transcription.completed",
                    item_id=iid,
                    content_index=0,
                    transcript=content,
                    usage={"type": "duration", "seconds": 0},
                )
            )
        return out

    def audio(self, tag: int, pcm16: bytes) -> list[ServerEvent]:
        """A piece of the model's speech (not logged: its events have unlogged ids)."""
        self._seq, self._n = 0, 0
        self._audio_tag = max(self._audio_tag, tag)
        out = self._open_message()
        self._remember(out)  # speech can open the answer's message before its text does
        resp = self._response
        assert resp is not None and resp.message is not None
        resp.audio = True
        delta = base64.b64encode(pcm16).decode()
        out.append(
            self._ev("response.output_audio.delta", **self._where(resp, resp.message), delta=delta)
        )
        return out

    def _where(self, resp: _Response, item_id: str) -> dict[str, Any]:
        return {
            "response_id": resp.id,
            "item_id": item_id,
            "output_index": len(resp.output) - 1,
            "content_index": 0,
        }

    def _start(self) -> list[ServerEvent]:
        if self._response is not None:
            return []
        self._ending = False
        self._responses += 1
        resp = self._response = _Response(f"resp_{self._turn}_{self._responses}")
        resp.metadata, self.overrides.metadata = self.overrides.metadata, None
        return [self._ev("response.created", response=self._resp_body(resp, "in_progress"))]

    def _resp_body(
        self, resp: _Response, status: str, details: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": resp.id,
            "object": "realtime.response",
            "status": status,
            "output": list(resp.output),
            "output_modalities": ["audio" if self.audio_out else "text"],
            "conversation_id": self.sid,
        }
        if resp.metadata is not None:
            body["metadata"] = resp.metadata
        if details is not None:
            body["status_details"] = details
        return body

    def _message_item(self, resp: _Response, status: str) -> dict[str, Any]:
        text = "".join(resp.text)
        part = (
            {"type": "output_audio", "transcript": text}
            if self.audio_out
            else {"type": "output_text", "text": text}
        )
        return {
            "id": resp.message,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [part] if status == "completed" else [],
        }

    def _open_message(self) -> list[ServerEvent]:
        out = self._start()
        resp = self._response
        assert resp is not None
        if resp.message is not None:
            return out
        iid = resp.message = f"msg_{resp.id.removeprefix('resp_')}_{len(resp.output)}"
        resp.text = []
        resp.first = resp.last = 0
        item = self._message_item(resp, "in_progress")
        resp.output.append(item)
        prev = self._last_item
        self._last_item = iid
        part = (
            {"type": "audio", "transcript": ""} if self.audio_out else {"type": "text", "text": ""}
        )
        out += [
            self._ev(
                "response.output_item.added",
                response_id=resp.id,
                output_index=len(resp.output) - 1,
                item=item,
            ),
            self._ev("conversation.item.added", item=item, previous_item_id=prev),
            self._ev("response.content_part.added", **self._where(resp, iid), part=part),
        ]
        return out

    def _close_message(self) -> list[ServerEvent]:
        resp = self._response
        if resp is None or resp.message is None:
            return []
        iid = resp.message
        text = "".join(resp.text)
        where = self._where(resp, iid)
        item = self._message_item(resp, "completed")
        resp.output[-1] = item
        resp.message = None
        if resp.first:
            self._spans.add(iid, resp.first, resp.last)
        done: list[ServerEvent] = []
        if self.audio_out:
            if resp.audio:
                done.append(self._ev("response.output_audio.done", **where))
            done.append(self._ev("response.output_audio_transcript.done", **where, transcript=text))
            part = {"type": "audio", "transcript": text}
        else:
            done.append(self._ev("response.output_text.done", **where, text=text))
            part = {"type": "text", "text": text}
        return [
            *done,
            self._ev("response.content_part.done", **where, part=part),
            self._ev(
                "response.output_item.done",
                response_id=resp.id,
                output_index=where["output_index"],
                item=item,
            ),
            self._ev("conversation.item.done", item=item),
        ]

    def _client_call(self, call: Call) -> list[ServerEvent]:
        out = self._start()
        out += self._close_message()
        resp = self._response
        assert resp is not None
        iid = f"fc_{self._seq}"
        name, arguments = call_parts(call.content)
        item = {
            "id": iid,
            "object": "realtime.item",
            "type": "function_call",
            "status": "in_progress",
            "name": name,
            "call_id": call.id,
            "arguments": "",
        }
        resp.output.append(item)
        index = len(resp.output) - 1
        prev = self._last_item
        self._last_item = iid
        done_item = {**item, "status": "completed", "arguments": arguments}
        resp.output[-1] = done_item
        self._client_calls.add(call.id)
        where = {"response_id": resp.id, "item_id": iid, "output_index": index, "call_id": call.id}
        out += [
            self._ev(
                "response.output_item.added", response_id=resp.id, output_index=index, item=item
            ),
            self._ev("conversation.item.added", item=item, previous_item_id=prev),
            self._ev("response.function_call_arguments.delta", **where, delta=arguments),
            self._ev(
                "response.function_call_arguments.done", **where, name=name, arguments=arguments
            ),
            self._ev(
                "response.output_item.done", response_id=resp.id, output_index=index, item=done_item
            ),
            self._ev("conversation.item.done", item=done_item),
        ]
        # As OpenAI's does, the response ends at the call; the turn's rest is another one.
        out += self._done("completed")
        return out

    def _done(
        self,
        status: str,
        *,
        usage: Usage | None = None,
        reason: str | None = None,
        error: str | None = None,
    ) -> list[ServerEvent]:
        out = self._close_message()
        resp = self._response
        if resp is None:
            return out
        self._response = None
        self._ending = False
        self.overrides.put_back()
        details: dict[str, Any] = {"type": status}
        if reason is not None:
            details["reason"] = reason
        if error is not None:
            details["error"] = {"type": "server_error", "message": error}
        body = self._resp_body(resp, status, details)
        if usage is not None:
            body["usage"] = usage_of(usage)
        out.append(self._ev("response.done", response=body))
        return out
