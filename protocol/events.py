"""Every message on the client wire, as msgspec Structs tagged on ``type``.

Server → client events follow the seed's event schema (``type``, ``content``,
``timestamp``, ``payload``, ``step``/``total``) plus ``seq``. Client → server
messages are ``user``, ``cancel``, ``ping``, ``configure``, ``tool_result``
(a client-side tool's answer), and for voice ``audio`` (base64 PCM16; binary
frames carry the same bytes) and ``commit``.

A client's frame is read by ``protocol.client_frames`` (a bad one is answered with
how to write it); this module is the vocabulary, and encodes the server's events.

The records events carry (``Usage``, ``Cost``, a tool batch's ``ResultPayload``,
``PhoneCallMetrics``) are ``protocol.payloads``'s, named here too.

Who fills what: the parser produces events with ``seq = 0`` and
``timestamp = 0.0``; the gateway stamps both at the one place where an event is
logged (see ``gateway.emitter``). That keeps this layer free of clocks and
counters, so the same model output always parses to equal events.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Final, Literal

import msgspec

from protocol.configuration import ConfigChange, SessionConfig
from protocol.error_codes import ERROR_CODES, ErrorCode
from protocol.payloads import Cost, PhoneCallMetrics, ResultPayload, Usage

__all__ = [
    "CLIENT_MESSAGE_TYPES",
    "COMMAND_ID_MAX",
    "ERROR_CODES",
    "Approval",
    "ApprovalRequired",
    "Approve",
    "AudioChunk",
    "AudioCleared",
    "Call",
    "Cancel",
    "Cancelled",
    "ClearAudio",
    "ClientMessage",
    "CommandId",
    "Commit",
    "Configure",
    "Configured",
    "Context",
    "ContextMessage",
    "Cost",
    "Dtmf",
    "End",
    "Error",
    "ErrorCode",
    "Event",
    "Execute",
    "Forget",
    "Forgotten",
    "Guardrail",
    "Interrupt",
    "Metric",
    "PhoneCall",
    "PhoneCallMetrics",
    "Ping",
    "Played",
    "Pong",
    "ReplyNow",
    "Replying",
    "Respond",
    "Result",
    "ResultPayload",
    "Role",
    "Session",
    "SpeechStarted",
    "SpeechStopped",
    "Think",
    "ToolResultMessage",
    "TurnCommand",
    "Usage",
    "User",
    "UserMessage",
    "answering",
    "decode_event",
    "encode",
]


class _Base(msgspec.Struct, tag_field="type", kw_only=True):
    """Fields every server event carries. ``seq``/``timestamp`` are stamped when logged."""

    seq: int = 0
    timestamp: float = 0.0


# --- events from the model (produced by protocol.Parser) ---------------------


class Think(_Base, tag="think"):
    """A chunk of the model's reasoning (token mode: one chunk per delta). ``seq_from``:
    a frame coalescing a slow client's chunks ``seq_from..seq`` (content concatenated)."""

    content: str
    seq_from: int | msgspec.UnsetType = msgspec.UNSET


class Respond(_Base, tag="respond"):
    """A chunk of the user-facing response (``seq_from``: see ``Think``)."""

    content: str
    seq_from: int | msgspec.UnsetType = msgspec.UNSET


class Call(_Base, tag="call"):
    """One tool call; ``content`` is the JSON string ``{"name": ..., "args": {...}}``.

    ``id`` names the call within its session (``call_N``); ``runs_on`` says who
    runs it: ``"gateway"`` (a server tool, or a call the gateway answers itself,
    e.g. with a failure) or ``"client"`` (a tool the session's client declared
    with ``configure``: some connection of the session answers it with a
    ``tool_result`` frame carrying this ``id``). ``background: true``: the tool
    does not block the turn; the model was told it started, and the call's
    ``result`` comes when it is ready, maybe after the turn.
    """

    content: str
    id: str = ""
    runs_on: Literal["gateway", "client"] = "gateway"
    background: bool = False


class Execute(_Base, tag="execute"):
    """The execution boundary: the calls before it run now, as one batch."""


class End(_Base, tag="end"):
    """The model said ``<end>``, or its turn finished: the turn is over."""


# --- events from the framework (the gateway) --------------------------------


class User(_Base, tag="user"):
    """The user's message, as logged (echoed to every attached client).

    ``source`` is ``"audio"`` (and only then present) when the user spoke:
    ``content`` is then the provider's transcript of the speech, so history,
    resumes and the other provider work from text; the audio is not logged.
    ``item``: the client's name for the message (``UserMessage.item``), when it gave one.
    """

    content: str
    source: Literal["audio"] | msgspec.UnsetType = msgspec.UNSET
    reply_to: str | msgspec.UnsetType = msgspec.UNSET
    item: str | msgspec.UnsetType = msgspec.UNSET


class Replying(_Base, tag="reply"):
    """A turn started with no new user message (``reply``): the model answers the
    conversation as it is (a greeting from its instructions, a follow-up)."""

    reply_to: str | msgspec.UnsetType = msgspec.UNSET


Role = Literal["system", "user", "assistant"]
"""Who a conversation message is from, as the providers name them."""


class Context(_Base, tag="context"):
    """A message added without a turn (``context``): an app's ``system`` instructions,
    history a client restores. Kept in history where it was added: the model has it
    from its next step on."""

    role: Role
    content: str
    reply_to: str | msgspec.UnsetType = msgspec.UNSET
    item: str | msgspec.UnsetType = msgspec.UNSET


class SpeechStarted(_Base, tag="speech_started"):
    """The provider's voice activity detection heard the user start speaking,
    ``offset_ms`` into the audio this session's upstream connection received.
    A client playing an answer should stop it now (barge-in). ``heard_ms``: the
    previous answer had finished generating but was still playing (the client's
    newest ``played`` was behind the audio sent), so it is cut where the client
    had played to: the provider and history keep that much of it."""

    offset_ms: int
    heard_ms: int | msgspec.UnsetType = msgspec.UNSET


class SpeechStopped(_Base, tag="speech_stopped"):
    """The user stopped speaking (``offset_ms`` as in ``speech_started``): the
    speech is a user turn; its ``user`` event (``source: audio``) follows."""

    offset_ms: int


class Result(_Base, tag="result"):
    """A call's outcome, logged as soon as the call finished: ``id`` names the call.

    ``content`` is the JSON array string of results (here the one call's
    ``{"tool", "status", "content"}``); ``id`` is absent only on the failure
    of a malformed ``<execute>`` block, which has no call. History keeps one
    ``Result`` per batch (all of its results, in call order): that is what
    the model reads. ``item``: a client's name for its answer
    (``ToolResultMessage.item``), when it gave one.
    """

    content: str
    payload: ResultPayload
    id: str | msgspec.UnsetType = msgspec.UNSET
    item: str | msgspec.UnsetType = msgspec.UNSET


class Metric(_Base, tag="metric"):
    """Usage: ``step`` since the turn's previous metric, ``total`` of the session.

    Every turn's closing ``end`` or ``cancelled`` is followed by one; a tool
    step gets one after its ``execute``. ``estimated`` is ``true`` (and only
    then present) when some of ``step`` was estimated from characters because
    the provider reported no usage (a lost connection, a provider with no cancel).
    """

    step: Usage
    total: Usage
    cost: Cost = msgspec.field(default_factory=Cost)
    estimated: bool | msgspec.UnsetType = msgspec.UNSET


class Error(_Base, tag="error"):
    """Something failed. ``content`` says what and what to do; ``code`` names it.

    ``reply_to``: the ``id`` of the client's command this refuses (present when the
    command carried one); clients match a refusal by ``code`` and ``reply_to``,
    never by ``content``, whose wording may change.
    """

    content: str
    code: str = "internal"
    reply_to: str | msgspec.UnsetType = msgspec.UNSET


class Guardrail(_Base, tag="guardrail"):
    """A guardrail rule tripped (``protocol.guardrails``): its name and action, never
    the matched text. ``on``: ``"input"`` (a user's message, a transcript, a tool's
    result; ``block``: it never reached the model, the session takes the next turn) or
    ``"output"`` (the model's answer, reasoning or call arguments: redacted or cut).
    ``reply_to``: the ``id`` of the ``user`` message it judged (when it carried one).
    """

    rule: str
    action: Literal["block", "redact", "end_turn"]
    on: Literal["input", "output"]
    reply_to: str | msgspec.UnsetType = msgspec.UNSET

    def refusal(self) -> str | None:
        """Why a door with no ``guardrail`` event (OpenAI's) refuses the message this
        blocked, naming the rule; None when it blocked none."""
        if self.on != "input" or self.action == "redact":
            return None
        return f"the message was blocked by the guardrail {self.rule!r}; the model never got it"


class Interrupt(_Base, tag="interrupt"):
    """The turn in flight was broken (node loss, upstream loss) and is rerun.

    ``context`` says what the model kept of the conversation on the new
    connection: ``resumed`` (the provider continued its own copy, by a
    resumption handle) or ``rebuilt`` (it was given the session's history
    again, cut to the node's context budget). Absent when no connection
    was opened for the rerun yet.
    """

    content: str = ""
    context: Literal["resumed", "rebuilt"] | msgspec.UnsetType = msgspec.UNSET


class Cancelled(_Base, tag="cancelled"):
    """The user cancelled the running turn (persisted: the model sees it later).

    ``reason`` is ``"barge_in"`` (and only then present) when the user's speech
    cancelled it rather than a ``cancel`` frame; ``heard_ms`` then says how much
    of the spoken answer the client had played (its newest ``played`` report).
    """

    content: str = ""
    reason: Literal["barge_in"] | msgspec.UnsetType = msgspec.UNSET
    heard_ms: int | msgspec.UnsetType = msgspec.UNSET
    reply_to: str | msgspec.UnsetType = msgspec.UNSET


class Configured(_Base, tag="configured"):
    """The session's effective configuration after a change (logged: every node and
    every client of the session sees the same one)."""

    config: SessionConfig
    reply_to: str | msgspec.UnsetType = msgspec.UNSET


class Forgotten(_Base, tag="forgotten"):
    """The model no longer sees the user messages and answer text logged from seq
    ``first`` through ``last`` (a ``forget``): left out of the history every later
    upstream connection is given. Logged, and kept in history as the record of it."""

    first: int
    last: int
    reply_to: str | msgspec.UnsetType = msgspec.UNSET


class Dtmf(_Base, tag="dtmf"):
    """A phone caller pressed a key (``digit``: 0-9, ``*``, ``#``, A-D): logged, so
    every client of the session sees it; the session's ``dtmf`` setting says
    whether the model is told too."""

    digit: str


class PhoneCall(_Base, tag="phone_call"):
    """A phone call on the session started or ended (the carrier's stream).

    ``ended`` carries ``reason`` (``hangup``: the carrier stopped the stream;
    ``end_call``/``transfer``: the model's tools; ``lost``: the stream's
    socket closed without a stop; ``drain``: the node's drain timeout) and
    the call's ``metrics``.
    """

    status: Literal["started", "ended"]
    carrier: str
    call: str = ""
    caller: str = ""
    called: str = ""
    reason: str | msgspec.UnsetType = msgspec.UNSET
    metrics: PhoneCallMetrics | msgspec.UnsetType = msgspec.UNSET


class ApprovalRequired(_Base, tag="approval_required"):
    """Call ``id`` waits for a user's decision: it runs only after an ``approve`` with
    ``decision: "allow"`` and this ``digest`` (the SHA-256 of the call's id, name and
    args), from a connection allowed to approve. Logged: a client that resumes sees it
    in its replay; it stays pending until an ``approval`` event answers it."""

    id: str
    name: str
    args: dict[str, Any]
    digest: str


class Approval(_Base, tag="approval"):
    """The decision on call ``id``'s approval (logged, once): ``allow`` or ``deny``;
    ``reason: "timeout"`` when nobody decided within the approval timeout (a deny)."""

    id: str
    digest: str
    decision: Literal["allow", "deny"]
    reason: Literal["timeout"] | msgspec.UnsetType = msgspec.UNSET
    reply_to: str | msgspec.UnsetType = msgspec.UNSET


class Pong(_Base, tag="pong"):
    """The answer to a client's ``ping`` (unlogged: ``seq`` is the last one sent)."""

    reply_to: str | msgspec.UnsetType = msgspec.UNSET


class AudioCleared(_Base, tag="audio_cleared"):
    """The answer to ``clear_audio`` (unlogged, as ``pong``): the audio is discarded."""

    reply_to: str | msgspec.UnsetType = msgspec.UNSET


class Session(_Base, tag="session"):
    """First frame of every connection: which session, where its log stands."""

    session_id: str
    resumed: bool = False
    provider: str = ""
    node: str = ""


Event = (
    Session
    | User
    | Replying
    | Context
    | Configured
    | Think
    | Call
    | Execute
    | Result
    | Respond
    | End
    | Metric
    | Error
    | Guardrail
    | Interrupt
    | Cancelled
    | Forgotten
    | SpeechStarted
    | SpeechStopped
    | Dtmf
    | PhoneCall
    | ApprovalRequired
    | Approval
    | Pong
    | AudioCleared
)


# --- client → server ----------------------------------------------------------

COMMAND_ID_MAX: Final = 128

CommandId = Annotated[str, msgspec.Meta(min_length=1, max_length=COMMAND_ID_MAX)]
"""A client's name for one of its commands, echoed as ``reply_to`` on the ``error``
that refuses it and on the event that shows it took effect (``user``, ``cancelled``,
``configured``, ``approval``; ``pong`` for a ``ping``). ``tool_result`` and
``approve`` have a required ``id`` already, the call's: it is their command id."""

ITEM_ID_MAX: Final = 64

ItemId = Annotated[str, msgspec.Meta(min_length=1, max_length=ITEM_ID_MAX)]
"""A client's own name for a message or tool answer it sends, logged with it (``user``'s,
``context``'s, ``result``'s ``item``): an OpenAI client's ``item.id``, which every client of
the session then sees. 64 characters (docs/openai-door.md, "Client item ids")."""


class UserMessage(msgspec.Struct, tag_field="type", tag="user"):
    """Start a turn with this text (``item``: its name, see ``ItemId``)."""

    content: str
    id: CommandId | msgspec.UnsetType = msgspec.UNSET
    item: ItemId | msgspec.UnsetType = msgspec.UNSET


class ReplyNow(msgspec.Struct, tag_field="type", tag="reply"):
    """Start a turn with no new user message: the model answers the conversation as it
    is (its instructions, what was said). Logged as ``reply``; refused as a user
    message is while a turn runs."""

    id: CommandId | msgspec.UnsetType = msgspec.UNSET


class ContextMessage(msgspec.Struct, tag_field="type", tag="context"):
    """Add ``content`` as ``role``'s message without starting a turn (logged as
    ``context``); sent while the model answers, it goes in once the answer is written.
    ``system`` and ``assistant`` need the API key (docs/protocol.md)."""

    role: Role
    content: str
    id: CommandId | msgspec.UnsetType = msgspec.UNSET
    item: ItemId | msgspec.UnsetType = msgspec.UNSET


class Cancel(msgspec.Struct, tag_field="type", tag="cancel"):
    """Cancel the running turn."""

    id: CommandId | msgspec.UnsetType = msgspec.UNSET


class Ping(msgspec.Struct, tag_field="type", tag="ping"):
    """Application-level keepalive for clients that cannot send WebSocket pings.

    Answered with a ``pong`` event, so a client can also measure the round trip.
    """

    id: CommandId | msgspec.UnsetType = msgspec.UNSET


class ToolResultMessage(msgspec.Struct, tag_field="type", tag="tool_result", frozen=True):
    """The client's answer to a ``call`` with ``"runs_on": "client"`` (matched by ``id``).

    ``content``: any JSON value on success; on failure, a message for the model.
    ``item``: the answer's own name (see ``ItemId``).
    """

    id: str
    status: Literal["success", "failure"]
    content: Any = None
    item: ItemId | msgspec.UnsetType = msgspec.UNSET


class AudioChunk(msgspec.Struct, tag_field="type", tag="audio"):
    """User audio for a client that cannot send binary frames: PCM16 LE mono at
    the configured ``input_audio.rate``, base64 in JSON (a binary frame is the
    same bytes without the base64)."""

    audio: bytes
    id: CommandId | msgspec.UnsetType = msgspec.UNSET


class Played(msgspec.Struct, tag_field="type", tag="played", frozen=True):
    """How much of the model's spoken answer the client actually played: ``ms`` of it,
    up to the audio frame tagged ``seq``. Sent as playback goes on (and when it stops
    at a barge-in); a barge-in tells the provider (and the log) what the user heard."""

    seq: Annotated[int, msgspec.Meta(ge=0)]
    ms: Annotated[int, msgspec.Meta(ge=0)]
    id: CommandId | msgspec.UnsetType = msgspec.UNSET


class Commit(msgspec.Struct, tag_field="type", tag="commit"):
    """End the user's spoken turn (``input_audio.turn_detection: "none"``) and get the answer."""

    id: CommandId | msgspec.UnsetType = msgspec.UNSET


class Forget(msgspec.Struct, tag_field="type", tag="forget", frozen=True):
    """Take the user messages and answer text logged from seq ``first`` through
    ``last`` out of what the model sees (a ``user`` event's seq, or an answer's
    first and last ``respond`` chunks); calls and their results stay. Between
    turns only; answered by ``forgotten``."""

    first: Annotated[int, msgspec.Meta(ge=1)]
    last: Annotated[int, msgspec.Meta(ge=1)]
    id: CommandId | msgspec.UnsetType = msgspec.UNSET


class ClearAudio(msgspec.Struct, tag_field="type", tag="clear_audio", frozen=True):
    """Discard the user's audio not yet committed (held by the gateway, buffered by the
    provider), where the provider can (its ``clear_audio`` control); ``audio_cleared``
    answers it."""

    id: CommandId | msgspec.UnsetType = msgspec.UNSET


class Approve(msgspec.Struct, tag_field="type", tag="approve", frozen=True):
    """The user's decision on a call that waits for approval (an ``approval_required``):
    ``digest`` must be that event's, so a decision applies to exactly the call shown."""

    id: str
    digest: str
    decision: Literal["allow", "deny"]


class Configure(ConfigChange, frozen=True, tag_field="type", tag="configure"):
    """Change this session's configuration (only the fields given); see ``protocol.configuration``."""

    id: CommandId | msgspec.UnsetType = msgspec.UNSET


TurnCommand = (
    UserMessage | ReplyNow | ContextMessage | Cancel | ToolResultMessage | Approve | Commit | Played
)
"""The client messages the session's turn machine takes as they are (each an input of
``protocol.turn_events.TurnInput``, with its row in ``protocol.turn_table``)."""

ClientMessage = TurnCommand | Ping | Configure | AudioChunk | Forget | ClearAudio
"""Every client message: the machine's commands, and those the session or the connection
answers itself (``configure``, ``forget``, ``clear_audio``; ``ping``, ``audio``)."""

CLIENT_MESSAGE_TYPES: Final[tuple[str, ...]] = tuple(
    str(kind.__struct_config__.tag) for kind in typing.get_args(ClientMessage)
)
"""The ``type`` of every client message, derived from the union (a new member is in it)."""


_Answer = typing.TypeVar(
    "_Answer",
    Error,
    Pong,
    User,
    Replying,
    Context,
    Cancelled,
    Configured,
    Approval,
    Forgotten,
    AudioCleared,
)


def answering(event: _Answer, message: object) -> _Answer:
    """``event`` as the answer to ``message``: ``reply_to`` the message's ``id``, if any."""
    ref = getattr(message, "id", msgspec.UNSET)
    if isinstance(ref, str):
        event.reply_to = ref
    return event


# --- encode / decode (a client's frames: protocol.client_frames) -----------------

_encoder: Final = msgspec.json.Encoder()
_event_decoder: Final = msgspec.json.Decoder(Event)


def encode(event: Event) -> bytes:
    """The event as one JSON text frame's bytes (seed schema + ``seq``)."""
    return _encoder.encode(event)


def decode_event(data: bytes | str) -> Event:
    """Parse a server event (used by clients, tests and log replay).

    Raises ``msgspec.ValidationError``/``DecodeError`` on bad input: server events
    come from the gateway itself, so bad input here is a bug, not user error.
    """
    return _event_decoder.decode(data)
