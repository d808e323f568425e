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

from protocol.calls import ToolCall, ToolResult
from protocol.events import Call, Error, ToolResultMessage
from protocol.turn_events import Refuse

__all__ = ["ClientToolRouter", "ToolBatch"]

_RESULT_ENCODER: Final = msgspec.json.Encoder()


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
        "_early",
        "_number",
        "_refused",
        "_server_running",
        "_settled",
        "_slots",
        "_waiting",
        "calls",
        "events",
        "native_ids",
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
        # The running batch: one slot per call, filled by whoever answers it.
        self._slots: list[ToolResult | None] = []
        self._waiting: dict[str, int] = {}  # client call id → slot
        self._server_running = False
        # Client call ids of the last batch no longer waited for → why (for unknown_call).
        self._settled: dict[str, str] = {}

    # --- the step's calls -----------------------------------------------------------------

    def new_attempt(self) -> None:
        """A new attempt at the step: the calls of the last one are forgotten."""
        self.calls = []
        self.events = []
        self.native_ids = []
        self._early = {}
        self._refused = {}

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
        self.calls.append(call)
        self.events.append(event)
        if native_id is not None:
            self.native_ids.append(native_id)

    # --- running it --------------------------------------------------------------------

    def start(self) -> tuple[tuple[ToolCall, ...], tuple[str, ...]]:
        """Open the slots: ``(server calls to run, client call ids to wait for)``.

        A client call refused for its args is answered here; one the client
        answered on its ``call`` (before the batch ran) is filled at once.
        """
        self._settled = {}
        self._slots = [None] * len(self.calls)
        self._waiting = {}
        server: list[ToolCall] = []
        refused = self._refused
        for index, (call, event) in enumerate(zip(self.calls, self.events, strict=True)):
            if event.runs_on == "client":
                self._waiting[event.id] = index
            elif index in refused:
                # A client tool called with bad args: answered here, the client never runs it.
                self._slots[index] = ToolResult(
                    tool=call.name, status="failure", content=refused[index]
                )
            else:
                server.append(call)
        for call_id, answer in self._early.items():
            early = self._waiting.pop(call_id, None)
            if early is not None:
                self._settled[call_id] = "was already answered"
                name = self.calls[early].name
                self._slots[early] = ToolResult(
                    tool=name, status=answer.status, content=answer.content
                )
        self._early = {}
        self._server_running = bool(server)
        return tuple(server), tuple(self._waiting)

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

    def tools_done(self, results: Sequence[ToolResult]) -> None:
        """The server calls' results, in the order ``start`` gave the calls."""
        self._server_running = False
        given = iter(results)
        waited = set(self._waiting.values())
        slots = self._slots
        for index, slot in enumerate(slots):
            if slot is None and index not in waited:
                slots[index] = next(given, None) or ToolResult(
                    tool=self.calls[index].name,
                    status="failure",
                    content="the tool gave no result; try the call again",
                )

    def answer_early(self, answer: ToolResultMessage) -> bool:
        """Keep a client's answer given before the batch runs; False if it answers no call."""
        if answer.id in self._early or not any(
            e.id == answer.id and e.runs_on == "client" for e in self.events
        ):
            return False
        self._early[answer.id] = answer
        return True

    def answer(self, answer: ToolResultMessage) -> Refuse | None:
        """A client's answer to a waited-for call; a ``Refuse`` (``unknown_call``) if none waits."""
        index = self._waiting.pop(answer.id, None)
        if index is None:
            return self.refusal(answer)
        self._settled[answer.id] = "was already answered"
        name = self.calls[index].name
        self._slots[index] = ToolResult(tool=name, status=answer.status, content=answer.content)
        return None

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

    def time_out(self, seconds: float) -> None:
        """The client calls still waited for fail: the client took ``seconds``."""
        for call_id, index in self._waiting.items():
            self._settled[call_id] = f"timed out after {seconds:g}s"
            self._slots[index] = ToolResult(
                tool=self.calls[index].name,
                status="failure",
                content=f"the client did not answer this call within {seconds:g}s, so it was "
                "given up; the client may be gone or busy — go on without it, or ask the "
                "user whether to try again",
            )
        self._waiting = {}

    def settle(self, why: str) -> None:
        """Nothing is waited for any more (the turn ended or was cancelled): ``why`` says so."""
        for call_id in self._waiting:
            self._settled[call_id] = why
        self._waiting = {}
        self._server_running = False

    def outputs(self, results: Sequence[ToolResult]) -> tuple[tuple[str, str], ...] | None:
        """Native calls' ``(call_id, output)`` pairs for ``results``; None for text calls."""
        ids = self.native_ids
        if not ids or len(ids) != len(results):
            return None
        return tuple(
            (call_id, _RESULT_ENCODER.encode(result).decode())
            for call_id, result in zip(ids, results, strict=True)
        )
