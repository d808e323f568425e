"""The tool steps of the turn machine: a batch from ``</execute>`` to its results.

``TurnMachine`` (``protocol.turn``) inherits these transitions; they are the
machine's own (same state, same rules — see that module), kept apart because
they are one job: the step's calls go into history before any runs
(the journal), server calls run (``RunTools``, each outcome logged as it
comes, ``CallDone``), client calls wait (``AwaitClient``), calls that need a
user's approval wait for it (``AwaitApproval``), a takeover finishes the batch
from what the log holds (``Resume``), and once every call has its result the
model gets them all, in call order. ``protocol.batch`` keeps the calls and
their slots; this decides what each answer means for the turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.assembly import Message, results_message
from protocol.background import BackgroundCalls, result_event
from protocol.batch import ToolBatch
from protocol.calls import ToolCall, ToolResult, encode_result, encode_results, result_payload
from protocol.events import End, Error, Execute, Interrupt, Result
from protocol.metering import UsageMeter
from protocol.parser import Parser
from protocol.steps import StepRecorder
from protocol.turn_events import (
    Action,
    Approve,
    AwaitApproval,
    AwaitClient,
    CallDone,
    Persist,
    Refuse,
    ReplaceResponse,
    Request,
    Resume,
    ResumeBackground,
    RunTools,
    StartBackground,
    ToolResultMessage,
)
from protocol.turn_state import (
    BEFORE_BATCH,
    IDLE,
    MALFORMED_LIMIT,
    NOTHING,
    RETRY,
    TOOLS,
    TurnState,
)
from protocol.turn_timers import Timers

__all__ = ["ToolSteps"]


class ToolSteps:
    """The batch's transitions of ``TurnMachine`` (which holds the state named here)."""

    # The machine's state these transitions read and write (``TurnMachine.__init__``).
    __slots__ = (
        "_malformed",
        "_malformed_in_a_row",
        "_parser",
        "_recorder",
        "_steps",
        "background",
        "batch",
        "max_steps",
        "meter",
        "state",
        "timers",
    )

    state: TurnState
    timers: Timers
    batch: ToolBatch
    background: BackgroundCalls
    meter: UsageMeter
    max_steps: int
    _recorder: StepRecorder
    _parser: Parser
    _malformed: str | None
    _malformed_in_a_row: int
    _steps: int

    # The machine's own steps these transitions lead to (``protocol.turn``).
    def _begin(self, first: list[Action], message: Message | None) -> list[Action]:
        raise NotImplementedError

    def _step(self, message: Message | None) -> Request:
        raise NotImplementedError

    def _close(self, out: list[Action], then: Action | None = None) -> list[Action]:
        raise NotImplementedError

    @property
    def awaits_client(self) -> bool:
        """The batch waits for client-side results (the shell runs their timer)."""
        return self.state is TOOLS and bool(self.batch.waiting)

    @property
    def awaits_approval(self) -> bool:
        """Calls of the batch wait for a user's decision (the shell runs their timer)."""
        return self.state is TOOLS and bool(self.batch.approvals_pending)

    def _tool_step(self, out: list[Action]) -> list[Action]:
        """The step stopped at ``</execute>``: report it, then run its batch (or hand back the error)."""
        # The model's own words up to </execute>, without the overrun: its
        # context keeps its own formatting, and a provider that already holds
        # exactly this text has nothing to redo.
        if self.batch.native_ids:
            # Native function calls: the provider holds them as calls already.
            out.append(Execute())
            out += self.meter.metric()
            return self._run_batch(out)
        replace = ReplaceResponse(self._parser.accepted_text)
        if self._malformed is not None:
            self._malformed_in_a_row += 1
            if self._malformed_in_a_row >= MALFORMED_LIMIT:
                out += [
                    self._recorder.persist(),
                    Error(
                        code="malformed_execute",
                        content="the model wrote three malformed <execute> blocks in a row; "
                        "the turn is stopped — rephrase the request and try again",
                    ),
                    End(),
                ]
                return self._close(out, then=replace)  # before anything waiting goes in
            out += self.meter.metric()
            failure = ToolResult(tool="execute", status="failure", content=self._malformed)
            out += self._batch_done((failure,), logged=False)
            # After the result is logged, before the next request (if the turn goes on).
            out.insert(len(out) - 1 if type(out[-1]) is Request else len(out), replace)
            return out
        self._malformed_in_a_row = 0
        out += self.meter.metric()
        out.append(replace)
        return self._run_batch(out)

    def _run_batch(self, out: list[Action]) -> list[Action]:
        """Split the batch: server calls run (``RunTools``), client calls wait (``AwaitClient``).

        The step goes into history first (its calls with their ids): the
        shell runs the calls once that is logged, so a node that takes over
        knows every call that may have run (``Resume``), and none is asked of
        the model again.
        """
        running = self.background
        run, waiting, now, background = self.batch.start(running.room, running.full())
        self.state = TOOLS
        at = next((i for i, a in enumerate(out) if type(a) is ReplaceResponse), len(out))
        out[at:at] = [self._recorder.persist(), *now, *self._start(background)]
        return self._wait_batch(out, run, waiting)

    def _start(self, slots: list[int]) -> list[Action]:
        """The batch's background calls: tracked; the server ones start (not awaited)."""
        batch = self.batch
        calls: list[ToolCall] = []
        ids: list[str] = []
        for index in slots:
            event, call = batch.events[index], batch.calls[index]
            self.background.start(event.id, call.name, batch.native_id(index))
            if event.runs_on != "client":
                calls.append(call)
                ids.append(event.id)
        return [StartBackground(tuple(calls), tuple(ids))] if calls else []

    def _background_done(self, call_id: str, result: ToolResult) -> Sequence[Action]:
        """A background call's result: logged at once; the model gets it as the next
        step (at once when no turn runs, else when the running turn ends)."""
        logged = self.background.done(call_id, result)
        if logged is None:
            return NOTHING
        out: list[Action] = [logged]
        if self.state is IDLE:
            out += self._deliver()
        return out

    def _resume_background(self, given: ResumeBackground) -> Sequence[Action]:
        """After a takeover: background calls with a logged result are due, the others
        run again (same ids, same keys)."""
        calls: list[ToolCall] = []
        ids: list[str] = []
        for entry in given.calls:
            if entry.outcome is not None:
                self.background.due.append((entry.id, entry.outcome))
            else:
                self.background.start(entry.id, entry.name)
                if entry.runs_on != "client":
                    calls.append(entry.call)
                    ids.append(entry.id)
        out: list[Action] = [StartBackground(tuple(calls), tuple(ids))] if calls else []
        if self.state is IDLE:
            out += self._deliver()
        return out

    def _deliver(self) -> list[Action]:
        """Due background results as the next step: into history (one ``Result`` per
        call, with its id), then a turn whose first request hands them to the model."""
        native = self.background.native
        due = self.background.take_due()
        if not due:
            return []
        items = tuple(result_event(call_id, result) for call_id, result in due)
        if all(native.get(call_id) for call_id, _ in due):
            # Native calls: their outputs, as the provider documents for calls that did
            # not block (OpenAI: function_call_output, then response.create; Gemini: a
            # NON_BLOCKING call's response, scheduled WHEN_IDLE). A fresh connection
            # needs none: history holds them.
            outputs = tuple((native.pop(call_id), encode_result(result)) for call_id, result in due)
            out = self._begin([Persist(items)], None)
            if out[-1] is RETRY:  # (a fresh connection gets them from history)
                out[-1] = Request(outputs=outputs)
            return out
        for call_id, _ in due:
            native.pop(call_id, None)
        message = results_message(encode_results([result for _, result in due]))
        return self._begin([Persist(items)], message)

    def _wait_batch(
        self, out: list[Action], run: RunTools | None, waiting: tuple[str, ...]
    ) -> list[Action]:
        asked = self.batch.approvals_pending
        self.timers.arm(client=bool(waiting), approval=bool(asked))
        if asked:
            out.append(AwaitApproval(asked))
        if waiting:
            out.append(AwaitClient(waiting))
        if run is not None:
            out.append(run)
        elif not waiting and not asked:
            # Every call is answered already (refused, answered on its `call`, or
            # logged before a takeover): the batch is done before the awaited
            # replacement of the response.
            done = self._batch_done(self.batch.results())
            split = next((i for i, a in enumerate(done) if type(a) is Request), len(done))
            at = next((i for i, a in enumerate(out) if type(a) is ReplaceResponse), len(out))
            out[at:at] = done[:split]
            out += done[split:]
        return out

    def _resume(self, given: Resume) -> Sequence[Action]:
        """A takeover found a batch in flight: finish it, then the turn goes on as ever."""
        if self.state is not IDLE or not given.calls:
            return NOTHING
        out = self._begin([Interrupt(content=given.reason)], None)
        out.pop()  # no model request: the batch's calls are known (history has them)
        run, waiting, asked, background = self.batch.restore(given.calls)
        self.state = TOOLS
        out += asked
        out += self._start(background)
        return self._wait_batch(out, run, waiting)

    def _tools_done(self, results: tuple[ToolResult, ...]) -> list[Action]:
        """The server calls' results, in the order of ``RunTools``'s calls."""
        batch = self.batch
        if self.state is not TOOLS or not batch.server_running:
            return []  # results of a batch the machine no longer waits for (the table ignores it)
        out: list[Action] = [*batch.tools_done(results)]
        out += self._maybe_batch_done()
        return out

    def _call_done(self, given: CallDone) -> Sequence[Action]:
        if self.state is not TOOLS:
            return NOTHING
        logged = self.batch.call_done(given.id, given.result)
        return NOTHING if logged is None else (logged,)

    def _client_result(self, answer: ToolResultMessage) -> Sequence[Action]:
        if answer.id in self.background.running:  # a background client call's answer
            name = self.background.running[answer.id]
            result = ToolResult(tool=name, status=answer.status, content=answer.content)
            return self._background_done(answer.id, result)
        batch = self.batch
        if self.state is TOOLS:
            answered = batch.answer(answer)
            if type(answered) is Refuse:
                return [answered]
            return [answered, *self._maybe_batch_done()]
        if self.state in BEFORE_BATCH and batch.answer_early(answer):
            return NOTHING  # answered on its `call`, before `execute`: kept for the batch
        return [batch.refusal(answer)]

    def _approve(self, given: Approve) -> Sequence[Action]:
        """A user's decision on a call waiting for approval (refused unless it is one)."""
        decided = self.batch.decide(given)
        if type(decided) is Refuse:
            return [decided]
        return self._decided([*decided])  # type: ignore[misc]

    def _approval_timeout(self, seconds: float) -> Sequence[Action]:
        if not self.awaits_approval:
            return NOTHING
        return self._decided([*self.batch.approvals_time_out(seconds)])

    def _decided(self, out: list[Action]) -> list[Action]:
        """Decisions are logged; once none is pending, the held calls run."""
        run = self.batch.release()
        if run is not None:
            out.append(run)
        else:
            out += self._maybe_batch_done()
        return out

    def _tick(self, now: float) -> Sequence[Action]:
        """The time is ``now``: armed timers start; the batch's due waits time out."""
        timers = self.timers
        timers.start(now)
        out: list[Action] = []
        if self.awaits_client and timers.client_due(now):
            out += self._client_timeout(timers.client_timeout)
        if self.awaits_approval and timers.approval_due(now):
            out += self._approval_timeout(timers.approval_timeout)
        return out

    def _client_timeout(self, seconds: float) -> Sequence[Action]:
        if not self.awaits_client:
            return NOTHING
        out: list[Action] = [*self.batch.time_out(seconds)]
        out += self._maybe_batch_done()
        return out

    def _maybe_batch_done(self) -> list[Action]:
        batch = self.batch
        if not batch.complete:
            return []
        return self._batch_done(batch.results())

    def _batch_done(self, results: tuple[ToolResult, ...], *, logged: bool = True) -> list[Action]:
        """Every call has its result: history gets them as one ``Result`` (what the model
        reads), then the next step. ``logged``: each call's ``result`` event is out
        already; a malformed block's failure (no call) is logged here."""
        content = encode_results(results)
        payload = result_payload(results)
        out: list[Action] = [
            self._recorder.persist(Result(content=content, payload=payload)),
        ]
        if not logged:
            out.insert(0, Result(content=content, payload=payload))
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
        outputs = self.batch.outputs(results)
        if outputs == ():
            # Every native call runs in the background: the model's response was its
            # answer for now; it speaks again when their outputs come.
            out.append(End())
            return self._close(out)
        if outputs is not None:
            request = self._step(None)
            out.append(Request(outputs=outputs) if request is RETRY else request)
            return out
        out.append(self._step(results_message(content)))
        return out
