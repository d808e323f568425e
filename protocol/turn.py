"""The turn as a pure state machine. Nothing else holds the state of a session's turns.

``TurnMachine`` decides everything about a turn: which events the client
sees and in what order, what goes into history, when the model is asked,
stopped or handed tool results, when a lost upstream is retried, and how the
turn ends. It is sans-I/O in the style of h11's ``_state.py``: no asyncio, no
socket, no clock. The session runtime (``gateway.sessions.runtime``) is the
I/O shell that feeds it *inputs* and performs the *actions* it returns; the
shell holds no turn state of its own (no flags, no counters), so a new
capability — client-side tools, barge-in, native tool calls, provider
fallback — is a new input or action and new transitions here.

**Inputs** (``TurnInput``, frozen and tagged): ``UserMessage``, ``Rerun``,
``TextDelta``, ``ResponseDone``, ``UpstreamFailed``, ``UpstreamLost``,
``ToolsDone``, ``ClientResult``, ``ClientTimeout``, ``RetryNow``, ``Cancel``,
``ShellFailed``, ``Shutdown``, and for voice ``SpeechBegan``, ``SpeechEnded``,
``CommitSpeech``, ``Transcript``, ``ResponseBegan``, ``Spoken``,
``NativeCall``. Feed them with ``feed``; a text delta also has the fast path
``text``.

**Actions** (``Action``): a protocol ``Event`` means "log it, then send it"
(the shell stamps ``seq``/``timestamp``); the rest are the frozen Structs
below (``Persist``, ``Account``, ``TurnStarted``, ``Request``,
``CommitAudio``, ``StopResponse``, ``ReplaceResponse``, ``AwaitClient``,
``RunTools``, ``DropUpstream``, ``Backoff``, ``Refuse``). Every action list
puts the ones the shell performs at once (events, ``Persist``, ``Account``,
``TurnStarted``, ``DropUpstream``, ``Refuse``) before the ones that start or
await a wait (``AwaitClient``, ``Request``, ``CommitAudio``, ``StopResponse``,
``ReplaceResponse``, ``RunTools``, ``Backoff``). A ``Cancel`` supersedes
whatever the shell had not performed yet, so it can interrupt an await and
drop the rest.

**Inputs that make no sense in a state** (a delta while no response runs, a
cancel with no turn, tool results nobody asked for) return ``()`` or a
``Refuse`` — never an exception: they come from the network and from
timing, not from a bug.

**The end of a turn** (issue 18): every turn ends with exactly one closing
event, ``end`` or ``cancelled``, followed by exactly one ``metric``. An error
that stops the turn comes just before its ``end``. A ``metric``'s ``step`` is
the usage since the turn's previous ``metric`` (zero when no model step ran
since), its ``total`` the session's; a tool step also gets a ``metric`` right
after its ``execute``. Usage the provider did not report (a lost connection,
a provider without a cancel) is estimated from characters and the metric says
``estimated: true``. ``Account`` precedes the metric that reports the same
usage, so the token counters and quotas always agree with the client's view.

**Client tools** (issue 14): a call to a tool the session's client declared
(``client_tools``, a ``ClientToolRouter``) is sent with ``runs_on: "client"``
and an ``id``; its arguments are checked first, and a call that fails the
check is answered by the gateway at once with a failure (``runs_on:
"gateway"``). Native function calls of a voice session (``NativeCall``) are
routed the same way. At ``</execute>`` (or a native response's end) the batch splits: server calls go out as
``RunTools`` (they run while the client works), client calls as
``AwaitClient``; the machine stays in ``tools`` until every call has a
result — ``ToolsDone`` for the server ones, ``ClientResult`` per client call,
``ClientTimeout`` for those the client left unanswered — and the ``result``
event keeps call order. A ``ClientResult`` nobody waits for is refused with
``unknown_call`` (saying whether it was already answered, timed out or
cancelled), never an exception.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final, Literal, Protocol

import msgspec

from protocol.assembly import HistoryItem, Message, results_message
from protocol.calls import (
    ToolCall,
    ToolResult,
    decode_call,
    encode_call,
    encode_results,
    result_payload,
)
from protocol.configuration import MAX_ARGS_DEPTH, json_depth
from protocol.events import (
    Call,
    Cancelled,
    End,
    Error,
    Event,
    Execute,
    Interrupt,
    Metric,
    Respond,
    Result,
    SpeechStarted,
    SpeechStopped,
    Think,
    Usage,
    User,
)
from protocol.parser import Parser
from protocol.steps import StepRecorder

__all__ = [
    "Account",
    "Action",
    "AwaitClient",
    "Backoff",
    "Cancel",
    "ClientResult",
    "ClientTimeout",
    "ClientToolRouter",
    "CommitAudio",
    "CommitSpeech",
    "DropUpstream",
    "NativeCall",
    "Persist",
    "Refuse",
    "ReplaceResponse",
    "Request",
    "Rerun",
    "ResponseBegan",
    "ResponseDone",
    "RetryNow",
    "RunTools",
    "ShellFailed",
    "Shutdown",
    "SpeechBegan",
    "SpeechEnded",
    "Spoken",
    "StopResponse",
    "TextDelta",
    "ToolsDone",
    "Transcript",
    "TurnInput",
    "TurnMachine",
    "TurnStarted",
    "TurnState",
    "UpstreamFailed",
    "UpstreamLost",
    "UserMessage",
    "estimate_tokens",
    "turn_in_flight",
]


# --- inputs -----------------------------------------------------------------------


class _Input(msgspec.Struct, frozen=True, tag_field="input"):
    pass


class UserMessage(_Input, frozen=True, tag="user_message"):
    """The user sent a message: start a turn (or queue it behind a closing one)."""

    text: str


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


class ToolsDone(_Input, frozen=True, tag="tools_done"):
    """The batch asked for by ``RunTools`` finished; results in call order."""

    results: tuple[ToolResult, ...]


class ClientResult(_Input, frozen=True, tag="client_result"):
    """A client answered the client-side call ``id`` (a ``tool_result`` frame)."""

    id: str
    status: Literal["success", "failure"]
    content: Any = None


class ClientTimeout(_Input, frozen=True, tag="client_timeout"):
    """``seconds`` passed since ``AwaitClient``: the calls still unanswered fail."""

    seconds: float


class RetryNow(_Input, frozen=True, tag="retry_now"):
    """The ``Backoff`` delay is over."""


class Cancel(_Input, frozen=True, tag="cancel"):
    """The user cancelled the running turn."""


class ShellFailed(_Input, frozen=True, tag="shell_failed"):
    """The shell hit an unexpected error performing an action (a bug): end the turn."""

    what: str


class Shutdown(_Input, frozen=True, tag="shutdown"):
    """The session stops on this node (lease lost, drain): forget the turn, write nothing."""


# Voice (issue 16): what the provider's VAD, transcription and native tools report.


class SpeechBegan(_Input, frozen=True, tag="speech_began"):
    """The user started speaking (``offset_ms`` into the audio sent): barge-in if a turn runs."""

    offset_ms: int


class SpeechEnded(_Input, frozen=True, tag="speech_ended"):
    """The user stopped speaking: a spoken turn begins (the provider answers by itself)."""

    offset_ms: int


class CommitSpeech(_Input, frozen=True, tag="commit_speech"):
    """The client ended its spoken turn itself (turn detection ``none``)."""


class Transcript(_Input, frozen=True, tag="transcript"):
    """What the user said in the spoken turn, as text (the turn's ``user`` event)."""

    text: str


class ResponseBegan(_Input, frozen=True, tag="response_began"):
    """A response started that the session did not ask for (server VAD answered the user)."""


class Spoken(_Input, frozen=True, tag="spoken"):
    """A piece of the transcript of the model's spoken answer: a ``respond`` chunk as is
    (audio output has no text protocol to parse)."""

    text: str


class NativeCall(_Input, frozen=True, tag="native_call"):
    """The model called a declared function (audio output); ``arguments`` is JSON text."""

    call_id: str
    name: str
    arguments: str


TurnInput = (
    UserMessage
    | Rerun
    | TextDelta
    | ResponseDone
    | UpstreamFailed
    | UpstreamLost
    | ToolsDone
    | ClientResult
    | ClientTimeout
    | RetryNow
    | Cancel
    | ShellFailed
    | Shutdown
    | SpeechBegan
    | SpeechEnded
    | CommitSpeech
    | Transcript
    | ResponseBegan
    | Spoken
    | NativeCall
)


# --- actions ----------------------------------------------------------------------


class _Action(msgspec.Struct, frozen=True, tag_field="action"):
    pass


class Persist(_Action, frozen=True, tag="persist"):
    """Add these items to history (written atomically with the next log append)."""

    items: tuple[HistoryItem, ...]


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
    holds the results).
    """

    message: Message | None = None
    outputs: tuple[tuple[str, str], ...] = ()


class CommitAudio(_Action, frozen=True, tag="commit_audio"):
    """End the user's spoken turn at the provider; the response follows. If this
    fails, feed ``UpstreamLost``."""


class StopResponse(_Action, frozen=True, tag="stop_response"):
    """Ask the provider to stop the running response (a ``ResponseDone`` follows).

    If this fails, feed ``UpstreamLost``.
    """


class ReplaceResponse(_Action, frozen=True, tag="replace_response"):
    """Make the upstream conversation hold ``text`` as the stopped response's output.

    Best effort: if the upstream is gone, drop it; the next ``Request`` reopens
    from history, which says the same thing. Nothing is fed back.
    """

    text: str


class RunTools(_Action, frozen=True, tag="run_tools"):
    """Run the batch's server calls; feed ``ToolsDone`` with their results, in order."""

    calls: tuple[ToolCall, ...]


class AwaitClient(_Action, frozen=True, tag="await_client"):
    """The client-side calls ``ids`` are out: start their timer (performed at once).

    Feed ``ClientResult`` as answers arrive, and ``ClientTimeout`` when the
    session's client tool timeout passes while ``TurnMachine.awaits_client``.
    """

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
    | RunTools
    | AwaitClient
    | DropUpstream
    | Backoff
    | Refuse
)

# The constant actions, made once: the machine returns them without allocating.
_STOP: Final = StopResponse()
_STARTED: Final = TurnStarted()
_RETRY: Final = Request()
_COMMIT: Final = CommitAudio()
_NOTHING: Final[tuple[()]] = ()
_ZERO: Final = Usage(input=0, output=0)


# --- states -----------------------------------------------------------------------


class TurnState(enum.Enum):
    """Where the session's turn is."""

    IDLE = "idle"
    """No turn runs; a user message starts one."""
    STREAMING = "streaming"
    """A response was requested; its deltas go through the parser to the client."""
    STOPPING = "stopping"
    """The parser stopped at ``</execute>`` (or a malformed block): waiting for the response's end."""
    ENDING = "ending"
    """The model wrote ``<end>`` (``end`` is sent): waiting for the usage. A message queues."""
    TOOLS = "tools"
    """The batch runs; waiting for ``ToolsDone`` and for every client-side call's result."""
    BACKOFF = "backoff"
    """The upstream was lost mid-step; waiting for ``RetryNow`` to rerun the step."""
    CANCELLING = "cancelling"
    """``cancelled`` is sent; waiting for the stopped response's usage. A message queues."""


_IDLE: Final = TurnState.IDLE
_STREAMING: Final = TurnState.STREAMING
_STOPPING: Final = TurnState.STOPPING
_ENDING: Final = TurnState.ENDING
_TOOLS: Final = TurnState.TOOLS
_BACKOFF: Final = TurnState.BACKOFF
_CANCELLING: Final = TurnState.CANCELLING
# Where a client may already answer a call it was sent: the batch has not run yet.
_BEFORE_BATCH: Final = frozenset((TurnState.STREAMING, TurnState.STOPPING))

CANCELLED_BY_USER: Final = "cancelled by the user"
BARGED_IN: Final = "interrupted by the user's speech"
UNHEARD: Final = "(speech without a transcript)"  # a spoken turn whose transcript never came
_RESULT_ENCODER: Final = msgspec.json.Encoder()
MALFORMED_LIMIT: Final = 3  # malformed <execute> blocks in a row that stop the turn


def estimate_tokens(chars: int) -> int:
    """Tokens for ``chars`` characters of text when the provider reported none (~4 per token)."""
    return (chars + 3) // 4


class ClientToolRouter(Protocol):
    """Which calls the session's client runs, and whether their args are right.

    Implemented by ``tools.client.ClientTools`` (it holds the JSON Schemas);
    the machine only asks, so this layer stays free of schema code.
    """

    def runs_on_client(self, name: str) -> bool:
        """``name`` is a client tool this session declared (and may call)."""

    def check_args(self, call: ToolCall) -> str | None:
        """None if the args fit the tool's schema, else a failure message for the model."""


def turn_in_flight(history: Sequence[HistoryItem]) -> bool:
    """Whether history shows a turn that did not finish (it ends with the prompt or results)."""
    return bool(history) and isinstance(history[-1], User | Result)


class TurnMachine:
    """The turns of one session (see the module docstring).

    ``total`` is the session's usage so far (it grows with every ``Account``);
    ``max_steps`` bounds the model steps of a turn; ``upstream_retries`` the
    reconnects of one step before the turn fails. ``client_tools`` routes calls
    to the client (None: every call runs on the gateway); ``call_number`` is
    where call ids start (``call_<n+1>``): the shell passes the log's last seq,
    which grows by at least one per call, so ids never repeat in a session.

    ``voice`` (set by the shell while the session streams audio): the upstream
    connection carries the user's audio, so a cancelled answer is truncated
    there (``ReplaceResponse``) instead of the connection being dropped.
    """

    __slots__ = (
        "_attempt",
        "_call_events",
        "_call_ids",
        "_call_number",
        "_calls",
        "_chunk",
        "_counted",
        "_early",
        "_ended",
        "_estimated",
        "_feed",
        "_held",
        "_malformed",
        "_malformed_in_a_row",
        "_parser",
        "_queued",
        "_recorder",
        "_refused",
        "_server_running",
        "_settled",
        "_slots",
        "_speech_queued",
        "_spoken",
        "_steps",
        "_unreported",
        "_waiting",
        "client_tools",
        "max_steps",
        "state",
        "total",
        "upstream_retries",
        "voice",
    )

    def __init__(
        self,
        *,
        total: Usage = _ZERO,
        max_steps: int = 25,
        upstream_retries: int = 3,
        client_tools: ClientToolRouter | None = None,
        call_number: int = 0,
    ) -> None:
        self.state = _IDLE
        self.client_tools = client_tools
        self._call_number = call_number
        self._call_events: list[Call] = []
        # Client answers that came before the batch ran (a client may answer on `call`).
        self._early: dict[str, ClientResult] = {}
        self._refused: dict[int, str] = {}  # client calls with bad args → the failure
        # The batch in TOOLS: one slot per call, filled by whoever answers it.
        self._slots: list[ToolResult | None] = []
        self._waiting: dict[str, int] = {}  # client call id → slot
        self._server_running = False
        # Client call ids of the last batch no longer waited for → why (for unknown_call).
        self._settled: dict[str, str] = {}
        self.total = total
        self.max_steps = max_steps
        self.upstream_retries = upstream_retries
        self._queued: str | None = None  # a message sent while the turn was closing
        self._recorder = StepRecorder()
        self._chunk = self._recorder.chunk
        self._parser = Parser()
        self._feed = self._parser.feed
        self._calls: list[ToolCall] = []
        self._malformed: str | None = None
        self._ended = False  # the parser saw <end> in this step
        self._counted = False  # this attempt's usage was counted (reported or estimated)
        self._steps = 0
        self._attempt = 0
        self._malformed_in_a_row = 0
        self._unreported = _ZERO  # usage since the turn's last metric
        self._estimated = False
        self.voice = False
        self._call_ids: list[str] = []  # native calls' ids, parallel to _calls
        self._spoken: list[str] = []  # the spoken answer's transcript so far
        # A spoken turn's events waiting for its transcript (the user event comes first).
        self._held: list[Action] | None = None
        self._speech_queued = False  # the user spoke while the turn was closing

    @property
    def idle(self) -> bool:
        """No turn runs (the shell's driver may stop)."""
        return self.state is _IDLE

    @property
    def awaits_client(self) -> bool:
        """The batch waits for client-side results (the shell runs their timer)."""
        return self.state is _TOOLS and bool(self._waiting)

    @property
    def waiting_for(self) -> tuple[str, ...]:
        """Ids of the client-side calls still unanswered."""
        return tuple(self._waiting) if self.state is _TOOLS else ()

    @property
    def awaits_upstream(self) -> bool:
        """The next input comes from the upstream connection (a delta or a response's end)."""
        state = self.state
        return state is _STREAMING or state is _STOPPING or state is _ENDING or state is _CANCELLING

    # --- the hot path ---------------------------------------------------------------

    def text(self, text: str) -> Sequence[Action]:
        """A text delta. The actions are the parser's list of events (plus ``StopResponse``).

        A delta with no marker costs the parser's fast path and one recorder
        append: no action list of its own, nothing else allocated, and the
        stop check only runs when the parser returned a marker event.
        """
        if self.state is not _STREAMING:
            return _NOTHING  # the overrun after a stop marker, or leftovers of a cancel
        out = self._feed(text)
        chunk = self._chunk
        marker = False
        for event in out:
            kind = type(event)
            if kind is Think or kind is Respond:
                chunk(event)  # type: ignore[arg-type]
            else:
                marker = True
                self._marker(event)
        if marker and self._parser.stopped:
            if self._ended:
                self.state = _ENDING  # the next message may queue now
            else:
                self.state = _STOPPING  # </execute> or a malformed block: stop the model now
                out.append(_STOP)  # type: ignore[arg-type]
        if self._held is not None:
            self._held += out
            return _NOTHING
        return out

    def _marker(self, event: Event) -> None:
        kind = type(event)
        if kind is Call:
            self._recorder.add(event)
            self._add_call(decode_call(event.content), event)  # type: ignore[union-attr, arg-type]
        elif kind is End:
            self._ended = True
        elif kind is Error and event.code == "malformed_execute":  # type: ignore[union-attr]
            self._malformed = event.content  # type: ignore[union-attr]

    def _add_call(self, call: ToolCall, event: Call) -> None:
        """A call of this step (text or native): its ``id``, and who runs it."""
        self._call_number += 1
        event.id = f"call_{self._call_number}"
        router = self.client_tools
        if router is not None and router.runs_on_client(call.name):
            # Checked before the client sees it: a bad call is answered here.
            problem = router.check_args(call)
            if problem is None:
                event.runs_on = "client"
            else:
                self._refused[len(self._calls)] = problem
        self._calls.append(call)
        self._call_events.append(event)

    # --- everything else ---------------------------------------------------------------

    def feed(self, given: TurnInput) -> Sequence[Action]:
        """Everything but the hot path: the actions ``given`` calls for in this state."""
        kind = type(given)
        if kind is TextDelta:
            return self.text(given.text)  # type: ignore[union-attr]
        if kind is UserMessage:
            return self._user(given.text)  # type: ignore[union-attr]
        if kind is ResponseDone:
            return self._response_done(given)  # type: ignore[arg-type]
        if kind is ToolsDone:
            return self._tools_done(given.results)  # type: ignore[union-attr]
        if kind is ClientResult:
            return self._client_result(given)  # type: ignore[arg-type]
        if kind is ClientTimeout:
            return self._client_timeout(given.seconds)  # type: ignore[union-attr]
        if kind is UpstreamLost:
            lost: UpstreamLost = given  # type: ignore[assignment]
            return self._upstream_lost(lost.reason, fatal=lost.fatal, fallback=lost.fallback)
        if kind is UpstreamFailed:
            return self._upstream_failed(given)  # type: ignore[arg-type]
        if kind is RetryNow:
            if self.state is not _BACKOFF:
                return _NOTHING
            self.state = _STREAMING
            return [_RETRY]
        if kind is Cancel:
            return self._cancel()
        if kind is Rerun:
            if self.state is not _IDLE:
                return _NOTHING
            return self._begin([Interrupt(content=given.reason)], None)  # type: ignore[union-attr]
        if kind is ShellFailed:
            return self._shell_failed(given.what)  # type: ignore[union-attr]
        if kind is Shutdown:
            was = self.state
            self.state = _IDLE
            self._queued = None
            self._settle_waiting("the session stopped on this node")
            self._held = None
            self._speech_queued = False
            return _NOTHING if was is _IDLE else [DropUpstream(stop=True)]
        if kind is Spoken:
            return self._spoken_text(given.text)  # type: ignore[union-attr]
        if kind is SpeechBegan:
            return self._speech_began(given.offset_ms)  # type: ignore[union-attr]
        if kind is SpeechEnded:
            return self._speech_ended(given.offset_ms)  # type: ignore[union-attr]
        if kind is Transcript:
            return self._transcript(given.text)  # type: ignore[union-attr]
        if kind is ResponseBegan:
            return self._begin_spoken([]) if self.state is _IDLE else _NOTHING
        if kind is CommitSpeech:
            if self.state is not _IDLE:
                return [
                    Refuse(
                        Error(
                            code="turn_active",
                            content="a turn is already running; wait for its end event "
                            "(or send cancel) before committing speech",
                        )
                    )
                ]
            out = self._begin_spoken([])
            out.append(_COMMIT)
            return out
        if kind is NativeCall:
            return self._native_call(given)  # type: ignore[arg-type]
        return _NOTHING

    # --- voice --------------------------------------------------------------------------

    def _speech_began(self, offset_ms: int) -> Sequence[Action]:
        out: list[Action] = [SpeechStarted(offset_ms=offset_ms)]
        state = self.state
        if state is _STREAMING or state is _STOPPING or state is _TOOLS or state is _BACKOFF:
            out += self._cancel(barge_in=True)
        return out

    def _speech_ended(self, offset_ms: int) -> Sequence[Action]:
        out: list[Action] = [SpeechStopped(offset_ms=offset_ms)]
        state = self.state
        if state is _IDLE:
            out += self._begin_spoken([])
        elif state is _ENDING or state is _CANCELLING:
            self._speech_queued = True  # answered once the closing turn is over
        return out

    def _begin_spoken(self, first: list[Action]) -> list[Action]:
        """A spoken turn: the provider has the speech and answers it; its transcript
        (the ``user`` event) comes first, so what the answer brings is held till then."""
        out = self._begin(first, None)
        out.pop()  # no request: the provider answers by itself (or on CommitAudio)
        self._held = []
        return out

    def _transcript(self, text: str) -> Sequence[Action]:
        if self._held is None:
            return _NOTHING  # late (the turn went on without it) or not ours
        return self._release_held(text)

    def _release_held(self, text: str) -> list[Action]:
        """The spoken turn's ``user`` event (persisted), then what waited for it."""
        held, self._held = self._held, None
        if held is None:
            return []
        return [
            User(content=text, source="audio"),
            Persist((User(content=text, source="audio"),)),
            *held,
        ]

    def _spoken_text(self, text: str) -> Sequence[Action]:
        if self.state is not _STREAMING:
            return _NOTHING  # leftovers of a cancelled answer
        event = Respond(content=text)
        self._chunk(event)
        self._spoken.append(text)
        if self._held is not None:
            self._held.append(event)
            return _NOTHING
        return [event]

    def _native_call(self, given: NativeCall) -> Sequence[Action]:
        if self.state is not _STREAMING:
            return _NOTHING
        too_deep = False
        try:
            args = msgspec.json.decode(given.arguments or "{}", type=dict[str, object])
        except (msgspec.DecodeError, msgspec.ValidationError):
            args = {}  # the tool's argument check says what is missing
        except RecursionError:  # msgspec recurses per level: ~1,000 levels is its end
            args, too_deep = {}, True
        if too_deep or json_depth(args, MAX_ARGS_DEPTH) > MAX_ARGS_DEPTH:
            # Refused before anything walks them (encoding, schemas, the tools):
            # answered here, and the model reads why.
            args, too_deep = {}, True
        call = ToolCall(name=given.name, args=args)
        event = Call(content=encode_call(call))
        self._recorder.add(event)
        out: list[Action] = [event]
        if too_deep:
            problem = (
                f"the arguments of the call to {given.name!r} nest deeper than "
                f"{MAX_ARGS_DEPTH} levels, the limit for tool args; call it again with "
                "flatter arguments"
            )
            self._refused[len(self._calls)] = problem
            out.insert(0, Error(code="malformed_execute", content=problem))
        self._add_call(call, event)
        self._call_ids.append(given.call_id)
        if self._held is not None:
            self._held += out
            return _NOTHING
        return out

    def _truncate(self) -> ReplaceResponse:
        """What the stopped answer's history says (what clients were sent), for the provider."""
        if self._spoken:
            return ReplaceResponse("".join(self._spoken))
        return ReplaceResponse(self._parser.accepted_text)

    def _user(self, text: str) -> Sequence[Action]:
        state = self.state
        if state is _IDLE:
            return self._begin(
                [User(content=text), Persist((User(content=text),))],
                Message(role="user", content=text),
            )
        if (state is _ENDING or state is _CANCELLING) and self._queued is None:
            # The turn only waits for its usage: the message starts right after it.
            self._queued = text
            return _NOTHING
        return [
            Refuse(
                Error(
                    code="turn_active",
                    content="a turn is already running; wait for its end event or send cancel",
                )
            )
        ]

    def _begin(self, first: list[Action], message: Message | None) -> list[Action]:
        """Start a turn: ``first`` (its opening events), then the first model step."""
        self._unreported = _ZERO
        self._estimated = False
        self._steps = 0
        self._malformed_in_a_row = 0
        self._new_recorder()
        return [_STARTED, *first, self._step(message)]

    def _step(self, message: Message | None) -> Request:
        """A new model step: a fresh parser, then ask the model."""
        self._steps += 1
        self._attempt = 0
        self._new_attempt()
        self.state = _STREAMING
        return _RETRY if message is None else Request(message)

    def _new_recorder(self) -> None:
        self._recorder = StepRecorder()
        self._chunk = self._recorder.chunk

    def _new_attempt(self) -> None:
        self._parser = Parser()
        self._feed = self._parser.feed
        self._calls = []
        self._call_events = []
        self._early = {}
        self._refused = {}
        self._call_ids = []
        self._spoken = []
        self._malformed = None
        self._ended = False
        self._counted = False

    def _response_done(self, done: ResponseDone) -> Sequence[Action]:
        state = self.state
        if state is _CANCELLING:
            self._count(done.usage, done.estimated)
            if self.voice:
                # Keep the connection (it carries the user's audio); make its
                # conversation hold only what was sent before the cut.
                replace = self._truncate()
                closing = self._close([])
                metric = next(i for i, a in enumerate(closing) if type(a) is Metric)
                closing.insert(metric + 1, replace)  # before a queued turn's request
                return closing
            return self._close([DropUpstream()])
        if state is _ENDING:
            self._count(done.usage, done.estimated)
            return self._close([Persist(tuple(self._recorder.finish()))])
        if state is not _STREAMING and state is not _STOPPING:
            return _NOTHING
        out: list[Action] = self._release_held(UNHEARD)
        if state is _STREAMING:
            for event in self._parser.close():
                kind = type(event)
                if kind is Think or kind is Respond:
                    self._recorder.add(event)
                else:
                    self._marker(event)
                out.append(event)
        self._count(done.usage, done.estimated)
        if self._calls or self._malformed is not None:
            return self._tool_step(out)
        if done.status in ("failed", "incomplete"):
            detail = f": {done.detail}" if done.detail else ""
            return self._fail(out, f"the model's response {done.status}{detail}")
        # The step answered without <end>: the turn is over all the same.
        out += [Persist(tuple(self._recorder.finish())), End()]
        return self._close(out)

    def _tool_step(self, out: list[Action]) -> list[Action]:
        """The step stopped at ``</execute>``: report it, then run its batch (or hand back the error)."""
        # The model's own words up to </execute>, without the overrun: its
        # context keeps its own formatting, and a provider that already holds
        # exactly this text has nothing to redo.
        if self._call_ids:
            # Native function calls: the provider holds them as calls already.
            out.append(Execute())
            out += self._metric()
            return self._run_batch(out)
        replace = ReplaceResponse(self._parser.accepted_text)
        if self._malformed is not None:
            self._malformed_in_a_row += 1
            if self._malformed_in_a_row >= MALFORMED_LIMIT:
                out += [
                    Persist(tuple(self._recorder.finish())),
                    Error(
                        code="malformed_execute",
                        content="the model wrote three malformed <execute> blocks in a row; "
                        "the turn is stopped — rephrase the request and try again",
                    ),
                    End(),
                ]
                out = self._close(out)
                out.append(replace)
                return out
            out += self._metric()
            failure = ToolResult(tool="execute", status="failure", content=self._malformed)
            out += self._batch_done((failure,))
            # After the result is logged, before the next request (if the turn goes on).
            out.insert(len(out) - 1 if type(out[-1]) is Request else len(out), replace)
            return out
        self._malformed_in_a_row = 0
        out += self._metric()
        out.append(replace)
        return self._run_batch(out)

    def _run_batch(self, out: list[Action]) -> list[Action]:
        """Split the batch: server calls run (``RunTools``), client calls wait (``AwaitClient``)."""
        self._settled = {}
        self._slots = [None] * len(self._calls)
        self._waiting = {}
        server: list[ToolCall] = []
        refused = self._refused
        for index, (call, event) in enumerate(zip(self._calls, self._call_events, strict=True)):
            if event.runs_on == "client":
                self._waiting[event.id] = index
            elif index in refused:
                # A client tool called with bad args: answered here, the client never runs it.
                failure = ToolResult(tool=call.name, status="failure", content=refused[index])
                self._slots[index] = failure
            else:
                server.append(call)
        self.state = _TOOLS
        for call_id, answer in self._early.items():
            early = self._waiting.pop(call_id, None)
            if early is not None:
                self._settled[call_id] = "was already answered"
                name = self._calls[early].name
                self._slots[early] = ToolResult(
                    tool=name, status=answer.status, content=answer.content
                )
        self._early = {}
        if self._waiting:
            out.append(AwaitClient(tuple(self._waiting)))
        self._server_running = bool(server)
        if server:
            out.append(RunTools(tuple(server)))
        elif not self._waiting:
            # Every call is answered already (refused, or answered on its `call`):
            # the result goes out before the awaited replacement of the response.
            done = self._batch_done(tuple(self._filled()))
            split = next((i for i, a in enumerate(done) if type(a) is Request), len(done))
            at = next((i for i, a in enumerate(out) if type(a) is ReplaceResponse), len(out))
            out[at:at] = done[:split]
            out += done[split:]
        return out

    def _filled(self) -> list[ToolResult]:
        return [slot for slot in self._slots if slot is not None]

    def _tools_done(self, results: tuple[ToolResult, ...]) -> list[Action]:
        """The server calls' results, in the order of ``RunTools``'s calls."""
        if self.state is not _TOOLS or not self._server_running:
            return []  # results of a batch the machine no longer waits for (cancelled)
        self._server_running = False
        given = iter(results)
        slots = self._slots
        for index, slot in enumerate(slots):
            if slot is None and index not in self._waiting.values():
                slots[index] = next(given, None) or ToolResult(
                    tool=self._calls[index].name,
                    status="failure",
                    content="the tool gave no result; try the call again",
                )
        return self._maybe_batch_done()

    def _client_result(self, answer: ClientResult) -> Sequence[Action]:
        index = self._waiting.pop(answer.id, None) if self.state is _TOOLS else None
        if (
            index is None
            and self.state in _BEFORE_BATCH
            and answer.id not in self._early
            and any(e.id == answer.id and e.runs_on == "client" for e in self._call_events)
        ):
            # Answered on its `call`, before `execute`: kept for when the batch runs.
            self._early[answer.id] = answer
            return _NOTHING
        if index is None:
            why = self._settled.get(answer.id)
            if why is None:
                content = (
                    f"no call with id {answer.id[:80]!r} is waiting for a result; answer only "
                    'calls with "runs_on": "client" of the running turn, once each'
                )
            else:
                content = f"call {answer.id!r} {why}; this tool_result was ignored"
            return [Refuse(Error(code="unknown_call", content=content))]
        self._settled[answer.id] = "was already answered"
        name = self._calls[index].name
        self._slots[index] = ToolResult(tool=name, status=answer.status, content=answer.content)
        return self._maybe_batch_done()

    def _client_timeout(self, seconds: float) -> Sequence[Action]:
        if not self.awaits_client:
            return _NOTHING
        for call_id, index in self._waiting.items():
            self._settled[call_id] = f"timed out after {seconds:g}s"
            self._slots[index] = ToolResult(
                tool=self._calls[index].name,
                status="failure",
                content=f"the client did not answer this call within {seconds:g}s, so it was "
                "given up; the client may be gone or busy — go on without it, or ask the "
                "user whether to try again",
            )
        self._waiting = {}
        return self._maybe_batch_done()

    def _maybe_batch_done(self) -> list[Action]:
        if self._server_running or self._waiting:
            return []
        return self._batch_done(tuple(self._filled()))

    def _settle_waiting(self, why: str) -> None:
        for call_id in self._waiting:
            self._settled[call_id] = why
        self._waiting = {}
        self._server_running = False

    def _batch_done(self, results: tuple[ToolResult, ...]) -> list[Action]:
        content = encode_results(results)
        payload = result_payload(results)
        out: list[Action] = [
            Result(content=content, payload=payload),
            Persist((*self._recorder.finish(), Result(content=content, payload=payload))),
        ]
        if self._steps >= self.max_steps:
            out += [
                Error(
                    code="internal",
                    content=f"the turn reached the limit of {self.max_steps} model steps and "
                    "was stopped; ask for a smaller task",
                ),
                End(),
            ]
            return self._close(out)
        if self._call_ids and len(self._call_ids) == len(results):
            outputs = tuple(
                (call_id, _RESULT_ENCODER.encode(result).decode())
                for call_id, result in zip(self._call_ids, results, strict=True)
            )
            request = self._step(None)
            out.append(Request(outputs=outputs) if request is _RETRY else request)
            return out
        out.append(self._step(results_message(content)))
        return out

    def _upstream_lost(
        self, reason: str, *, fatal: bool = False, fallback: str = ""
    ) -> Sequence[Action]:
        state = self.state
        if state is _CANCELLING:
            self._count(None, True)
            return self._close([DropUpstream()])
        if state is _ENDING:
            # The answer is complete (end was sent); only its usage report is lost.
            self._count(None, True)
            return self._close([Persist(tuple(self._recorder.finish())), DropUpstream()])
        if state is _STOPPING:
            # The calls are complete: run them; the next request reopens from history.
            self._count(None, True)
            return [DropUpstream(), *self._tool_step([])]
        if state is not _STREAMING:
            return _NOTHING  # a best-effort action failed while nothing was asked of the model
        self._count(None, True)
        self._attempt += 1
        attempt = self._attempt
        out: list[Action] = [DropUpstream(), *self._release_held(UNHEARD)]
        if attempt > self.upstream_retries or (fatal and not fallback):
            problem = "refused the request" if fatal and not fallback else "is unreachable"
            out += [
                Error(
                    code="upstream",
                    content=f"the model's API {problem} ({reason}); "
                    "the turn was stopped — send your message again later",
                ),
                Persist(tuple(self._recorder.finish())),
                End(),
            ]
            return self._close(out)
        if fallback:
            if self._recorder.emitted:
                out.append(
                    Interrupt(
                        content=f"the model's API failed ({reason}); continuing with "
                        f"{fallback} — discard this step's partial output"
                    )
                )
            self._new_recorder()
            self._new_attempt()
            self.state = _BACKOFF
            out.append(Backoff(attempt=attempt, delay=0.0))
            return out
        if self._recorder.emitted:
            out.append(
                Interrupt(
                    content=f"upstream connection lost ({reason}); "
                    "this step is being rerun — discard its partial output"
                )
            )
        self._new_recorder()  # the partial step is not history
        self._new_attempt()
        self.state = _BACKOFF
        out.append(Backoff(attempt=attempt, delay=min(0.1 * 2**attempt, 2.0)))
        return out

    def _upstream_failed(self, failed: UpstreamFailed) -> Sequence[Action]:
        state = self.state
        if state is _CANCELLING or state is _ENDING:
            # The closing event is out: end the wait for a usage report that may not come.
            return self._upstream_lost(f"{failed.code}: {failed.message}")
        if state is not _STREAMING and state is not _STOPPING:
            return _NOTHING
        if failed.fallback:
            return self._upstream_lost(failed.code, fatal=True, fallback=failed.fallback)
        self._count(None, True)
        return self._fail([], f"the model's API reported {failed.code}: {failed.message}")

    def _cancel(self, *, barge_in: bool = False) -> list[Action]:
        state = self.state
        if state is _IDLE or state is _ENDING or state is _CANCELLING:
            return [Refuse(Error(code="no_turn", content="no turn is running; nothing to cancel"))]
        out: list[Action] = self._release_held(UNHEARD)
        if barge_in:
            cancelled = Cancelled(content=BARGED_IN, reason="barge_in")
            note = Cancelled(content=BARGED_IN, reason="barge_in")
        else:
            cancelled = Cancelled(content=CANCELLED_BY_USER)
            note = Cancelled(content=CANCELLED_BY_USER)
        out += [Persist((*self._recorder.finish(), note)), cancelled]
        if state is _STREAMING or state is _STOPPING:
            # Wait for the stopped response's usage. Cancelling leaves the
            # provider's conversation with a partial response: the upstream is
            # dropped afterwards and the next turn reopens from history (in a
            # voice session it is truncated instead). Speech stops the
            # provider's response by itself (its VAD heard it first).
            self.state = _CANCELLING
            if not barge_in:
                out.append(_STOP)
            return out
        # Tools or a backoff: no response runs, nothing more to report.
        self._settle_waiting("was cancelled with its turn")
        return self._close(out)

    def _shell_failed(self, what: str) -> Sequence[Action]:
        state = self.state
        if state is _IDLE:
            return _NOTHING
        if state is _ENDING or state is _CANCELLING:
            self._count(None, True)
            return self._close([Persist(tuple(self._recorder.finish())), DropUpstream(stop=True)])
        return self._fail(
            [],
            f"the turn failed inside the gateway ({what}); send your message again",
            code="internal",
        )

    # --- endings and usage --------------------------------------------------------------

    def _fail(self, out: list[Action], content: str, *, code: str = "upstream") -> list[Action]:
        out += self._release_held(UNHEARD)
        out += [Error(code=code, content=content), Persist(tuple(self._recorder.finish())), End()]
        out = self._close(out)
        out.insert(0, DropUpstream(stop=True))
        return out

    def _close(self, out: list[Action]) -> list[Action]:
        """The closing event is in ``out``: add the turn's last metric, then any queued turn."""
        out += self._metric()
        self.state = _IDLE
        self._settle_waiting("ended with its turn")
        queued, self._queued = self._queued, None
        if queued is not None:
            out += self._user(queued)
        elif self._speech_queued:
            self._speech_queued = False
            out += self._begin_spoken([])
        return out

    def _count(self, usage: Usage | None, estimated: bool) -> None:
        """Add an attempt's usage (without one: an estimate of its output) to the unreported.

        The estimate counts the text the parser accepted (an overrun past a stop
        marker is not seen); no per-delta counter is kept on the hot path.
        """
        if self._counted:
            return
        self._counted = True
        if usage is None:
            chars = len(self._parser.accepted_text) + sum(map(len, self._spoken))
            if not chars:
                return
            usage = Usage(input=0, output=estimate_tokens(chars))
            estimated = True
        self._unreported = self._unreported + usage
        self._estimated = self._estimated or estimated

    def _metric(self) -> list[Action]:
        """``Account`` and ``Metric`` for the usage since the last metric (zero: no ``Account``)."""
        step, self._unreported = self._unreported, _ZERO
        estimated, self._estimated = self._estimated, False
        out: list[Action] = []
        if step.input or step.output:
            out.append(Account(step))
            self.total = self.total + step
        metric = Metric(step=step, total=self.total)
        if estimated:
            metric.estimated = True
        out.append(metric)
        return out
