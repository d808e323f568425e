"""What an OpenAI client's events ask of the session: gateway commands, checked,
held or refused. Pure: no I/O, no clock.

The client → session half of the OpenAI door's conversation (``protocol.openai_conversation``):
``session.update`` → ``configure``; created messages and function call outputs are shown
at once and held (``protocol.openai_typed``) for the ``response.create`` that sends them
(a user message as the turn's ``user``, others as ``context``, an output as its call's
``tool_result``); audio appends → the user's audio (``speech_in``); ``truncate`` →
``played``, ``delete`` → ``forget``. What this gateway cannot do is refused with an
``error`` that says what to send instead, carrying the client's ``event_id``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final, Literal

import msgspec

from protocol.configuration import InputAudio
from protocol.events import (
    COMMAND_ID_MAX,
    Cancel,
    ClearAudio,
    Commit,
    Configure,
    ContextMessage,
    Forget,
    Played,
    ReplyNow,
    ToolResultMessage,
    UserMessage,
)
from protocol.openai_audio import NOT_BASE64, append_pcm
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
    ServerEvent,
    SessionUpdate,
    parameter_refusal,
)
from protocol.openai_ids import EventIds
from protocol.openai_items import KEPT_ITEMS, ShownItems, message_item, unknown_item
from protocol.openai_response import (
    HIDDEN,
    TOKEN_REFUSAL,
    Overrides,
    ResponseOverrides,
    changes_nothing,
    response_overrides,
)
from protocol.openai_session import config_change
from protocol.openai_typed import Held, TypedItems, id_refusal

__all__ = [
    "BUSY",
    "BUSY_CODE",
    "NOT_ACTIVE",
    "NOT_ACTIVE_CODE",
    "ClientRequests",
    "Command",
    "Emit",
]

NOT_ACTIVE_CODE = "response_cancel_not_active"  # OpenAI's code for a cancel of nothing
NOT_ACTIVE = "Cancellation failed: no active response found."
EMPTY_CODE = "input_audio_buffer_commit_empty"  # OpenAI's code for a commit of too little
MIN_COMMIT_MS = 100  # OpenAI's least audio a commit takes

BUSY_CODE = "conversation_already_has_active_response"  # OpenAI's code for it
BUSY = (
    "Conversation already has an active response in progress: wait for its "
    "response.done (or send response.cancel), then send response.create; the items "
    "created since are kept for it (a function call that waits for its "
    "function_call_output keeps the response going)"
)

Command = (
    UserMessage
    | ReplyNow
    | ContextMessage
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


class ClientRequests:
    """One client's events as the commands they ask of its session.

    ``ids``, ``shown`` and ``overrides`` are its conversation's: the events it
    answers with are numbered with the rest, and the items it names are those the
    conversation showed. The conversation writes back what the session's events
    settle: ``hearing`` and ``manual`` (a ``configured``), ``pending_reply`` (answered),
    ``client_calls`` (a call shown), ``audio_tag`` and ``speaking`` (the answer's speech
    so far, and its item), ``turn_open`` (a turn's ``user`` logged, until its ``end`` or
    ``cancelled``), ``responding`` (the response shown in progress), ``clearing`` (a clear
    sent: ``audio_cleared``), and what a refusal of a response's message gives back.
    """

    __slots__ = (
        "audio_tag",
        "buffered",
        "clearing",
        "client_calls",
        "continues",
        "hearing",
        "ids",
        "input_rate",
        "manual",
        "model",
        "named",
        "overrides",
        "own_ids",
        "pending_reply",
        "responding",
        "shown",
        "speaking",
        "swallowed",
        "turn_open",
        "typed",
    )

    def __init__(
        self,
        model: str,
        input_rate: int,
        ids: EventIds,
        shown: ShownItems,
        overrides: ResponseOverrides,
        item_prefix: str,
    ) -> None:
        self.model = model
        self.input_rate = input_rate
        self.ids = ids
        self.shown = shown
        self.overrides = overrides
        # User messages created: shown at once, held until response.create sends them.
        self.typed = TypedItems(item_prefix)
        self.own_ids = 0  # ids the door made for commands the client sent unnamed
        self.turn_open = False  # a turn runs (its user event logged, not yet over)
        self.responding: str | None = None  # the id of the response being shown
        # The call whose output went back while its turn ran: the gateway's turn goes on,
        # and the response.create that follows opens nothing (``swallowed``: that create's
        # call and event_id, answered with an error if the session refuses the output).
        self.continues: str | None = None
        self.swallowed: tuple[str, str | None] | None = None
        self.client_calls: set[str] = set()  # calls shown to the client, awaiting output
        self.pending_reply: str | None = None  # event_id of the command an error answers
        self.named: deque[str] = deque(maxlen=64)  # event_ids sent on as command ids
        # Input audio configured (or the event_id of the update configuring it, not yet
        # taken by the session).
        self.hearing: bool | str = False
        self.manual = False  # ... with turn_detection none: the client commits
        self.buffered = 0  # bytes of the user's audio since the last commit or clear
        self.clearing = -1
        self.audio_tag = 0  # seq tag of the newest audio frame of the answer
        self.speaking: str | None = None  # the message item the newest audio frame was of

    def take(self, event: ClientEvent | BadEvent, *, model_route: tuple[str, str]) -> Emit:
        """One client event: the commands to send and the events to answer with now."""
        if isinstance(event, BadEvent):
            return self._bad(event)
        emit = self._take(event, model_route)
        if any(not isinstance(c, bytes) for c in emit.commands):
            self.pending_reply = event.event_id  # an error that answers it names it
            eid = event.event_id
            if eid and len(eid) <= COMMAND_ID_MAX:
                # The gateway's command id is the client's event_id: its error's
                # reply_to says which event it answers, even with several in flight.
                self.named.append(eid)
                emit = Emit([_named(c, eid) for c in emit.commands], emit.events)
        return emit

    def _take(self, event: ClientEvent, model_route: tuple[str, str]) -> Emit:
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
                    # Not hearing before: until the session takes it, ``hearing`` names
                    # this update, whose refusal takes it back (``refused_update``).
                    self.hearing = eid if eid and self.hearing is False else True
                    self.set_manual(change.input_audio)
                    if change.input_audio is not None and self.input_rate != 24000:
                        heard = msgspec.structs.replace(change.input_audio, rate=self.input_rate)
                        change = msgspec.structs.replace(change, input_audio=heard)
                self.pending_reply = eid
                return Emit([change], [])
            case ConversationItemCreate(item=item, previous_item_id=previous):
                last = self.shown.last
                if previous is not None and previous != (last or "root"):
                    return self._refusal(
                        "items are appended to the end of the conversation on this gateway: "
                        "leave previous_item_id unset (or the last item's id, 'root' while "
                        f"there is none; the last is {last!r})",
                        eid,
                        "previous_item_id",
                    )
                return self._item(item, eid)
            case ResponseCreate(response=body):
                given = body.given() if body is not None else None
                made = response_overrides(given) if given else None
                if isinstance(made, tuple):
                    return self._refusal(made[0], eid, made[1])
                if made is not None and made.change is not None and not self.overrides.allowed:
                    return self._refusal(TOKEN_REFUSAL, eid, "response")
                return self._respond(made, eid)
            case ResponseCancel(response_id=rid):
                if rid is not None and rid != self.responding:  # not the one in progress
                    return Emit(
                        [],
                        [
                            self.ids.error(
                                f"{NOT_ACTIVE} (response {rid[:64]!r} is not in progress)",
                                code=NOT_ACTIVE_CODE,
                                event_id=eid,
                                param="response_id",
                            )
                        ],
                    )
                return Emit([Cancel()], [])
            case InputAudioBufferAppend():
                pcm = append_pcm(event)
                if pcm is None:
                    return self._refusal(NOT_BASE64, eid, "audio")
                return self.speech_in(pcm)
            case InputAudioBufferCommit():
                return self._commit(eid)
            case ConversationItemTruncate(item_id=item_id, content_index=index, audio_end_ms=ms):
                return self._truncate(item_id, index, ms, eid)
            case OutputAudioBufferClear():
                return Emit([], [])  # the client's own playback buffer: nothing is held here
            case ConversationItemRetrieve(item_id=item_id):
                shown = self.shown.items.get(item_id)
                if shown is None:
                    return self._not_found(item_id, eid, "retrieve")
                return Emit([], [self.ids.event("conversation.item.retrieved", item=shown)])
            case ConversationItemDelete(item_id=item_id):
                return self._delete(item_id, eid)
            case InputAudioBufferClear():
                if not self.hearing:  # no audio was taken: nothing to discard
                    self.buffered = 0
                    return Emit([], [self.ids.unlogged_event("input_audio_buffer.cleared")])
                self.clearing = self.buffered  # a refused clear (Gemini's) discards nothing
                return Emit([ClearAudio()], [])
        return self._refusal("unsupported event", eid)  # pragma: no cover - the match is total

    def _respond(self, made: Overrides | None, eid: str | None) -> Emit:
        """``response.create`` (its overrides checked): a turn of its own (the held user
        text as its message, or none: the model answers the conversation as it is, as
        OpenAI's service does, a greeting from the instructions), nothing (after a
        function_call_output or a commit: the turn goes on), or a refusal."""
        change = made.change if made is not None else None
        typed = self.typed
        busy = self.turn_open or typed.sent is not None  # a turn runs, or was just asked
        if busy and not typed.outputs and (typed.held or not self.continues):
            # As OpenAI's service answers: the items created stay, for the next response.
            return Emit([], [self.ids.error(BUSY, code=BUSY_CODE, event_id=eid)])
        metadata = made.metadata if made is not None else None
        if (typed.held or self.continues is None) and not typed.outputs:
            self.continues = None  # this create starts a turn of its own
            self.pending_reply = eid
            # A refusal of the turn names it, whether the client named it or not.
            sent: list[Command] = [*typed.send(self._command_id(eid, "said"))]
            self.overrides.ask(metadata)  # this create's response's, and no other's
            if change is None:
                return Emit(sent, [])
            self.overrides.start(change)
            return Emit([*sent[:-1], change, sent[-1]], [])
        # The gateway's turn already goes on (after a function_call_output or a commit
        # of audio): what the session has anyway is no override (pipecat sends its
        # session's output_modalities with the create after an output).
        if change is not None and not changes_nothing(change, self.overrides.config):
            return self._refusal(
                "instructions, tools and output of a response are set with the response "
                "that starts a turn on this gateway: after a function_call_output or a "
                "commit of audio the answer goes on with the session's; send "
                "response.create without them",
                eid,
                "response",
            )
        # Its answer is still to come (a call's turn, or a commit's not logged yet).
        coming = self.turn_open or self._commit_answers()
        self.swallowed, self.continues = (self.continues or "", eid), None
        if coming and self.responding is None:
            self.overrides.ask(metadata)
        return Emit([*typed.take_outputs()], [])  # the outputs it answers, if held

    def refused(self, command_id: str | None, code: str) -> tuple[bool, list[str]]:
        """The session refused the command ``command_id`` with ``code``: whether the
        refusal is OpenAI's ``BUSY`` (the turn a response.create sent, refused for one
        already running: its messages held again), and the messages it carried that
        never reach the model (refused otherwise), to be taken back."""
        busy = code == "turn_active"
        gone = self.typed.refused(command_id, busy=busy)
        return busy and gone is not None, gone or []

    def output_refused(self, call: str) -> list[ServerEvent]:
        """The session refused the output of ``call`` (its turn was over): the
        response.create after it opens nothing, so it is answered, not left waiting."""
        if self.continues == call:
            self.continues = None  # the response.create to come is refused as it is
            return []
        swallowed = self.swallowed
        if swallowed is None or swallowed[0] != call:
            return []
        self.swallowed = None
        message = (
            f"no response: the output of call {call[:80]!r} was refused (its turn is over), "
            "so nothing goes on from it; send a user message and response.create"
        )
        if self._is_commit(call):
            message = (
                "no response: the commit before this response.create was refused (see "
                "that error), so there is no turn to answer; append audio and commit again"
            )
        return [self.ids.error(message, event_id=swallowed[1])]

    def _commit(self, eid: str | None) -> Emit:
        """The client's end of its spoken turn; too little audio is refused as OpenAI's
        service refuses it (the provider would be sent an empty turn)."""
        if self.manual:
            ms = self.buffered * 1000 / (2 * self.input_rate)
            if ms < MIN_COMMIT_MS:
                message = (
                    "Error committing input audio buffer: buffer too small. Expected at "
                    f"least {MIN_COMMIT_MS}ms of audio, but buffer only has {ms:.2f}ms of audio."
                )
                return Emit([], [self.ids.error(message, code=EMPTY_CODE, event_id=eid)])
        self.buffered = 0
        if not self.manual:
            return Emit([Commit()], [])
        # The gateway answers a committed turn by itself. OpenAI's client, its turn
        # detection off, sends response.create next (often with the commit, before
        # ``committed``): that create is this answer, and opens nothing more
        # (``continues``, as after a function_call_output), instead of an error.
        self.continues = cid = self._command_id(eid, "commit")
        return Emit([Commit(id=cid)], [])

    def _command_id(self, eid: str | None, kind: str) -> str:
        """A command's id: the client's ``event_id``, or one of the door's own (a
        refusal of the command then names it either way)."""
        if eid and len(eid) <= COMMAND_ID_MAX:
            return eid
        self.own_ids += 1
        return f"{HIDDEN}{kind}{self.own_ids}"

    def _truncate(self, item_id: str, index: int, ms: int, eid: str | None) -> Emit:
        """What the listener heard of the answer: the gateway cuts the provider's copy of
        the answer spoken last there (``played``). Another item is refused, as OpenAI's
        service refuses an item it does not have, rather than cutting the wrong one."""
        if item_id not in self.shown.items:
            return self._not_found(item_id, eid, "truncate")
        if item_id != self.speaking:
            return self._refusal(
                f"item {item_id[:64]!r} cannot be truncated on this gateway: only the "
                "assistant message whose audio was sent last (the answer being played) is",
                eid,
                "item_id",
            )
        if index != 0:
            return self._refusal(
                "the answer's audio is its content part 0: send content_index 0",
                eid,
                "content_index",
            )
        if ms < 0:
            return self._refusal(
                "audio_end_ms is how much of the audio was played: 0 or more", eid, "audio_end_ms"
            )
        truncated = self.ids.event(
            "conversation.item.truncated", item_id=item_id, content_index=index, audio_end_ms=ms
        )
        return Emit([Played(seq=self.audio_tag, ms=ms)], [truncated])

    def _not_found(
        self, item_id: str, eid: str | None, doing: Literal["truncate", "delete", "retrieve"]
    ) -> Emit:
        """An unknown item, in OpenAI's words where they are known (``unknown_item``:
        clients key on them, pipecat's retrieve waits for its code), else the door's."""
        where = f"in the newest {KEPT_ITEMS} items of this conversation"
        if doing == "truncate":
            message, code, param = (
                f"Item with id {item_id[:64]!r} not found.",
                "item_not_found",
                "item_id",
            )
        else:
            (message, code), param = unknown_item(item_id[:64], doing), None
        return Emit(
            [],
            [
                self.ids.error(
                    f"{message} Pass the id of an item this conversation was sent ({where}).",
                    code=code,
                    event_id=eid,
                    param=param,
                )
            ],
        )

    def _delete(self, item_id: str, eid: str | None) -> Emit:
        span = self.shown.spans.get(item_id)
        if span is not None:
            return Emit([Forget(first=span[0], last=span[1])], [])
        if self.typed.drop(item_id):  # not sent yet: it never reaches the model
            self.shown.drop(item_id)  # and what waited behind it alone goes now
            deleted = self.ids.event("conversation.item.deleted", item_id=item_id)
            return Emit([*self.typed.release()], [deleted])
        if (why := self.typed.delete_in_flight(item_id)) is not None:  # "": once logged
            return self._refusal(why, eid, "item_id") if why else Emit([], [])
        if item_id in self.shown.items:
            return self._refusal(
                f"item {item_id[:64]!r} cannot be deleted on this gateway: function calls (and "
                "their outputs) stay in the model's context; delete the messages around them",
                eid,
                "item_id",
            )
        return self._not_found(item_id, eid, "delete")

    def speech_in(self, pcm16: bytes) -> Emit:
        """The user's audio at ``input_rate`` (an append's, or a WebRTC microphone's)."""
        commands: list[Command] = []
        if not self.hearing:  # OpenAI hears with server VAD unless told otherwise
            self.hearing = True
            commands.append(Configure(input_audio=InputAudio(rate=self.input_rate)))
        commands.append(pcm16)
        self.heard(len(pcm16))
        return Emit(commands, [])

    def audio_cleared(self) -> None:
        """The session discarded what ``buffered`` was as the clear was sent (``clearing``)."""
        self.buffered, self.clearing = max(0, self.buffered - max(self.clearing, 0)), -1

    def heard(self, size: int) -> None:
        """``size`` bytes of the user's audio went in (by any path: an append, a fast
        path's, a WebRTC microphone's): what a commit takes, with turn_detection none."""
        if self.manual:
            self.buffered += size

    def refused_update(self, command_id: str | None) -> None:
        """The session refused command ``command_id``: if it was the session.update that
        configured input audio, none is (OpenAI's refused update changes nothing), and
        the next append configures it as the first one does."""
        if command_id is not None and self.hearing == command_id:
            self.hearing = False
            self.set_manual(None)

    def set_manual(self, audio: InputAudio | None) -> None:
        """The input audio configured: the client commits when its turn detection is
        none, counting from then."""
        now = _manual(audio)
        if now != self.manual:
            self.manual, self.buffered = now, 0
            if not now and self._commit_answers():
                self.continues = None  # the client's turns are its VAD's now

    def user_logged(self, *, spoken: bool) -> None:
        """A user turn was logged: a typed one ends a commit's answer whose
        response.create never came (a spoken one, with turn detection off, is a
        commit's: the one ``continues`` names, or a newer one that replaced it)."""
        if not spoken and self._commit_answers():
            self.continues = None

    def _commit_answers(self) -> bool:
        """``continues`` is a commit's (``_commit``), not a function call's."""
        return self.continues is not None and self._is_commit(self.continues)

    def _is_commit(self, cid: str) -> bool:
        """``cid`` is a commit's id (``_command_id``: a door's own, or the client's
        event_id; a function call's id is the provider's)."""
        return cid.startswith(f"{HIDDEN}commit") or cid in self.named

    def _bad(self, bad: BadEvent) -> Emit:
        error = self.ids.error(bad.message, code=bad.code, event_id=bad.event_id, param=bad.param)
        return Emit([], [error])

    def _refusal(self, message: str, eid: str | None, param: str | None = None) -> Emit:
        return Emit([], [self.ids.error(message, event_id=eid, param=param)])

    def _item(self, item: Any, eid: str | None) -> Emit:
        required = _REQUIRED.get(item.type, ())
        missing = next((name for name in required if getattr(item, name) is None), None)
        if missing is not None:  # as OpenAI's service answers it
            return self._bad(parameter_refusal(f"item.{missing}", eid, missing=True))
        if item.id is not None and (refused := self._taken_id(item.id, eid)) is not None:
            return refused
        typed, iid = self.typed, item.id or self.typed.new_id()
        if item.type == "function_call_output" and item.call_id not in typed.past_calls:
            call = item.call_id or ""
            if call not in self.client_calls:
                return self._refusal(
                    f"no function call {call[:80]!r} is waiting for its output", eid, "item.call_id"
                )
            self.client_calls.discard(call)
            output = ToolResultMessage(call, "success", item.output or "", item=iid)
            if not self.turn_open:  # its turn is over (cancelled): the session refuses it
                return Emit([output], [])  # (``output_refused``)
            self.continues = call  # the turn goes on with it, once asked (``hold_output``)
            return Emit([], typed.hold_output(output, eid, self.shown, self.ids.unlogged_event))
        if item.type != "message":  # a call of the client's history, or its output
            role, text, shown = typed.past(iid, item)
            return self._add((iid, text, role), shown, eid)
        kind = _CONTENT.get(item.role or "")
        if kind is None:
            return self._refusal(f"messages of role {item.role!r} are not taken", eid, "item")
        parts: list[dict[str, str]] = []
        for part in item.content or []:
            if part.type != kind or part.text is None:
                return self._refusal(
                    f"content of type {part.type[:40]!r} is not supported in a message of "
                    f"role {item.role!r}: send {kind}",
                    eid,
                    "item.content",
                )
            parts.append({"type": kind, "text": part.text})
        text = "".join(part["text"] for part in parts)
        return self._add((iid, text, item.role), message_item(iid, item.role, parts), eid)

    def _add(self, held: Held, shown: dict[str, Any], eid: str | None) -> Emit:
        """A created item (``shown``) that the model gets as the message ``held``: held
        for ``response.create`` (a user's, or behind one), or sent now as ``context``."""
        typed = self.typed
        too_much = typed.refusal(held[1])
        if too_much is not None:
            return self._refusal(too_much, eid, "item.content")
        events = self.shown.show(self.ids.unlogged_event, shown)
        if held[2] == "user" or typed.waiting:
            typed.hold(*held)  # for response.create (``TypedItems``)
            return Emit([], events)
        context = typed.context(held, eid if eid and len(eid) <= COMMAND_ID_MAX else "")
        return Emit([context], events)

    def _taken_id(self, iid: str, eid: str | None) -> Emit | None:
        """A refusal of a client's item id out of bounds or already in use; None if not."""
        refused = id_refusal(iid, self.shown, self.typed)
        if refused is None:
            return None
        return Emit(
            [], [self.ids.error(refused[0], code=refused[1], event_id=eid, param="item.id")]
        )


_CONTENT: Final = {"user": "input_text", "system": "input_text", "assistant": "output_text"}
"""The content type a message of each role takes (the SDK's ``RealtimeConversationItem*``)."""

_REQUIRED: Final = {
    "message": ("role", "content"),
    "function_call_output": ("call_id", "output"),
    "function_call": ("name", "arguments"),
}
"""The fields of an item OpenAI's reference requires (``openai/types/realtime``)."""


def _manual(audio: InputAudio | None) -> bool:
    """Input audio the client commits itself (``turn_detection`` null)."""
    return audio is not None and audio.turn_detection == "none"
