"""One model step's tool calls, from the parser's ``call`` events to their results.

The turn machine (``protocol.turn``) decides *when* a batch runs and what
its end means for the turn; this object keeps *which* calls the step made
and who answers each: a server tool (``RunTools``), the session's client
(``runs_on: "client"``, answered by a ``tool_result`` or timed out) or the
gateway itself (a client call whose args failed their check). Results keep
call order: one slot per call, filled by whoever answers it. Pure, like the
machine: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

import msgspec

from protocol.approvals import PendingApprovals, denied_result
from protocol.background import started_result
from protocol.calls import ToolCall, ToolResult, encode_call, encode_results, result_payload
from protocol.configuration import MAX_ARGS_DEPTH, json_depth
from protocol.events import (
    Approval,
    ApprovalRequired,
    Approve,
    Call,
    Error,
    Result,
    ToolResultMessage,
)
from protocol.journal import JournalCall
from protocol.parser import MAX_CALLS, MAX_NAME
from protocol.turn_events import Refuse, RunTools

__all__ = ["ClientToolRouter", "ToolBatch", "native_call"]

_RESULT_ENCODER: Final = msgspec.json.Encoder()


def native_call(name: str, arguments: str) -> tuple[ToolCall, str | None]:
    """A provider's function call (``arguments``: JSON text) as a call, and why it is
    refused (None: it is not). Args too deep are refused before anything walks
    them (encoding, schemas, the tools); args that are not an object become
    ``{}`` (the tool's argument check says what is missing)."""
    if len(name) > MAX_NAME:  # a provider calls the tools it was given: names of ≤ 64
        shown = name[:40] + "…"
        problem = (
            f'the call names a tool of {len(name):,} characters ("{shown}"), over '
            f"{MAX_NAME}: no such tool; call one of the session's tools"
        )
        return ToolCall(name=shown, args={}), problem
    too_deep = False
    try:
        args = msgspec.json.decode(arguments or "{}", type=dict[str, object])
    except (msgspec.DecodeError, msgspec.ValidationError):
        args = {}
    except RecursionError:  # msgspec recurses per level: ~1,000 levels is its end
        args, too_deep = {}, True
    if too_deep or json_depth(args, MAX_ARGS_DEPTH) > MAX_ARGS_DEPTH:
        problem = (
            f"the arguments of the call to {name!r} nest deeper than {MAX_ARGS_DEPTH} "
            "levels, the limit for tool args; call it again with flatter arguments"
        )
        return ToolCall(name=name, args={}), problem
    return ToolCall(name=name, args=args), None


class ClientToolRouter(Protocol):
    """Which calls the session's client runs, and whether their args are right.

    Implemented by ``tools.client.ClientTools`` (it holds the JSON Schemas);
    the machine only asks, so this layer stays free of schema code.
    """

    def runs_on_client(self, name: str) -> bool:
        """``name`` is a client tool this session declared (and may call)."""

    def check_args(self, call: ToolCall) -> str | None:
        """None if the args fit the tool's schema, else a failure message for the model."""


class ToolBatch:
    """The calls of the current model step and, once it runs, their result slots.

    ``call_number`` is where call ids start (``call_<n+1>``): the shell passes
    the log's last seq, which grows by at least one per call, so ids never
    repeat in a session. ``router`` routes calls to the client (None: every
    call runs on the gateway).
    """

    __slots__ = (
        "_approvals",
        "_dropped",
        "_early",
        "_held",
        "_logged",
        "_number",
        "_refused",
        "_server",
        "_server_running",
        "_settled",
        "_slots",
        "_waiting",
        "background",
        "calls",
        "events",
        "native_ids",
        "needs_approval",
        "router",
    )

    def __init__(self, router: ClientToolRouter | None, call_number: int) -> None:
        self.router = router
        self._number = call_number
        self.calls: list[ToolCall] = []
        self.events: list[Call] = []
        self.native_ids: list[str] = []  # native calls' provider ids, parallel to calls
        # Client answers that came before the batch ran (a client may answer on `call`).
        self._early: dict[str, ToolResultMessage] = {}
        self._refused: dict[int, str] = {}  # client calls with bad args → the failure
        self._dropped = 0  # a provider's calls past MAX_CALLS in this step
        # The running batch: one slot per call, filled by whoever answers it.
        self._slots: list[ToolResult | None] = []
        self._logged: list[bool] = []  # the slot's result event is logged (the journal)
        self._server: list[int] = []  # the slots of the running server calls, in run order
        self._waiting: dict[str, int] = {}  # client call id → slot
        self._server_running = False
        # Client call ids of the last batch no longer waited for → why (for unknown_call).
        self._settled: dict[str, str] = {}
        # Server tools whose calls wait for a user's decision (the session's setup).
        self.needs_approval: frozenset[str] = frozenset()
        # Tools (server or client) whose calls do not block the turn (the session's setup).
        self.background: frozenset[str] = frozenset()
        self._approvals = PendingApprovals()
        # Server calls held until every approval of the batch is decided (their slots).
        self._held: list[int] = []

    # --- the step's calls -----------------------------------------------------------------

    def new_attempt(self) -> None:
        """A new attempt at the step: the calls of the last one are forgotten."""
        self.calls = []
        self.events = []
        self.native_ids = []
        self._early = {}
        self._refused = {}
        self._dropped = 0

    def native(self, native_id: str, name: str, arguments: str) -> list[Error | Call]:
        """A provider's function call in this step: its ``call`` event, after the error
        that refuses it if it is refused (``native_call``).

        Past ``MAX_CALLS`` calls, as an ``<execute>`` block, the rest are dropped (one
        error says so): 30,000 calls in one response would each be logged, sent and
        answered in one loop pass. A real provider calls a few tools a response.
        """
        if len(self.calls) >= MAX_CALLS:
            self._dropped += 1
            if self._dropped > 1:
                return []
            dropped = (
                f"the model made over {MAX_CALLS} function calls in one response; the first "
                f"{MAX_CALLS} run and the rest are dropped: ask for fewer calls at once"
            )
            return [Error(code="malformed_execute", content=dropped)]
        call, problem = native_call(name, arguments)
        event = Call(content=encode_call(call))
        self.add(call, event, native_id, refused=problem)
        if problem is None:
            return [event]
        return [Error(code="malformed_execute", content=problem), event]

    def add(
        self,
        call: ToolCall,
        event: Call,
        native_id: str | None = None,
        *,
        refused: str | None = None,
    ) -> None:
        """A call of this step (text or native): its ``id``, and who runs it.

        ``refused``: the call is answered by the gateway with this failure (its
        args could not be taken), wherever it would have run.
        """
        self._number += 1
        event.id = f"call_{self._number}"
        router = self.router
        if refused is not None:
            self._refused[len(self.calls)] = refused
        elif router is not None and router.runs_on_client(call.name):
            # Checked before the client sees it: a bad call is answered here.
            problem = router.check_args(call)
            if problem is None:
                event.runs_on = "client"
            else:
                self._refused[len(self.calls)] = problem
        if (
            len(self.calls) not in self._refused
            and call.name in self.background
            and call.name not in self.needs_approval  # an approved call runs with its batch
        ):
            event.background = True
        self.calls.append(call)
        self.events.append(event)
        if native_id is not None:
            self.native_ids.append(native_id)

    # --- running it --------------------------------------------------------------------

    def start(
        self, room: int | None = None, full: str = ""
    ) -> tuple[RunTools | None, tuple[str, ...], list[Result | ApprovalRequired], list[int]]:
        """Open the slots: ``(server calls to run, client call ids to wait for, results
        now, background calls)``.

        A client call refused for its args is answered here; one the client
        answered on its ``call`` (before the batch ran) is filled at once.
        Their ``result`` events are the third part (the journal's entries). A
        background call's slot says it started (the fourth part: their slots);
        past ``room`` more background calls (None: no limit) a call is not
        started and its slot is a failure saying ``full``.
        """
        self._open()
        server: list[int] = []
        now: list[Result | ApprovalRequired] = []
        refused = self._refused
        background: list[int] = []
        for index, event in enumerate(self.events):
            if event.background is True:
                name = self.calls[index].name
                if room is not None and room <= 0:
                    now.append(
                        self._fill(index, ToolResult(tool=name, status="failure", content=full))
                    )
                    continue
                if room is not None:
                    room -= 1
                self._slots[index] = started_result(name)
                background.append(index)
            elif event.runs_on == "client":
                self._waiting[event.id] = index
            elif index in refused:
                # A client tool called with bad args: answered here, the client never runs it.
                result = ToolResult(
                    tool=self.calls[index].name, status="failure", content=refused[index]
                )
                now.append(self._fill(index, result))
            else:
                server.append(index)
        needs = self.needs_approval
        for index in server:
            if self.calls[index].name in needs:
                now.append(self._approvals.ask(index, self.events[index].id, self.calls[index]))
        for call_id, answer in self._early.items():
            early = self._waiting.pop(call_id, None)
            if early is not None:
                now.append(self._answered(early, answer))
        self._early = {}
        return self._run_or_hold(server), tuple(self._waiting), now, background

    def restore(
        self, journal: Sequence[JournalCall]
    ) -> tuple[RunTools | None, tuple[str, ...], list[ApprovalRequired], list[int]]:
        """A batch a takeover found in flight: its calls as logged, their outcomes reused.

        Only the calls without a logged outcome run again (server calls, with
        their ids and so their keys) or are asked of the client again (under
        the same ids). Nothing is logged for the reused outcomes: the log has them.
        A call still waiting for approval waits again (its ``approval_required``
        is logged; one the log lacks is asked now, the third part).
        """
        self.new_attempt()
        for entry in journal:
            self.calls.append(entry.call)
            event = Call(content="", id=entry.id, runs_on=entry.runs_on)
            if entry.background:
                event.background = True
            self.events.append(event)
        self._open()
        server: list[int] = []
        asked: list[ApprovalRequired] = []
        background: list[int] = []
        for index, entry in enumerate(journal):
            if entry.outcome is not None:
                self._slots[index] = entry.outcome
                self._logged[index] = True
            elif entry.background:
                self._slots[index] = started_result(entry.name)
                background.append(index)
            elif entry.runs_on == "client":
                self._waiting[entry.id] = index
            else:
                server.append(index)
                if entry.approval == "pending":
                    self._approvals.wait_again(index, entry.id, entry.call)
                elif entry.approval == "" and entry.name in self.needs_approval:
                    asked.append(self._approvals.ask(index, entry.id, entry.call))
        return self._run_or_hold(server), tuple(self._waiting), asked, background

    def _open(self) -> None:
        count = len(self.calls)
        self._settled = {}
        self._slots = [None] * count
        self._logged = [False] * count
        self._waiting = {}
        self._approvals.clear()
        self._held = []

    def _run_or_hold(self, server: list[int]) -> RunTools | None:
        """Run the server calls, or hold them all while an approval is pending.

        One ``RunTools`` per batch: calls that need no approval wait for the
        others' decisions (a batch is one step for the model anyway).
        """
        if self._approvals.pending:
            self._held = server
            self._server_running = bool(server)  # they count as running: the batch waits
            return None
        return self._run(server)

    @property
    def approvals_pending(self) -> tuple[str, ...]:
        """Ids of the calls waiting for a user's decision."""
        return self._approvals.pending

    def decide(self, given: Approve) -> list[Approval | Result] | Refuse:
        """A user's decision: the ``approval`` (and a denied call's ``result``) to log, or
        a ``Refuse`` (``unknown_call``, ``wrong_digest``). Once nothing is pending, the
        held calls run: ``release`` gives their ``RunTools``."""
        decided = self._approvals.decide(given)
        if isinstance(decided, Refuse):
            return decided
        index, approval = decided
        out: list[Approval | Result] = [approval]
        if approval.decision == "deny":
            out.append(self._fill(index, denied_result(self.calls[index].name)))
        return out

    def approvals_time_out(self, seconds: float) -> list[Approval | Result]:
        out: list[Approval | Result] = []
        for index, approval in self._approvals.time_out(seconds):
            out.append(approval)
            out.append(self._fill(index, denied_result(self.calls[index].name, timeout=seconds)))
        return out

    def release(self) -> RunTools | None:
        """The held server calls that were not denied, once no approval is pending."""
        if self._approvals.pending or not self._held:
            return None
        run = [i for i in self._held if self._slots[i] is None]
        self._held = []
        self._server_running = False
        return self._run(run)

    def _run(self, server: list[int]) -> RunTools | None:
        self._server = server
        self._server_running = bool(server)
        if not server:
            return None
        return RunTools(
            tuple(self.calls[i] for i in server), tuple(self.events[i].id for i in server)
        )

    def _fill(
        self, index: int, result: ToolResult, item: str | msgspec.UnsetType = msgspec.UNSET
    ) -> Result:
        """Fill slot ``index``; its ``result`` event (the journal entry of that call),
        named ``item`` when the client named its answer."""
        self._slots[index] = result
        self._logged[index] = True
        return Result(
            content=encode_results((result,)),
            payload=result_payload((result,)),
            id=self.events[index].id,
            item=item,
        )

    @property
    def complete(self) -> bool:
        """Every slot is filled (no server call runs, no client call is waited for)."""
        return not self._server_running and not self._waiting

    @property
    def server_running(self) -> bool:
        return self._server_running

    @property
    def waiting(self) -> tuple[str, ...]:
        """Ids of the client-side calls still unanswered."""
        return tuple(self._waiting)

    def results(self) -> tuple[ToolResult, ...]:
        return tuple(slot for slot in self._slots if slot is not None)

    def call_done(self, call_id: str, result: ToolResult) -> Result | None:
        """A server call finished: its ``result`` event, logged at once (None: not ours now)."""
        if not self._server_running:
            return None
        for index in self._server:
            if self.events[index].id == call_id:
                if self._logged[index]:
                    return None
                return self._fill(index, result)
        return None

    def tools_done(self, results: Sequence[ToolResult]) -> list[Result]:
        """The server calls' results, in the order ``start`` gave the calls.

        They fill the slots (the model reads these: the executor may have cut
        them to the batch's share); calls whose outcome was not logged yet get
        their ``result`` events now.
        """
        self._server_running = False
        given = iter(results)
        out: list[Result] = []
        for index in self._server:
            result = next(given, None) or ToolResult(
                tool=self.calls[index].name,
                status="failure",
                content="the tool gave no result; try the call again",
            )
            if self._logged[index]:
                self._slots[index] = result
            else:
                out.append(self._fill(index, result))
        self._server = []
        return out

    def answer_early(self, answer: ToolResultMessage) -> bool:
        """Keep a client's answer given before the batch runs; False if it answers no call."""
        if answer.id in self._early or not any(
            e.id == answer.id and e.runs_on == "client" for e in self.events
        ):
            return False
        self._early[answer.id] = answer
        return True

    def answer(self, answer: ToolResultMessage) -> Refuse | Result:
        """A client's answer to a waited-for call: its ``result`` event, or a
        ``Refuse`` (``unknown_call``) if none waits for it."""
        index = self._waiting.pop(answer.id, None)
        if index is None:
            return self.refusal(answer)
        return self._answered(index, answer)

    def _answered(self, index: int, answer: ToolResultMessage) -> Result:
        """Slot ``index`` filled with a client's ``answer`` (named as it named it)."""
        self._settled[answer.id] = "was already answered"
        result = ToolResult(
            tool=self.calls[index].name, status=answer.status, content=answer.content
        )
        return self._fill(index, result, answer.item)

    def refusal(self, answer: ToolResultMessage) -> Refuse:
        """``unknown_call`` for an answer nobody waits for, saying why when it is known."""
        why = self._settled.get(answer.id)
        if why is None:
            content = (
                f"no call with id {answer.id[:80]!r} is waiting for a result; answer only "
                'calls with "runs_on": "client" of the running turn, once each'
            )
        else:
            content = f"call {answer.id!r} {why}; this tool_result was ignored"
        return Refuse(Error(code="unknown_call", content=content))

    def time_out(self, seconds: float) -> list[Result]:
        """The client calls still waited for fail: the client took ``seconds``."""
        out: list[Result] = []
        for call_id, index in self._waiting.items():
            self._settled[call_id] = f"timed out after {seconds:g}s"
            result = ToolResult(
                tool=self.calls[index].name,
                status="failure",
                content=f"the client did not answer this call within {seconds:g}s, so it was "
                "given up; the client may be gone or busy — go on without it, or ask the "
                "user whether to try again",
            )
            out.append(self._fill(index, result))
        self._waiting = {}
        return out

    def settle(self, why: str) -> None:
        """Nothing is waited for any more (the turn ended or was cancelled): ``why`` says so."""
        for call_id in self._waiting:
            self._settled[call_id] = why
        self._waiting = {}
        self._server_running = False
        self._server = []
        self._held = []
        self._approvals.settle(why)

    def outputs(self, results: Sequence[ToolResult]) -> tuple[tuple[str, str], ...] | None:
        """Native calls' ``(call_id, output)`` pairs for ``results``; None for text calls.

        A background call has none yet: the provider's own way is to send its
        output when it is done (the model goes on meanwhile). One that was not
        started (the session's limit) has its failure now."""
        ids = self.native_ids
        if not ids or len(ids) != len(results):
            return None
        logged = self._logged
        return tuple(
            (call_id, _RESULT_ENCODER.encode(result).decode())
            for index, (call_id, result, event) in enumerate(
                zip(ids, results, self.events, strict=True)
            )
            if event.background is not True or (index < len(logged) and logged[index])
        )

    def native_id(self, index: int) -> str:
        """The provider's id of native call ``index`` ("" for a text call)."""
        return self.native_ids[index] if index < len(self.native_ids) else ""
