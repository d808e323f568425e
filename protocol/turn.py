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
An action is a protocol ``Event`` — "log it, then send it" (the shell
stamps ``seq``/``timestamp``) — or a Struct the shell performs (``Persist``, ``Account``, ``TurnStarted``, ``Request``,
``CommitAudio``, ``StopResponse``, ``ReplaceResponse``, ``AwaitClient``,
``RunTools``, ``DropUpstream``, ``Backoff``, ``Refuse``). Every action list
puts the ones the shell performs at once (events, ``Persist``, ``Account``,
``TurnStarted``, ``DropUpstream``, ``Refuse``) before the ones that start or
await a wait (``AwaitClient``, ``Request``, ``CommitAudio``, ``StopResponse``,
``ReplaceResponse``, ``RunTools``, ``Backoff``). A ``Cancel`` supersedes
whatever the shell had not performed yet, so it can interrupt an await and
drop the rest.

**Inputs that make no sense in a state** return ``()`` or a ``Refuse``,
never an exception: they come from the network and timing, not from a bug.

**The end of a turn**: every turn ends with exactly one closing
event, ``end`` or ``cancelled``, followed by exactly one ``metric``. An error
that stops the turn comes just before its ``end``. A ``metric``'s ``step`` is
the usage since the turn's previous ``metric`` (zero when no model step ran
since), its ``total`` the session's; a tool step also gets a ``metric`` right
after its ``execute``. Usage the provider did not report (a lost connection,
a provider without a cancel) is estimated from characters and the metric says
``estimated: true``. ``Account`` precedes the metric that reports the same
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

from protocol.assembly import Message
from protocol.background import BackgroundCalls
from protocol.batch import ClientToolRouter, ToolBatch, native_call
from protocol.calls import (
    decode_call,
    encode_call,
)
from protocol.events import (
    Call,
    Cancelled,
    End,
    Error,
    Event,
    Interrupt,
    Metric,
    Respond,
    SpeechStarted,
    SpeechStopped,
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
    Await,
    Backoff,
    CancelBackground,
    CommitAudio,
    DropUpstream,
    GuardrailCut,
    NativeCall,
    Persist,
    Refuse,
    ReplaceResponse,
    Request,
    ResponseDone,
    Source,
    StopResponse,
    TurnInput,
    TurnStarted,
    UpstreamFailed,
    UserMessage,
)
from protocol.turn_state import NOTHING, RETRY, TurnState
from protocol.turn_table import TRANSITIONS
from protocol.turn_timers import CANCEL_REPORT_WAIT, Timers
from protocol.turn_tools import ToolSteps

__all__ = [
    "BARGED_IN",
    "CANCELLED_BY_USER",
    "ClientToolRouter",
    "TurnMachine",
    "TurnState",
    "batch_in_flight",
    "turn_in_flight",
]


# --- states (``protocol.turn_state``) ---------------------------------------------

_IDLE: Final = TurnState.IDLE
_STREAMING: Final = TurnState.STREAMING
_STOPPING: Final = TurnState.STOPPING
_ENDING: Final = TurnState.ENDING
_TOOLS: Final = TurnState.TOOLS
_BACKOFF: Final = TurnState.BACKOFF
_CANCELLING: Final = TurnState.CANCELLING

# The constant actions, made once: the machine returns them without allocating.
_RETRY: Final = RETRY
_NOTHING: Final = NOTHING
_STOP: Final = StopResponse()
_STARTED: Final = TurnStarted()
_COMMIT: Final = CommitAudio()
_TRANSITIONS: Final = TRANSITIONS
_AWAIT_RESPONSE: Final = Await(Source.RESPONSE)
_AWAIT_NOTHING: Final = Await(Source.NOTHING)

CANCELLED_BY_USER: Final = "cancelled by the user"
BARGED_IN: Final = "interrupted by the user's speech"
GUARDRAIL_CUT: Final = "stopped by a guardrail"


class TurnMachine(ToolSteps):
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
        "_attempt",
        "_chunk",
        "_ended",
        "_feed",
        "_opened_for",
        "_queued",
        "_stalled",
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
        self.state = _IDLE
        self.timers = Timers(client_tool_timeout, approval_timeout)
        self.setup = 0  # the session's setups so far (``Reconfigured``)
        self._opened_for = 0  # the setup the open connection was opened for (``Opened``)
        self.batch = ToolBatch(client_tools, call_number)
        self.meter = UsageMeter(total)
        self.max_steps = max_steps
        self.upstream_retries = upstream_retries
        self._queued: UserMessage | None = None  # a message sent while the turn was closing
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
        return self.state is _IDLE

    @property
    def awaits_upstream(self) -> bool:
        """The next input comes from the upstream connection (a delta or a response's end)."""
        state = self.state
        return state is _STREAMING or state is _STOPPING or state is _ENDING or state is _CANCELLING

    def wait(self, now: float, *, listening: bool) -> Await:
        """What the shell waits for next (once it performed every action), and until when.

        ``now``: the shell's clock; ``listening``: the session reads its upstream between
        turns (a voice session with a client attached)."""
        state = self.state
        if state is _STREAMING or state is _STOPPING or state is _ENDING:
            return _AWAIT_RESPONSE
        if state is _CANCELLING:
            # The stopped response's end (and usage) comes within a round trip, or never.
            return Await(Source.UPSTREAM, now + CANCEL_REPORT_WAIT)
        client, approval = self.awaits_client, self.awaits_approval
        deadline = (
            self.timers.deadline(client=client, approval=approval) if client or approval else None
        )
        if listening:
            return Await(Source.LISTEN, deadline)
        if state is _IDLE:
            return _AWAIT_NOTHING
        return Await(Source.COMMAND, deadline)

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
        if self.spoken.hold(out):
            return _NOTHING
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
        return _NOTHING if entry is None else entry[0](self, given)

    # --- voice --------------------------------------------------------------------------

    def _speech_began(self, offset_ms: int) -> Sequence[Action]:
        out: list[Action] = [SpeechStarted(offset_ms=offset_ms)]
        state = self.state
        if state is _STREAMING or state is _STOPPING or state is _TOOLS or state is _BACKOFF:
            out += self._cancel(barge_in=True)
        elif state is _IDLE:
            heard = self.spoken.cut()
            if heard is not None:
                # The answer is complete but still playing: history and the provider
                # keep what the listener heard of it, as after a running turn's barge-in.
                out[0] = SpeechStarted(offset_ms=offset_ms, heard_ms=heard)
                note = Cancelled(content=BARGED_IN, reason="barge_in", heard_ms=heard)
                out.append(Persist((note,)))
                if self.voice:
                    spoken = self.spoken
                    text = spoken.text if spoken.chars else self._parser.accepted_text
                    out.append(ReplaceResponse(text, heard_ms=heard))
        return out

    def audio_sent(self, ms: float) -> bool:
        """The answer's next ``ms`` of audio (the hot path: no actions). True: the shell
        sends it to the clients (what the listener has not heard yet can still be cut);
        False: it is the rest of a cancelled answer."""
        if self.state is not _STREAMING:
            return False
        self.spoken.audio_sent(ms)
        return True

    def _speech_ended(self, offset_ms: int) -> Sequence[Action]:
        out: list[Action] = [SpeechStopped(offset_ms=offset_ms)]
        state = self.state
        if state is _IDLE:
            out += self._begin_spoken([])
        elif state is _ENDING or state is _CANCELLING:
            self.spoken.queued = True  # answered once the closing turn is over
        return out

    def _commit(self) -> Sequence[Action]:
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

    def _begin_spoken(self, first: list[Action]) -> list[Action]:
        """A spoken turn: the provider has the speech and answers it; its transcript
        (the ``user`` event) comes first, so what the answer brings is held till then."""
        out = self._begin(first, None)
        out.pop()  # no request: the provider answers by itself (or on CommitAudio)
        self.spoken.begin()
        return out

    def _said(self, event: Respond | Think) -> Sequence[Action]:
        """A chunk the provider gave as answer (``Spoken``) or thinking (``Thought``) as is:
        no text protocol to parse (audio output, or a model that only speaks)."""
        if self.state is not _STREAMING:
            return _NOTHING  # leftovers of a cancelled answer
        self._chunk(event)
        if type(event) is Respond:
            self.spoken.said(event.content)
        if self.spoken.hold((event,)):
            return _NOTHING
        return [event]

    def _native_call(self, given: NativeCall) -> Sequence[Action]:
        if self.state is not _STREAMING:
            return _NOTHING
        call, problem = native_call(given.name, given.arguments)
        event = Call(content=encode_call(call))
        out: list[Action] = [event]
        if problem is not None:
            out.insert(0, Error(code="malformed_execute", content=problem))
        self.batch.add(call, event, given.call_id, refused=problem)
        self._recorder.add(event)
        if self.spoken.hold(out):
            return _NOTHING
        return out

    def _user(self, given: UserMessage) -> Sequence[Action]:
        state = self.state
        text = given.content
        if state is _IDLE:
            return self._begin(
                [User(content=text, reply_to=given.id), Persist((User(content=text),))],
                Message(role="user", content=text),
            )
        if (state is _ENDING or state is _CANCELLING) and self._queued is None:
            # The turn only waits for its usage: the message starts right after it.
            self._queued = given
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
        self.meter.new_turn()
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
        self.state = _STREAMING
        return self._ask(message)

    def _ask(self, message: Message | None) -> Request:
        """Ask the model; on a new connection if the open one is for an older setup."""
        if self._opened_for != self.setup:
            return Request(message, fresh=True)
        return _RETRY if message is None else Request(message)

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
        if state is _CANCELLING:
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
        if state is _ENDING:
            self._count_usage(done.usage, done.estimated)
            return self._close([Persist(tuple(self._recorder.finish()))])
        if state is not _STREAMING and state is not _STOPPING:
            return _NOTHING
        out: list[Action] = self.spoken.release(UNHEARD)
        if state is _STREAMING:
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
        out += [Persist(tuple(self._recorder.finish())), End()]
        return self._close(out)

    def _upstream_lost(
        self, reason: str, *, fatal: bool = False, fallback: str = ""
    ) -> Sequence[Action]:
        state = self.state
        if state is _CANCELLING:
            self._count_usage(None, True)
            return self._close([DropUpstream()])
        if state is _ENDING:
            # The answer is complete (end was sent); only its usage report is lost.
            self._count_usage(None, True)
            return self._close([Persist(tuple(self._recorder.finish())), DropUpstream()])
        if state is _STOPPING:
            # The calls are complete: run them; the next request reopens from history.
            self._count_usage(None, True)
            return [DropUpstream(), *self._tool_step([])]
        if state is not _STREAMING:
            return _NOTHING  # a best-effort action failed while nothing was asked of the model
        self._count_usage(None, True)
        self._attempt += 1
        attempt = self._attempt
        out: list[Action] = [DropUpstream(), *self.spoken.release(UNHEARD)]
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
            self._recorder = StepRecorder()
            self._chunk = self._recorder.chunk
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
        self._recorder = StepRecorder()  # the partial step is not history
        self._chunk = self._recorder.chunk
        self._new_attempt()
        self.state = _BACKOFF
        out.append(Backoff(attempt=attempt, delay=min(0.1 * 2**attempt, 2.0)))
        return out

    def _upstream_stalled(self, seconds: float) -> Sequence[Action]:
        """Nothing from the provider for ``seconds``: rerun the step once on a new
        connection, then end the turn (``upstream_timeout``)."""
        silent = f"the model's API sent nothing for {seconds:g}s"
        if self.state is not _STREAMING:
            # The answer or the calls are complete (or cancelled): as a lost connection.
            return self._upstream_lost(silent)
        self._count_usage(None, True)
        if self._stalled:
            return self._fail(
                [],
                f"{silent}, again after the step was retried on a new connection; the turn "
                "was stopped — send your message again, and if it keeps happening tell the "
                "operator (the provider may be overloaded)",
                code="upstream_timeout",
            )
        self._stalled = True
        partial = " — discard its partial output" if self._recorder.emitted else ""
        out: list[Action] = [DropUpstream(stop=True), *self.spoken.release(UNHEARD)]
        out.append(
            Interrupt(content=f"{silent}; this step is being rerun on a new connection{partial}")
        )
        self._recorder = StepRecorder()  # the partial step is not history
        self._chunk = self._recorder.chunk
        self._new_attempt()
        self.state = _BACKOFF
        out.append(Backoff(attempt=self._attempt + 1, delay=0.0))
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
        self._count_usage(None, True)
        return self._fail([], f"the model's API reported {failed.code}: {failed.message}")

    def _guardrail_cut(self, cut: GuardrailCut) -> Sequence[Action]:
        """A guardrail stopped the spoken answer where its audio stopped: cancelled as by
        the user, and the provider keeps the audio heard (``heard_ms``), as after a
        barge-in. Background calls go on (they were not what tripped)."""
        self.spoken.heard_ms = cut.heard_ms
        return self._cancel(guardrail=True, stop=not cut.done)

    def _cancel(
        self, *, barge_in: bool = False, guardrail: bool = False, stop: bool = True
    ) -> list[Action]:
        state = self.state
        if state is _IDLE and self.cancel_background and self.background.running:
            return self._cancel_background_only()
        if state is _IDLE or state is _ENDING or state is _CANCELLING:
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
        background = self.cancel_background and not guardrail
        stopped = self.background.cancel(note.content) if background else []
        kept = [msgspec.structs.replace(r) for r in stopped]  # history's own copies
        out += [Persist((*self._recorder.finish(), note, *kept)), *stopped, cancelled]
        if stopped:
            out.append(CancelBackground(tuple(str(r.id) for r in stopped)))
        if state is _STREAMING or state is _STOPPING:
            # Wait for the stopped response's usage. Cancelling leaves the
            # provider's conversation with a partial response: the upstream is
            # dropped afterwards and the next turn reopens from history (in a
            # voice session it is truncated instead). Speech stops the
            # provider's response by itself (its VAD heard it first).
            self.state = _CANCELLING
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
        if state is _IDLE:
            return _NOTHING
        if state is _ENDING or state is _CANCELLING:
            self._count_usage(None, True)
            return self._close([Persist(tuple(self._recorder.finish())), DropUpstream(stop=True)])
        return self._fail(
            [],
            f"the turn failed inside the gateway ({what}); send your message again",
            code="internal",
        )

    def _fail(self, out: list[Action], content: str, *, code: str = "upstream") -> list[Action]:
        out += self.spoken.release(UNHEARD)
        out += [Error(code=code, content=content), Persist(tuple(self._recorder.finish())), End()]
        out = self._close(out)
        out.insert(0, DropUpstream(stop=True))
        return out

    def _close(self, out: list[Action]) -> list[Action]:
        """The closing event is in ``out``: add the turn's last metric, then any queued turn."""
        out += self.meter.metric()
        self.state = _IDLE
        self.batch.settle("ended with its turn")
        queued, self._queued = self._queued, None
        if queued is not None:
            out += self._user(queued)
        elif self.spoken.queued:
            self.spoken.queued = False
            out += self._begin_spoken([])
        elif self.background.due:
            out += self._deliver()  # background results as the next step
        return out

    def _count_usage(self, usage: Usage | None, estimated: bool) -> None:
        """Count an attempt's usage (without a report: its output estimated from the text seen)."""
        self.meter.count(
            usage,
            estimated,
            lambda: len(self._parser.accepted_text) + self.spoken.chars,
        )

    def _retry_now(self) -> Sequence[Action]:
        if self.state is not _BACKOFF:
            return _NOTHING
        self.state = _STREAMING
        return [self._ask(None)]

    def _reconfigured(self) -> Sequence[Action]:
        self.setup += 1
        return _NOTHING

    def _opened(self, setup: int) -> Sequence[Action]:
        self._opened_for = setup
        return _NOTHING

    def _rerun(self, reason: str) -> Sequence[Action]:
        if self.state is not _IDLE:
            return _NOTHING
        return self._begin([Interrupt(content=reason)], None)

    def _shutdown(self) -> Sequence[Action]:
        was = self.state
        self.state = _IDLE
        self._queued = None
        self.batch.settle("the session stopped on this node")
        self.spoken.forget()
        self.background.forget()
        return _NOTHING if was is _IDLE else [DropUpstream(stop=True)]
