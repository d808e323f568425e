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

**Inputs** and **actions** are the vocabulary of ``protocol.turn_events``
(inputs: the client's own frames, what the upstream adapters return, and
what the shell's I/O and timers report). Feed inputs with ``feed``, which
dispatches through the declared (state, input) table of ``protocol.turn_table``
(a test checks it declares every pair); a text delta also has the fast path
``text``. Between actions the shell asks ``wait`` what to wait for and until
when (``Await``); time comes in as ``Tick``.
An action is a protocol ``Event`` — "log it, then send it" (the shell stamps
``seq``/``timestamp``) — or a Struct the shell performs (``Persist``, ``Account``,
``TurnStarted``, ``Request``, ``CommitAudio``, ``StopResponse``, ``ReplaceResponse``,
``AwaitClient``, ``RunTools``, ``DropUpstream``, ``Backoff``, ``Refuse``). Every action
list puts the ones the shell performs at once (events, ``Persist``, ``Account``,
``TurnStarted``, ``DropUpstream``, ``Refuse``) before the ones that start or await a
wait (``AwaitClient``, ``Request``, ``CommitAudio``, ``StopResponse``,
``ReplaceResponse``, ``RunTools``, ``Backoff``). A ``Cancel`` supersedes whatever the
shell had not performed yet, so it can interrupt an await and drop the rest.

**Inputs that make no sense in a state** return ``()`` or a ``Refuse``,
never an exception: they come from the network and timing, not from a bug.

**The end of a turn**: every turn ends with exactly one closing event, ``end`` or
``cancelled``, followed by exactly one ``metric``. An error that stops the turn comes
just before its ``end``. A ``metric``'s ``step`` is the usage since the turn's previous
``metric`` (zero when no model step ran since), its ``total`` the session's; a tool step
also gets a ``metric`` right after its ``execute``. Usage the provider did not report (a
lost connection, a provider without a cancel) is estimated from characters and the
metric says ``estimated: true``. ``Account`` precedes the metric that reports the same
usage, so the token counters and quotas always agree with the client's view.

**Client tools**: a call to a tool the session's client declared is sent
with ``runs_on: "client"`` once its args pass their check; the batch at
``</execute>`` (or a native response's end) runs its server calls
(``RunTools``) while the client answers its own (``AwaitClient``), and the
machine stays in ``tools`` until every call has a result, in call order
(``protocol.batch`` keeps the calls and their slots).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from protocol.assembly import Message, context_message
from protocol.background import BackgroundCalls
from protocol.batch import ClientToolRouter, ToolBatch
from protocol.calls import (
    decode_call,
)
from protocol.events import (
    Call,
    Cancelled,
    Context,
    End,
    Error,
    Event,
    Interrupt,
    Metric,
    Replying,
    Respond,
    Think,
    Usage,
    User,
)
from protocol.journal import batch_in_flight, turn_in_flight
from protocol.metering import ZERO_USAGE, UsageMeter
from protocol.parser import Parser
from protocol.spoken import UNHEARD, SpokenAnswer
from protocol.steps import StepRecorder
from protocol.turn_events import (
    Action,
    AddMessage,
    Await,
    AwaitApproval,
    AwaitClient,
    Backoff,
    CancelBackground,
    CommitAudio,
    ContextMessage,
    DropUpstream,
    NativeCall,
    Persist,
    Refuse,
    ReplaceResponse,
    ReplyNow,
    Request,
    ResponseDone,
    RunTools,
    Source,
    StopResponse,
    TurnInput,
    TurnStarted,
    UserMessage,
)
from protocol.turn_recovery import RecoverySteps
from protocol.turn_state import (
    BACKOFF,
    CANCELLING,
    ENDING,
    IDLE,
    NOTHING,
    RETRY,
    STOPPING,
    STREAMING,
    TOOLS,
    TurnState,
)
from protocol.turn_table import TRANSITIONS
from protocol.turn_timers import CANCEL_REPORT_WAIT, Timers
from protocol.turn_voice import BARGED_IN, GUARDRAIL_CUT, VoiceSteps

__all__ = [
    "BARGED_IN",
    "CANCELLED_BY_USER",
    "ClientToolRouter",
    "TurnMachine",
    "TurnState",
    "batch_in_flight",
    "turn_in_flight",
]


# The constant actions, made once: the machine returns them without allocating.
_STOP: Final = StopResponse()
_STARTED: Final = TurnStarted()
_TRANSITIONS: Final = TRANSITIONS
_AWAIT_RESPONSE: Final = Await(Source.RESPONSE)
_AWAIT_NOTHING: Final = Await(Source.NOTHING)

CANCELLED_BY_USER: Final = "cancelled by the user"
CONTEXTS_PER_TURN: Final = 256
CONTEXT_CHARS_PER_TURN: Final = 2 << 20
CONTEXT_FULL: Final = (
    f"{CONTEXTS_PER_TURN} context messages (or {CONTEXT_CHARS_PER_TURN} characters) were added "
    "since the last turn began: start a turn (a user message, or reply) before adding more"
)
# What a turn waits on: messages that waited for an answer go in before these.
_WAITS: Final = (RunTools, AwaitClient, AwaitApproval, Request, CommitAudio, Backoff)


class TurnMachine(VoiceSteps, RecoverySteps):
    """The turns of one session (see the module docstring).

    ``meter.total`` is the session's usage so far (it grows with every ``Account``);
    ``max_steps`` bounds the model steps of a turn; ``upstream_retries`` the
    reconnects of one step before the turn fails. ``client_tools`` routes calls
    to the client (None: every call runs on the gateway; ``batch.router`` changes
    it); ``call_number`` is where call ids start (see ``protocol.batch.ToolBatch``).

    ``voice`` (set by the shell while the session streams audio): the upstream
    connection carries the user's audio, so a cancelled answer is truncated
    there (``ReplaceResponse``) instead of the connection being dropped.
    """

    __slots__ = (
        "_contexts",
        "_ended",
        "_feed",
        "_opened_for",
        "_queued",
        "_room",
        "cancel_background",
        "setup",
        "spoken",
        "upstream_retries",
        "voice",
    )

    def __init__(
        self,
        *,
        total: Usage = ZERO_USAGE,
        max_steps: int = 25,
        upstream_retries: int = 3,
        client_tools: ClientToolRouter | None = None,
        call_number: int = 0,
        client_tool_timeout: float = 60.0,
        approval_timeout: float = 120.0,
    ) -> None:
        self.state = IDLE
        self.timers = Timers(client_tool_timeout, approval_timeout)
        self.setup = 0  # the session's setups so far (``Reconfigured``)
        self._opened_for = 0  # the setup the open connection was opened for (``Opened``)
        self.batch = ToolBatch(client_tools, call_number)
        self.meter = UsageMeter(total)
        self.max_steps = max_steps
        self.upstream_retries = upstream_retries
        # A message (or a reply asked for) sent while the turn was closing.
        self._queued: UserMessage | ReplyNow | None = None
        self._contexts: list[ContextMessage | AddMessage] = []  # added while it answers
        self._room = [0, 0]  # context messages and characters since the turn began
        self._recorder = StepRecorder()
        self._chunk = self._recorder.chunk
        self._parser = Parser()
        self._feed = self._parser.feed
        self._malformed: str | None = None
        self._ended = False  # the parser saw <end> in this step
        self._steps = 0
        self._attempt = 0
        self._stalled = False  # this step was rerun after the provider went silent
        self._malformed_in_a_row = 0
        self.voice = False
        self.spoken = SpokenAnswer()  # a spoken turn's held events, transcript, playback
        self.background = BackgroundCalls()  # calls that do not block the turn
        self.cancel_background = True  # cancel and barge-in cancel them (the session's setting)

    @property
    def idle(self) -> bool:
        """No turn runs (the shell's driver may stop)."""
        return self.state is IDLE

    @property
    def takes_message(self) -> bool:
        """A user message now starts a turn, or waits for the closing one (``_user``);
        otherwise it is refused as ``turn_active``."""
        state = self.state
        closing = state is ENDING or state is CANCELLING
        return state is IDLE or (closing and self._queued is None)

    @property
    def opened_stale(self) -> bool:
        """The open connection was opened for an earlier setup (``Reconfigured`` since)."""
        return self._opened_for != self.setup

    @property
    def awaits_upstream(self) -> bool:
        """The next input comes from the upstream connection (a delta or a response's end)."""
        state = self.state
        return state is STREAMING or state is STOPPING or state is ENDING or state is CANCELLING

    def wait(self, now: float, *, listening: bool) -> Await:
        """What the shell waits for next (once it performed every action), and until when.

        ``now``: the shell's clock; ``listening``: the session reads its upstream between
        turns (a voice session with a client attached)."""
        state = self.state
        if state is STREAMING or state is STOPPING or state is ENDING:
            return _AWAIT_RESPONSE
        if state is CANCELLING:
            # The stopped response's end (and usage) comes within a round trip, or never.
            return Await(Source.UPSTREAM, now + CANCEL_REPORT_WAIT)
        client, approval = self.awaits_client, self.awaits_approval
        deadline = (
            self.timers.deadline(client=client, approval=approval) if client or approval else None
        )
        if listening:
            return Await(Source.LISTEN, deadline)
        if state is IDLE:
            return _AWAIT_NOTHING
        return Await(Source.COMMAND, deadline)

    # --- the hot path ---------------------------------------------------------------

    def text(self, text: str) -> Sequence[Action]:
        """A text delta. The actions are the parser's list of events (plus ``StopResponse``).

        A delta with no marker costs the parser's fast path and one recorder
        append: no action list of its own, nothing else allocated, and the
        stop check only runs when the parser returned a marker event.
        """
        if self.state is not STREAMING:
            return NOTHING  # the overrun after a stop marker, or leftovers of a cancel
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
                # Whole: history gets it in End's (last) round; a kill now reruns nothing.
                self.state = ENDING  # the next message may queue now
                out.insert(len(out) - 1, self._recorder.persist())  # type: ignore[arg-type]
            else:
                self.state = STOPPING  # </execute> or a malformed block: stop the model now
                out.append(_STOP)  # type: ignore[arg-type]
        if self.spoken.hold(out):
            return NOTHING
        return out

    def _marker(self, event: Event) -> None:
        kind = type(event)
        if kind is Call:
            self.batch.add(decode_call(event.content), event)  # type: ignore[union-attr, arg-type]
            self._recorder.add(event)  # with the id the batch gave it
        elif kind is End:
            self._ended = True
        elif kind is Error and event.code == "malformed_execute":  # type: ignore[union-attr]
            self._malformed = event.content  # type: ignore[union-attr]

    # --- everything else ---------------------------------------------------------------

    def feed(self, given: TurnInput) -> Sequence[Action]:
        """Everything but the hot path: the actions ``given`` calls for in this state
        (``protocol.turn_table`` declares every pair: the step, or ``IGNORE``)."""
        entry = _TRANSITIONS[self.state, type(given)]
        if entry is None:
            return NOTHING
        out = entry[0](self, given)
        if self._contexts and (self.state is IDLE or self.state is TOOLS):
            out = list(out)  # the answer is written: what waited goes in first
            at = next((i for i, a in enumerate(out) if isinstance(a, _WAITS)), len(out))
            out[at:at] = self._added()
        return out

    def _native_call(self, given: NativeCall) -> Sequence[Action]:
        if self.state is not STREAMING:
            return NOTHING
        out: list[Action] = [*self.batch.native(given.call_id, given.name, given.arguments)]
        if out and type(out[-1]) is Call:
            self._recorder.add(out[-1])
        if not out or self.spoken.hold(out):
            return NOTHING
        return out

    def _user(self, given: UserMessage | ReplyNow) -> Sequence[Action]:
        """A user message starts a turn with it; ``reply``, one with no new message."""
        state = self.state
        if state is IDLE:
            if type(given) is ReplyNow:
                return self._begin([Replying(reply_to=given.id)], None)
            assert type(given) is UserMessage
            text = given.content
            return self._begin(
                [
                    User(content=text, reply_to=given.id, item=given.item),
                    Persist((User(content=text),)),
                ],
                Message(role="user", content=text),
            )
        if (state is ENDING or state is CANCELLING) and self._queued is None:
            # The turn only waits for its usage: the message starts right after it.
            self._queued = given
            return NOTHING
        return [
            Refuse(
                Error(
                    code="turn_active",
                    content="a turn is already running; wait for its end event or send cancel",
                )
            )
        ]

    def _context(self, given: ContextMessage) -> Sequence[Action]:
        """A message added without a turn (logged, kept in history, told to the connection):
        while the model writes its answer it waits (``_contexts``), before a turn queued
        meanwhile. ``CONTEXTS_PER_TURN`` a turn (and characters)."""
        room = self._room
        if room[0] >= CONTEXTS_PER_TURN or room[1] + len(given.content) > CONTEXT_CHARS_PER_TURN:
            return [Refuse(Error(code="rate_limited", content=CONTEXT_FULL))]
        room[0], room[1] = room[0] + 1, room[1] + len(given.content)
        if (state := self.state) is IDLE or state is TOOLS:
            return self._added(given)
        if (state is ENDING or state is CANCELLING) and not self.spoken.holding:
            # The answer is in history: kept now, a kill too; the provider is told after.
            out = self._added(given)
            self._contexts.append(out.pop())  # type: ignore[arg-type]  # its AddMessage
            return out
        self._contexts.append(given)
        return NOTHING

    def _added(self, *given: ContextMessage | AddMessage) -> list[Action]:
        """``given`` (or what waits) logged, kept and told to the connection (or told)."""
        if not given:
            given, self._contexts = tuple(self._contexts), []
        out: list[Action] = []
        for message in given:
            if isinstance(message, AddMessage):
                out.append(message)
                continue
            kept = Context(role=message.role, content=message.content)
            logged = Context(
                role=kept.role, content=kept.content, reply_to=message.id, item=message.item
            )
            out += [logged, Persist((kept,)), AddMessage(context_message(kept))]
        return out

    def _begin(self, first: list[Action], message: Message | None) -> list[Action]:
        """Start a turn: ``first`` (its opening events), then the first model step."""
        self.meter.new_turn()
        self._room = [0, 0]
        self._steps = 0
        self._malformed_in_a_row = 0
        self._recorder = StepRecorder()
        self._chunk = self._recorder.chunk
        return [_STARTED, *first, self._step(message)]

    def _step(self, message: Message | None) -> Request:
        """A new model step: a fresh parser, then ask the model."""
        self._steps += 1
        self._attempt = 0
        self._stalled = False
        self._new_attempt()
        self.state = STREAMING
        return self._ask(message)

    def _ask(self, message: Message | None) -> Request:
        """Ask the model; on a new connection if the open one is for an older setup."""
        if self.opened_stale:
            return Request(message, fresh=True)
        return RETRY if message is None else Request(message)

    def _new_attempt(self) -> None:
        self._parser = Parser()
        self._feed = self._parser.feed
        self.batch.new_attempt()
        self.spoken.new_attempt()
        self._malformed = None
        self._ended = False
        self.meter.new_attempt()

    def _response_done(self, done: ResponseDone) -> Sequence[Action]:
        state = self.state
        if state is CANCELLING:
            self._count_usage(done.usage, done.estimated)
            if self.voice:
                # Keep the connection (it carries the user's audio); make its
                # conversation hold only what was sent before the cut.
                # What the stopped answer's history says (what clients were sent), and
                # how much of its audio the client played (the provider keeps only that).
                spoken = self.spoken
                text = spoken.text if spoken.chars else self._parser.accepted_text
                replace = ReplaceResponse(text, heard_ms=spoken.heard_ms)
                closing = self._close([])
                metric = next(i for i, a in enumerate(closing) if type(a) is Metric)
                closing.insert(metric + 1, replace)  # before a queued turn's request
                return closing
            return self._close([DropUpstream()])
        if state is ENDING:  # the answer is in history (``text``)
            self._count_usage(done.usage, done.estimated)
            return self._close([])
        if state is not STREAMING and state is not STOPPING:
            return NOTHING
        out: list[Action] = self.spoken.release(UNHEARD)
        if state is STREAMING:
            for event in self._parser.close():
                kind = type(event)
                if kind is Think or kind is Respond:
                    self._recorder.add(event)
                else:
                    self._marker(event)
                out.append(event)
        self._count_usage(done.usage, done.estimated)
        if self.batch.calls or self._malformed is not None:
            return self._tool_step(out)
        if done.status in ("failed", "incomplete"):
            detail = f": {done.detail}" if done.detail else ""
            return self._fail(out, f"the model's response {done.status}{detail}")
        # The step answered without <end>: the turn is over all the same.
        out += [self._recorder.persist(), End()]
        return self._close(out)

    def _cancel(
        self, *, barge_in: bool = False, guardrail: bool = False, stop: bool = True
    ) -> list[Action]:
        state = self.state
        if state is IDLE and self.cancel_background and self.background.running:
            return self._cancel_background_only()
        if state is IDLE or state is ENDING or state is CANCELLING:
            return [Refuse(Error(code="no_turn", content="no turn is running; nothing to cancel"))]
        out: list[Action] = self.spoken.release(UNHEARD)
        if barge_in:
            heard = self.spoken.heard_ms
            cancelled = Cancelled(content=BARGED_IN, reason="barge_in")
            note = Cancelled(content=BARGED_IN, reason="barge_in")
            if heard is not None:
                cancelled.heard_ms = note.heard_ms = heard
        else:
            why = GUARDRAIL_CUT if guardrail else CANCELLED_BY_USER
            cancelled = Cancelled(content=why)
            note = Cancelled(content=why)
        background = self.cancel_background and not guardrail  # not what tripped
        stopped = self.background.cancel(note.content) if background else []
        kept = [msgspec.structs.replace(r) for r in stopped]  # history's own copies
        out += [self._recorder.persist(note, *kept), *stopped, cancelled]
        if stopped:
            out.append(CancelBackground(tuple(str(r.id) for r in stopped)))
        if state is STREAMING or state is STOPPING:
            # Wait for the stopped response's usage. Cancelling leaves the
            # provider's conversation with a partial response: the upstream is
            # dropped afterwards and the next turn reopens from history (in a
            # voice session it is truncated instead). Speech stops the
            # provider's response by itself (its VAD heard it first).
            self.state = CANCELLING
            if not barge_in and stop:
                out.append(_STOP)
            return out
        # Tools or a backoff: no response runs, nothing more to report.
        self.batch.settle("was cancelled with its turn")
        return self._close(out)

    def _cancel_background_only(self) -> list[Action]:
        """A cancel between turns: the session's background calls still running are
        cancelled (each gets its ``result``), and a ``cancelled`` (with its ``metric``,
        as every ``cancelled``) says how many."""
        count = len(self.background.running)
        calls = "call" if count == 1 else "calls"
        content = f"{CANCELLED_BY_USER}: {count} background {calls} still running"
        stopped = self.background.cancel(CANCELLED_BY_USER)
        kept = [msgspec.structs.replace(r) for r in stopped]  # history's own copies
        note = Cancelled(content=content)
        out: list[Action] = [Persist((note, *kept)), *stopped, Cancelled(content=content)]
        out += self.meter.metric()
        out.append(CancelBackground(tuple(str(r.id) for r in stopped)))
        return out

    def _shell_failed(self, what: str) -> Sequence[Action]:
        state = self.state
        if state is IDLE:
            return NOTHING
        if state is ENDING or state is CANCELLING:
            self._count_usage(None, True)
            return self._close([DropUpstream(stop=True)])
        return self._fail(
            [],
            f"the turn failed inside the gateway ({what}); send your message again",
            code="internal",
        )

    def _fail(self, out: list[Action], content: str, *, code: str = "upstream") -> list[Action]:
        out += self.spoken.release(UNHEARD)
        out += [Error(code=code, content=content), self._recorder.persist(), End()]
        out = self._close(out)
        out.insert(0, DropUpstream(stop=True))
        return out

    def _close(self, out: list[Action], then: Action | None = None) -> list[Action]:
        """The closing event is in ``out``: add the turn's last metric (and ``then``: the
        provider's copy of the answer set right), then any queued turn."""
        out += self.meter.metric()
        if then is not None:
            out.append(then)
        self.state = IDLE
        self.batch.settle("ended with its turn")
        queued, self._queued = self._queued, None
        if self._contexts:  # added while it answered: before the turn queued meanwhile
            out += self._added()
        if queued is not None:
            out += self._user(queued)
        elif self.spoken.queued:
            self.spoken.queued = False
            out += self._begin_spoken([])
        elif self.background.due:
            out += self._deliver()  # background results as the next step
        return out

    def _retry_now(self) -> Sequence[Action]:
        if self.state is not BACKOFF:
            return NOTHING
        self.state = STREAMING
        return [self._ask(None)]

    def _reconfigured(self) -> Sequence[Action]:
        self.setup += 1
        return NOTHING

    def _opened(self, setup: int, kept: bool, audio_ms: int) -> Sequence[Action]:
        self._opened_for = setup
        if not kept:
            self.spoken.speech_open = False  # a new connection heard no speech yet
            self.spoken.audio_base_ms = audio_ms
            if self.state is IDLE:
                self.spoken.answer_here = False  # opened after the last answer
        return NOTHING

    def _rerun(self, reason: str) -> Sequence[Action]:
        if self.state is not IDLE:
            return NOTHING
        return self._begin([Interrupt(content=reason)], None)

    def _shutdown(self) -> Sequence[Action]:
        was = self.state
        self.state = IDLE
        self._queued, self._contexts = None, []
        self.batch.settle("the session stopped on this node")
        self.spoken.forget()
        self.background.forget()
        return NOTHING if was is IDLE else [DropUpstream(stop=True)]
