"""The OpenAI door's conversation: OpenAI client events in, gateway commands out;
the gateway's logged events in, OpenAI server events out. Pure: no I/O, no clock.

One object per client connection (``gateway.edge.openai_door`` drives it). Everything
it emits for a logged event is derived from the log alone, with ids made from the
event's ``seq`` (``evt_SEQ_N``, ``item_SEQ``, ``resp_SEQ``): a client that reconnects
replays the log through a fresh conversation and is sent what follows its last event.

Its rooms: this module is the session → client half (its hot path, a chunk of an open
message, is one delta event) and the object the door and ``CallConversation`` call;
what a client event asks of the session is ``protocol.openai_requests``; the ids,
``protocol.openai_ids``; the items shown (retrieved, deleted), ``protocol.openai_items``.

The mapping, whole, is docs/openai-door.md's "The mapping": ``session.update`` →
``configure`` (``configured`` → ``session.created``/``updated``); a user message is
shown, held until ``response.create`` sends it as the turn's ``user`` (none held: a
``reply``), a system or assistant message as ``context``; ``respond`` chunks → a message
item; a ``call`` the client runs → a ``function_call`` item and ``response.done``, its
output → ``tool_result`` (``result`` → the output item) and the turn goes on by itself;
``end`` + ``metric`` → ``response.done``; ``cancelled`` → a cancelled one."""

from __future__ import annotations

from typing import Any

from protocol.configuration import SessionConfig
from protocol.events import (
    AudioCleared,
    Call,
    Cancelled,
    Configured,
    Context,
    End,
    Error,
    Event,
    Forgotten,
    Guardrail,
    Interrupt,
    Metric,
    Replying,
    Respond,
    Result,
    Session,
    SpeechStarted,
    SpeechStopped,
    Think,
    Usage,
    User,
)
from protocol.openai_events import BadEvent, ClientEvent, ServerEvent
from protocol.openai_ids import EventIds, position
from protocol.openai_items import (
    CREATED,
    KEPT_ITEMS,
    ShownItems,
    answer_item,
    call_item,
    output_item,
    text_item,
    user_shown,
)
from protocol.openai_requests import (
    BUSY,
    BUSY_CODE,
    NOT_ACTIVE,
    NOT_ACTIVE_CODE,
    ClientRequests,
    Command,
    Emit,
)
from protocol.openai_response import ResponseOverrides, ShownResponse
from protocol.openai_session import call_parts, output_of, session_of, usage_of
from protocol.openai_speech import EarlySpeech

__all__ = ["KEPT_ITEMS", "Command", "Conversation", "Emit", "ServerEvent"]


class Conversation:
    """One OpenAI client's view of one session (see the module docstring)."""

    position = staticmethod(position)  # ``(seq, n)`` of a logged event's ``event_id``

    def __init__(
        self,
        sid: str,
        model: str,
        *,
        audio_out: bool = False,
        input_rate: int = 24000,
        connection_id: str = "c",
    ) -> None:
        """``input_rate``: the client's audio's (24 kHz PCM16 on a WebSocket; a WebRTC call's
        microphone is decoded at 48 kHz and converted once, to the provider's rate).
        ``connection_id``: unique to the client's connection, in the ids made for its items."""
        self.sid = sid
        self.model = model
        self.audio_out = audio_out
        self._response: ShownResponse | None = None
        self._ending = False
        self._created = False  # session.created sent
        self._items_early: list[ServerEvent] = []  # created before it: shown after it
        self._turn = 0  # seq of the turn's user event: responses' and messages' ids
        self._responses = 0  # responses of this turn so far
        self._speech: str | None = None  # the spoken user item being heard
        # The newest logged seq translated: a reply to the client's own frame (an
        # ``error`` not logged) carries the seq the client has, never a newer one.
        self._logged = 0
        self.ids = EventIds()
        self.shown = ShownItems()  # for conversation.item.retrieve and .delete
        # Per-response overrides (``protocol.openai_response``); their ``due`` configures
        # are the shell's to send (``take_due``).
        self.overrides = ResponseOverrides()
        self.requests = ClientRequests(
            model, input_rate, self.ids, self.shown, self.overrides, f"item_{connection_id}_"
        )
        self._early = EarlySpeech()  # speech ahead of its event (``protocol.openai_speech``)

    def error(self, message: str, *, code: str = "invalid_request_error", **kw: Any) -> ServerEvent:
        """An ``error`` event (unlogged): OpenAI's shape."""
        return self.ids.error(message, code=code, **kw)

    def release(self) -> None:
        """The connection ended: its kept items go now, not at a node's rare full
        collection (a closed connection is a cycle; 270 items of 990 KB held 2 GB)."""
        self.shown.clear()

    def created(self, config: SessionConfig) -> ServerEvent:
        """``session.created`` for a session configured before this connection (unlogged)."""
        self._created = True
        self.overrides.config = config
        self.audio_out = config.output == "audio"
        return self.ids.event("session.created", session=session_of(config, self.sid, self.model))

    # ------------------------------------------------------------ client → session

    def client(self, event: ClientEvent | BadEvent, *, model_route: tuple[str, str]) -> Emit:
        """One client event: the commands to send and the events to answer with now
        (``protocol.openai_requests``)."""
        emit = self.requests.take(event, model_route=model_route)
        if self._created or not emit.events or emit.events[0]["type"] != CREATED[0]:
            return emit
        # A message created before session.created is shown after it, as OpenAI's
        # service, which sends session.created first of all, shows it.
        self._items_early += emit.events
        return Emit(emit.commands, [])

    @property
    def due(self) -> bool:
        """The conversation has commands for the shell to send (``take_due``)."""
        return bool(self.overrides.due or self.requests.typed.due)

    def take_due(self) -> list[Command]:
        """Commands the conversation asks the shell to send now, ahead of the client's next
        (a response's overrides taken back once it is done, messages held for a turn's end)."""
        due: list[Command] = [*self.overrides.due, *self.requests.typed.due]
        self.overrides.due, self.requests.typed.due = [], []
        return due

    @property
    def answering(self) -> bool:
        """A response is shown in progress (its ``response.created`` was sent)."""
        return self._response is not None

    @property
    def hearing(self) -> bool:
        """Input audio is configured: an append is the user's audio and nothing more
        (the door's read callback relays it without a task: ``DoorConnection``)."""
        return bool(self.requests.hearing)

    def speech_in(self, pcm16: bytes) -> Emit:
        """The user's audio at ``input_rate`` (an append's, or a WebRTC microphone's)."""
        return self.requests.speech_in(pcm16)

    # ------------------------------------------------------------ session → client

    def gateway(self, event: Event) -> list[ServerEvent]:
        """The OpenAI events one gateway event becomes (none for many)."""
        # The stream's hot path, most logged events: a chunk of an answer whose message
        # is open becomes one delta event (``_gateway`` makes the same, in more steps);
        # reasoning is not shown.
        if isinstance(event, Respond):
            resp, ids = self._response, self.ids
            if resp is not None and resp.message is not None and event.seq and not self._early.held:
                content = event.content
                resp.text.append(content)
                resp.last = event.seq  # the message's span, for conversation.item.delete
                self._logged, ids.last_seq, ids.last_n = event.seq, event.seq, 1
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
        elif isinstance(event, Think):  # not shown, but logged: speech may be tagged with it
            self._logged = max(self._logged, event.seq)
            return self._speak(self._logged) if self._early.held else []
        # Speech tagged with an event not shown (the first frame) goes before the next one.
        before = self._speak(event.seq - 1) if self._early.held else []
        ids = self.ids
        ids.seq, ids.n = event.seq, 0
        reply = type(event) is Error and event.seq <= self._logged
        if event.seq > self._logged:
            self._logged = event.seq
        if reply:  # the running response goes on: only a logged error ends it
            ids.seq = 0
        try:
            events = self._gateway(event)
        finally:
            ids.seq = 0
        self.shown.remember(events)
        events = before + events if before else events
        if self._early.held:  # speech that waited for this event
            events += self._speak(self._logged)
        return events

    def _gateway(self, event: Event) -> list[ServerEvent]:
        typed = self.requests.typed
        if type(event) is Guardrail and (blocked := event.refusal()):  # as a bad request is
            ref = event.reply_to
            if ref not in typed.contexts:  # a context starts no response
                self.overrides.put_back()  # the response it would have started never did
            named = ref if isinstance(ref, str) and ref in self.requests.named else None
            out = [self.error(blocked, code="guardrail_blocked", event_id=named)]
            return out + [self._take_back(i) for i in typed.taken(ref) or ()]
        match event:
            case Session():
                return []
            case Configured(config=config, reply_to=ref):
                self.audio_out = config.output == "audio"
                self.requests.hearing = config.input_audio is not None
                self.requests.set_manual(config.input_audio)
                if self.overrides.configured(config, ref):
                    return []  # one response's overrides, or the session's own back
                kind = "session.updated" if self._created else "session.created"
                self._created = True
                self.requests.pending_reply = None
                early, self._items_early = self._items_early, []
                return [
                    self.ids.event(kind, session=session_of(config, self.sid, self.model)),
                    *early,
                ]
            case SpeechStarted(offset_ms=ms):
                if not self.requests.turn_open and typed.sent is None:
                    typed.due += typed.release(spoken=True)  # before the speech's item
                self._speech = f"item_{event.seq}"
                # OpenAI's order: the speech, then the answer it cancels ("the server will
                # automatically cancel any in-progress model response"; its VAD guide).
                started = self.ids.event(
                    "input_audio_buffer.speech_started", audio_start_ms=ms, item_id=self._speech
                )
                out = self._done("cancelled", reason="turn_detected") if self._response else []
                return [started, *out]
            case SpeechStopped(offset_ms=ms):
                iid = self._speech or f"item_{event.seq}"
                self._speech = iid
                return [
                    self.ids.event(
                        "input_audio_buffer.speech_stopped", audio_end_ms=ms, item_id=iid
                    )
                ]
            case User(content=content, source=source, reply_to=ref, item=user_item):
                shown = typed.taken(ref)  # the message sent from here
                self.requests.user_logged(spoken=source == "audio")
                if shown is not None:  # shown when created: now it has its place
                    self._user_turn(event.seq)
                    for iid in shown:
                        self.shown.spans.add(iid, event.seq, event.seq)
                    return []
                given = user_item if isinstance(user_item, str) else None
                return self._user(event.seq, content, spoken=source == "audio", item=given)
            case Context(role=role, content=content, reply_to=ref, item=given):
                iid = given if isinstance(given, str) else f"item_{event.seq}"
                typed.logged(self.shown, iid, event.seq)
                if typed.taken(ref) is not None:  # created here: shown already
                    return []
                return self.shown.append(self.ids.event, text_item(iid, role, content))
            case Replying(reply_to=ref):  # a turn with no new message: nothing to show
                typed.taken(ref)
                self.requests.user_logged(spoken=False)
                self._user_turn(event.seq)
                return []
            case Forgotten(first=first, last=last):
                return self._forgotten(first, last)
            case AudioCleared():
                self.requests.audio_cleared()
                return [self.ids.unlogged_event("input_audio_buffer.cleared")]
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
                out.append(self.ids.event(kind, **self._where(resp, resp.message), delta=content))
                return out
            case Call(runs_on="client"):
                return self._client_call(event)
            case Result(id=str(call), content=content, item=output_item):
                if output_item in self.shown.items:  # shown when created (``hold_output``)
                    return []
                given = output_item if isinstance(output_item, str) else None
                return self._output(call, content, given)
            case End():
                if (eid := typed.outputs_over()) is not None:  # outputs held past their turn
                    self.requests.pending_reply = eid  # refused: that error names them
                self.requests.turn_open = False
                self.requests.swallowed = None  # the turn it went on with is over
                self.overrides.unask()
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
                if (eid := typed.outputs_over()) is not None:  # as after End
                    self.requests.pending_reply = eid
                self.requests.turn_open = False
                self.overrides.put_back()
                reason = "turn_detected" if why == "barge_in" else "client_cancelled"
                if self._response is None and not self.overrides.owed:
                    return []
                # A response a create asked for is shown even if cut before its first word.
                return [*self._start(), *self._done("cancelled", reason=reason)]
            case Error(code=code, content=text, reply_to=str(ref)) if ref in typed.contexts:
                named = ref if ref in self.requests.named else None  # else a held one's
                back = [self._take_back(iid) for iid in typed.taken(ref) or ()]
                return [self.ids.error(text, code=code, event_id=named), *back]
            case Error(code=code, content=content, reply_to=ref):
                if self._response is None:
                    self.overrides.put_back()  # the response with overrides never started
                    if (sent := typed.sent) is not None and ref == sent[0]:
                        self.overrides.unask()  # the create's message was refused
                requests = self.requests
                requests.refused_update(ref if isinstance(ref, str) else None)
                reply, requests.pending_reply = requests.pending_reply, None
                if isinstance(ref, str) and ref in requests.named:
                    reply = ref
                busy, gone = requests.refused(ref if isinstance(ref, str) else None, code)
                if busy:
                    code, content = BUSY_CODE, BUSY
                elif code == "no_turn":  # a response.cancel with nothing running: OpenAI's
                    code, content = NOT_ACTIVE_CODE, NOT_ACTIVE
                out = [self.ids.error(content, code=code, event_id=reply)]
                out += [self._take_back(iid) for iid in gone]
                if isinstance(ref, str) and not self.ids.seq:  # a reply: a tool output's?
                    out += requests.output_refused(ref)
                if self._response is not None and self.ids.seq:  # logged: the turn failed
                    out = [*self._done("failed", error=content), *out]
                return out
        return []

    def _take_back(self, iid: str) -> ServerEvent:
        """A message shown when created that never reached the model: deleted."""
        self.shown.drop(iid)
        return self.ids.event("conversation.item.deleted", item_id=iid)

    def _forgotten(self, first: int, last: int) -> list[ServerEvent]:
        self.requests.pending_reply = None
        gone = self.shown.forget(first, last)
        return [self.ids.event("conversation.item.deleted", item_id=iid) for iid in gone]

    def _user_turn(self, seq: int) -> None:
        """A user turn was logged at ``seq``: the responses to come are its."""
        self.requests.pending_reply = None
        self.requests.turn_open = True
        self.requests.swallowed = None
        self._turn, self._responses = seq, 0

    def _user(self, seq: int, content: str, *, spoken: bool, item: str | None) -> list[ServerEvent]:
        self._user_turn(seq)
        iid, self._speech = (self._speech if spoken else item) or f"item_{seq}", None
        prev, self.shown.last = self.shown.last, iid
        self.shown.spans.add(iid, seq, seq)
        return user_shown(self.ids, iid, prev, content, spoken=spoken)

    def audio(self, tag: int, pcm16: bytes) -> list[ServerEvent]:
        """A piece of the model's speech (unlogged ids); ahead of its event, it waits."""
        early = self._early
        if early.held or (self._response is None and tag > self._logged):
            if early.hold(tag, pcm16):
                return []
            return self._speak(None)  # held too long: it goes as it came
        return self._audio(tag, pcm16)

    def _speak(self, upto: int | None) -> list[ServerEvent]:
        """The events of the speech held tagged ``upto`` or before (``None``: all of it)."""
        return [e for tag, pcm16 in self._early.due(upto) for e in self._audio(tag, pcm16)]

    def _audio(self, tag: int, pcm16: bytes) -> list[ServerEvent]:
        ids, requests = self.ids, self.requests
        ids.seq, ids.n = 0, 0
        requests.audio_tag = max(requests.audio_tag, tag)
        out = self._open_message()
        self.shown.remember(out)  # speech can open the answer's message before its text does
        resp = self._response
        assert resp is not None and resp.message is not None
        resp.audio = True
        requests.speaking = resp.message
        # The PCM bytes as they are: the frame's encoder writes bytes as base64 (one
        # step in C, 2.5 -> 1.5 µs a 20 ms frame), and a WebRTC call, whose speech
        # goes on the track, drops the event without ever encoding it.
        out.append(
            self.ids.event(
                "response.output_audio.delta", **self._where(resp, resp.message), delta=pcm16
            )
        )
        return out

    def _where(self, resp: ShownResponse, item_id: str) -> dict[str, Any]:
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
        resp = self._response = ShownResponse(f"resp_{self._turn}_{self._responses}")
        self.requests.responding = resp.id
        resp.metadata = self.overrides.shown()
        return [self.ids.event("response.created", response=self._resp_body(resp, "in_progress"))]

    def _resp_body(
        self, resp: ShownResponse, status: str, details: dict[str, Any] | None = None
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

    def _message_item(self, resp: ShownResponse, status: str) -> dict[str, Any]:
        assert resp.message is not None
        return answer_item(resp.message, "".join(resp.text), status, audio=self.audio_out)

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
        prev = self.shown.last
        self.shown.last = iid
        part = (
            {"type": "audio", "transcript": ""} if self.audio_out else {"type": "text", "text": ""}
        )
        out += [
            self.ids.event(
                "response.output_item.added",
                response_id=resp.id,
                output_index=len(resp.output) - 1,
                item=item,
            ),
            self.ids.event("conversation.item.added", item=item, previous_item_id=prev),
            self.ids.event("response.content_part.added", **self._where(resp, iid), part=part),
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
            self.shown.spans.add(iid, resp.first, resp.last)
        done: list[ServerEvent] = []
        if self.audio_out:
            if resp.audio:
                done.append(self.ids.event("response.output_audio.done", **where))
            done.append(
                self.ids.event("response.output_audio_transcript.done", **where, transcript=text)
            )
            part = {"type": "audio", "transcript": text}
        else:
            done.append(self.ids.event("response.output_text.done", **where, text=text))
            part = {"type": "text", "text": text}
        return [
            *done,
            self.ids.event("response.content_part.done", **where, part=part),
            self.ids.event(
                "response.output_item.done",
                response_id=resp.id,
                output_index=where["output_index"],
                item=item,
            ),
            self.ids.event("conversation.item.done", item=item),
        ]

    def _output(self, call: str, content: str, named: str | None) -> list[ServerEvent]:
        """A client's ``function_call_output`` (its call's logged result, ``named`` as the
        client named it), shown as OpenAI shows a created item; a gateway tool's is not
        (its call never was)."""
        if not any(i.get("call_id") == call for i in self.shown.items.values()):
            return []
        item = output_item(named or f"item_{self.ids.seq}", call, output_of(content))
        return self.shown.append(self.ids.event, item)

    def _client_call(self, call: Call) -> list[ServerEvent]:
        out = self._start()
        out += self._close_message()
        resp = self._response
        assert resp is not None
        iid = f"fc_{self.ids.seq}"
        name, arguments = call_parts(call.content)
        item = call_item(iid, call.id, name, "", status="in_progress")
        resp.output.append(item)
        index = len(resp.output) - 1
        prev = self.shown.last
        self.shown.last = iid
        done_item = {**item, "status": "completed", "arguments": arguments}
        resp.output[-1] = done_item
        self.requests.client_calls.add(call.id)
        where = {"response_id": resp.id, "item_id": iid, "output_index": index, "call_id": call.id}
        out += [
            self.ids.event(
                "response.output_item.added", response_id=resp.id, output_index=index, item=item
            ),
            self.ids.event("conversation.item.added", item=item, previous_item_id=prev),
            self.ids.event("response.function_call_arguments.delta", **where, delta=arguments),
            self.ids.event(
                "response.function_call_arguments.done", **where, name=name, arguments=arguments
            ),
            self.ids.event(
                "response.output_item.done", response_id=resp.id, output_index=index, item=done_item
            ),
            self.ids.event("conversation.item.done", item=done_item),
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
        self._response = self.requests.responding = None
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
        out.append(self.ids.event("response.done", response=body))
        return out
