"""The turn machine's vocabulary: its inputs and its actions (as h11's ``_events.py``).

``protocol.turn.TurnMachine`` takes these inputs and returns these actions;
nothing here holds state. The inputs come from three places, and each feeds
its own kind without translation:

- **the client** (``protocol.events.TurnCommand``): ``UserMessage``, ``ContextMessage``, ``Cancel``,
  ``ToolResultMessage`` (a client tool's answer), ``Approve`` (a decision on
  a call that waits for approval), ``Commit`` (end of a spoken turn) and
  ``Played`` (playback reports) are the client's frames themselves, and a
  command added there is an input here with no edit in this file;
- **the upstream adapters** (``gateway.upstream``): ``TextDelta``,
  ``ResponseDone``, ``SpeechBegan``, ``SpeechEnded``, ``Transcript``,
  ``ResponseBegan``, ``Spoken``, ``Thought`` and ``NativeCall`` are what an adapter's
  ``recv()`` returns;
- **the shell** (``gateway.sessions``): ``Rerun``, ``Resume``, ``UpstreamFailed``,
  ``UpstreamLost``, ``CallDone``, ``ToolsDone``, ``ClientTimeout``, ``ApprovalTimeout``, ``RetryNow``,
  ``ShellFailed`` and ``Shutdown`` report what its I/O and timers found, and
  ``GuardrailCut`` what its guardrails did.

An action is a protocol ``Event`` ("log it, then send it") or one of the
Structs below, which the shell performs. ``TurnInput`` and ``Action`` are
the unions; ``INPUT_TYPES`` and ``ACTION_TYPES`` are derived from them, so a
table keyed by them that misses a member fails a test instead of dropping it.
"""

from __future__ import annotations

import enum
import typing
from typing import Any, Final

import msgspec

from protocol.assembly import HistoryItem, Message
from protocol.calls import ToolCall, ToolResult
from protocol.events import (
    Approve,
    Call,
    Cancel,
    Commit,
    ContextMessage,
    Error,
    Event,
    Played,
    ReplyNow,
    Respond,
    Think,
    ToolResultMessage,
    TurnCommand,
    Usage,
    UserMessage,
)
from protocol.journal import JournalCall

__all__ = [
    "ACTION_TYPES",
    "EVENT_TYPES",
    "GUARDRAIL_CANCEL",
    "INPUT_TYPES",
    "Account",
    "Action",
    "AddMessage",
    "AddNote",
    "ApprovalTimeout",
    "Approve",
    "Await",
    "AwaitApproval",
    "AwaitClient",
    "BackgroundDone",
    "Backoff",
    "CallDone",
    "Cancel",
    "CancelBackground",
    "ClientTimeout",
    "Commit",
    "CommitAudio",
    "ContextMessage",
    "DropUpstream",
    "GuardrailCut",
    "NativeCall",
    "Opened",
    "Persist",
    "Played",
    "Reconfigured",
    "Refuse",
    "ReplaceResponse",
    "ReplyNow",
    "Request",
    "Rerun",
    "ResponseBegan",
    "ResponseDone",
    "Resume",
    "ResumeBackground",
    "RetryNow",
    "RunTools",
    "ShellFailed",
    "Shutdown",
    "Source",
    "SpeechBegan",
    "SpeechEnded",
    "Spoken",
    "StartBackground",
    "StopResponse",
    "TextDelta",
    "Thought",
    "Tick",
    "ToolResultMessage",
    "ToolsDone",
    "Transcript",
    "TurnInput",
    "TurnStarted",
    "UpstreamFailed",
    "UpstreamLost",
    "UpstreamStalled",
    "UserMessage",
]


# --- inputs -----------------------------------------------------------------------


class _Input(msgspec.Struct, frozen=True, tag_field="input"):
    pass


class Rerun(_Input, frozen=True, tag="rerun"):
    """After a takeover, rerun the turn history shows in flight (see ``turn_in_flight``)."""

    reason: str


class TextDelta(_Input, frozen=True, tag="text_delta"):
    """A piece of the running response's text (hot path: prefer ``TurnMachine.text``)."""

    text: str


class ResponseDone(_Input, frozen=True, tag="response_done"):
    """The running response finished; ``usage`` as the provider reported it, if it did.

    ``status``: ``completed``, ``cancelled``, ``failed`` or ``incomplete``;
    ``estimated``: the adapter estimated ``usage`` (the provider gave none).
    """

    status: str
    usage: Usage | None = None
    detail: str = ""
    estimated: bool = False


class UpstreamFailed(_Input, frozen=True, tag="upstream_failed"):
    """The provider reported an error; the connection is still up.

    ``fallback``: the provider the shell will use next, when the error is one
    a retry will not fix and another provider is configured (see ``UpstreamLost``).
    """

    code: str
    message: str
    fallback: str = ""


class UpstreamLost(_Input, frozen=True, tag="upstream_lost"):
    """The upstream connection is gone, or could not be opened or used (``reason``: for logs).

    ``fatal``: reconnecting to the same provider will not help (auth, quota,
    model refused), so without a fallback the turn fails at once.
    ``fallback``: the provider the next connection goes to (the shell's
    breaker decided; "" when it is the same one). The step is rerun there at
    once, from history, with an ``interrupt`` naming it if the client saw part
    of the step. A fallback counts as an attempt, so the turn still ends when
    every provider keeps failing.
    """

    reason: str
    fatal: bool = False
    fallback: str = ""


class UpstreamStalled(_Input, frozen=True, tag="upstream_stalled"):
    """The provider sent nothing for ``seconds`` while a response ran (the shell's
    watch, ``upstream_stall_timeout``): a hung or dripping connection.

    The first stall of a step reruns it on a new connection (an ``interrupt``
    says so); a second one ends the turn with ``error`` code ``upstream_timeout``.
    """

    seconds: float


class ToolsDone(_Input, frozen=True, tag="tools_done"):
    """The batch asked for by ``RunTools`` finished; results in call order."""

    results: tuple[ToolResult, ...]


class CallDone(_Input, frozen=True, tag="call_done"):
    """One server call of the running batch finished (before ``ToolsDone``): log its outcome."""

    id: str
    result: ToolResult


class Resume(_Input, frozen=True, tag="resume"):
    """After a takeover, finish the batch history shows in flight (it ends with its calls).

    ``calls``: the batch as the log shows it, with the outcomes it logged;
    only the calls without one run again (or are asked of the client again).
    """

    reason: str
    calls: tuple[JournalCall, ...]


class BackgroundDone(_Input, frozen=True, tag="background_done"):
    """A background call finished (``StartBackground``): log it; the model gets it next."""

    id: str
    result: ToolResult


class ResumeBackground(_Input, frozen=True, tag="resume_background"):
    """After a takeover: the background calls history shows without a delivered result.

    Those with a logged outcome are due to the model; the others run again
    (``StartBackground``, same ids and keys).
    """

    calls: tuple[JournalCall, ...]


class ClientTimeout(_Input, frozen=True, tag="client_timeout"):
    """``seconds`` passed since ``AwaitClient``: the calls still unanswered fail."""

    seconds: float


class ApprovalTimeout(_Input, frozen=True, tag="approval_timeout"):
    """``seconds`` passed since ``AwaitApproval``: the calls still undecided are denied."""

    seconds: float


class Tick(_Input, frozen=True, tag="tick"):
    """The shell's clock (loop time, seconds): the timers the machine armed with
    ``AwaitClient`` or ``AwaitApproval`` start at ``now``, and those due by ``now``
    fire. Feed it as those actions are performed and when an ``Await``'s deadline passes."""

    now: float


class Reconfigured(_Input, frozen=True, tag="reconfigured"):
    """The session's setup changed (``configure``, the owner's rights): the next model
    step asks a connection opened for the new one (``Request.fresh``)."""


class Opened(_Input, frozen=True, tag="opened"):
    """The shell opened an upstream connection for setup number ``setup``
    (``TurnMachine.setup``, read as the open began); ``kept``: it kept the open one
    for that setup instead (it told the provider what a new one would). ``audio_ms``:
    the session's audio the connections before a new one were sent."""

    setup: int
    kept: bool = False
    audio_ms: int = 0


class RetryNow(_Input, frozen=True, tag="retry_now"):
    """The ``Backoff`` delay is over."""


class ShellFailed(_Input, frozen=True, tag="shell_failed"):
    """The shell hit an unexpected error performing an action (a bug): end the turn."""

    what: str


class Shutdown(_Input, frozen=True, tag="shutdown"):
    """The session stops on this node (lease lost, drain): forget the turn, write nothing."""


# Voice: what the provider's VAD, transcription and native tools report.


class SpeechBegan(_Input, frozen=True, tag="speech_began"):
    """The user started speaking (``offset_ms`` into the audio sent): barge-in if a turn runs."""

    offset_ms: int


class SpeechEnded(_Input, frozen=True, tag="speech_ended"):
    """The user stopped speaking: a spoken turn begins (the provider answers by itself)."""

    offset_ms: int


class Transcript(_Input, frozen=True, tag="transcript"):
    """What the user said in the spoken turn, as text (the turn's ``user`` event)."""

    text: str


class ResponseBegan(_Input, frozen=True, tag="response_began"):
    """A response started that the session did not ask for (server VAD answered the user)."""


class Thought(_Input, frozen=True, tag="thought"):
    """A piece of the model's thinking that the provider reports as such (a model
    that does not write the text protocol): a ``think`` chunk as is."""

    text: str


class Spoken(_Input, frozen=True, tag="spoken"):
    """A piece of the transcript of the model's spoken answer: a ``respond`` chunk as is
    (audio output has no text protocol to parse)."""

    text: str


class NativeCall(_Input, frozen=True, tag="native_call"):
    """The model called a declared function (audio output); ``arguments`` is JSON text."""

    call_id: str
    name: str
    arguments: str


GUARDRAIL_CANCEL: Final = "~guardrail"
"""The id of the ``cancel`` an ``end_turn`` rule sends: the turn ends "stopped by a
guardrail", not "cancelled by the user" (``TurnMachine._cancel``)."""


class GuardrailCut(_Input, frozen=True, tag="guardrail_cut"):
    """A guardrail stopped the spoken answer (``gateway.sessions.guard``): its clients
    were sent ``heard_ms`` of its audio and get no more. ``done``: the provider's
    response is complete already (nothing to stop)."""

    heard_ms: int
    done: bool = False


TurnInput = (
    TurnCommand
    | Rerun
    | TextDelta
    | ResponseDone
    | UpstreamFailed
    | UpstreamLost
    | UpstreamStalled
    | ToolsDone
    | CallDone
    | Resume
    | BackgroundDone
    | ResumeBackground
    | ApprovalTimeout
    | ClientTimeout
    | Tick
    | Reconfigured
    | Opened
    | RetryNow
    | ShellFailed
    | Shutdown
    | SpeechBegan
    | SpeechEnded
    | Transcript
    | ResponseBegan
    | Spoken
    | Thought
    | NativeCall
    | GuardrailCut
)


# --- actions ----------------------------------------------------------------------


class _Action(msgspec.Struct, frozen=True, tag_field="action"):
    pass


class Persist(_Action, frozen=True, tag="persist"):
    """Add these items to history (written atomically with the next log append).

    ``firsts``: the first logged event of each of the first items (a step's), whose
    seq the item takes once it is logged; the other items take the seq of the
    event logged last (a user message's own)."""

    items: tuple[HistoryItem, ...]
    firsts: tuple[Think | Respond | Call, ...] = ()


class Account(_Action, frozen=True, tag="account"):
    """Charge ``usage`` (token counters, per-key quota); the next ``Metric`` reports it."""

    usage: Usage


class TurnStarted(_Action, frozen=True, tag="turn_started"):
    """A turn begins (count it)."""


class Request(_Action, frozen=True, tag="request"):
    """Ask the model for a response.

    With an open upstream: add ``message`` (if any) and start a response. With
    none: open a fresh one whose context is rebuilt from history — which
    already ends with ``message``, persisted before — and start a response.
    If this fails, feed ``UpstreamLost``.

    ``outputs`` (native function calls): answer each ``(call_id, output)``
    before starting the response; a fresh connection needs none (history
    holds the results). ``fresh``: the open connection was opened for an
    older setup (``Reconfigured``): let it go and open a new one.
    """

    message: Message | None = None
    outputs: tuple[tuple[str, str], ...] = ()
    fresh: bool = False


class CommitAudio(_Action, frozen=True, tag="commit_audio"):
    """End the user's spoken turn at the provider; the response follows. If this
    fails, feed ``UpstreamLost``."""


class StopResponse(_Action, frozen=True, tag="stop_response"):
    """Ask the provider to stop the running response (a ``ResponseDone`` follows).

    If this fails, feed ``UpstreamLost``.
    """


class ReplaceResponse(_Action, frozen=True, tag="replace_response"):
    """Make the upstream conversation hold ``text`` as the stopped response's output.

    ``heard_ms``: a spoken answer the client played this much of (a barge-in):
    the provider keeps what the user heard. Best effort: if the upstream is
    gone, drop it; the next ``Request`` reopens from history, which says the
    same thing. Nothing is fed back.
    """

    text: str
    heard_ms: int | None = None


class AddMessage(_Action, frozen=True, tag="add_message"):
    """Append ``message`` (a ``context``) to the open connection's conversation, no
    response asked for. With none open, nothing: the next one is given it from history."""

    message: Message


class AddNote(_Action, frozen=True, tag="add_note"):
    """Tell the open connection a gateway note (a user message), no response asked for.

    A barge-in on an answer the open connection did not write (it was opened
    after it, for a configure, and given it whole from history) cannot cut that
    copy: the note says how much the user heard, as history tells a connection
    opened later. Best effort, as ``ReplaceResponse``.
    """

    content: str


class RunTools(_Action, frozen=True, tag="run_tools"):
    """Run the batch's server calls; feed ``CallDone`` as each finishes (its outcome is
    logged at once), then ``ToolsDone`` with all their results, in order.

    ``ids``: the calls' ids, parallel to ``calls``; each call's idempotency key
    is derived from its id (``protocol.journal.idempotency_key``). Run them
    only once the events before this action are logged: a node that takes
    over must know every call that may have run.
    """

    calls: tuple[ToolCall, ...]
    ids: tuple[str, ...] = ()


class StartBackground(_Action, frozen=True, tag="start_background"):
    """Run these server calls in the background (performed at once, not awaited): once
    the events before this action are logged, as ``RunTools``; feed ``BackgroundDone``
    as each finishes."""

    calls: tuple[ToolCall, ...]
    ids: tuple[str, ...]


class CancelBackground(_Action, frozen=True, tag="cancel_background"):
    """Cancel the background calls ``ids`` (their ``result`` events are out already)."""

    ids: tuple[str, ...]


class AwaitClient(_Action, frozen=True, tag="await_client"):
    """The client-side calls ``ids`` are out: start their timer (performed at once).

    Feed ``ToolResultMessage`` as answers arrive, and ``ClientTimeout`` when the
    session's client tool timeout passes while ``TurnMachine.awaits_client``.
    """

    ids: tuple[str, ...]


class AwaitApproval(_Action, frozen=True, tag="await_approval"):
    """Calls ``ids`` wait for a user's decision (their ``approval_required`` is out):
    start the approval timer (performed at once). Feed ``Approve`` as decisions come,
    and ``ApprovalTimeout`` when the approval timeout passes while
    ``TurnMachine.awaits_approval``."""

    ids: tuple[str, ...]


class DropUpstream(_Action, frozen=True, tag="drop_upstream"):
    """Let the upstream go (closed in the background); the next ``Request`` opens a fresh one.

    ``stop``: a response may still run there: stop it first, so it stops billing.
    """

    stop: bool = False


class Backoff(_Action, frozen=True, tag="backoff"):
    """Wait ``delay`` seconds before retry ``attempt``, then feed ``RetryNow``."""

    attempt: int
    delay: float


class Refuse(_Action, frozen=True, tag="refuse"):
    """The command is refused: send ``error`` back to whoever sent it (not logged)."""

    error: Error


Action = (
    Event
    | Persist
    | Account
    | TurnStarted
    | Request
    | CommitAudio
    | StopResponse
    | ReplaceResponse
    | AddMessage
    | AddNote
    | RunTools
    | AwaitClient
    | AwaitApproval
    | StartBackground
    | CancelBackground
    | DropUpstream
    | Backoff
    | Refuse
)


# --- waits -------------------------------------------------------------------------


class Source(enum.Enum):
    """What the shell waits on between actions (``TurnMachine.wait``)."""

    NOTHING = "nothing"
    """No turn runs and nobody listens: the driver stops."""
    RESPONSE = "response"
    """The running response's events (the link's stall watch bounds the silence)."""
    UPSTREAM = "upstream"
    """The upstream's events; none by the deadline means the connection is lost."""
    LISTEN = "listen"
    """The upstream's events, while a command may come (it interrupts the read); at
    the deadline, feed ``Tick``."""
    COMMAND = "command"
    """A command (a client's result, a decision, a cancel); at the deadline, feed ``Tick``."""


class Await(msgspec.Struct, frozen=True):
    """What the shell waits for next, and until when (loop time; None: no deadline)."""

    source: Source
    deadline: float | None = None


def _members(union: Any) -> frozenset[type]:
    return frozenset(typing.get_args(union))


INPUT_TYPES: Final = _members(TurnInput)
"""Every kind of input ``TurnMachine.feed`` takes."""
EVENT_TYPES: Final = _members(Event)
"""The actions that mean "log it, then send it"."""
ACTION_TYPES: Final = _members(Action) - EVENT_TYPES
"""The actions the shell performs (every action that is not an event)."""
