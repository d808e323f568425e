"""The journal (issue 28) in the pure parts: keys, the batch in flight, ``Resume``.

A takeover finds a batch in flight by history (it ends with the batch's
calls, ids and all) and its logged outcomes; the machine reuses those and
runs only the calls without one, under the same ids (so the same keys).
"""

from __future__ import annotations

import orjson

from protocol.assembly import results_message
from protocol.calls import ToolCall, ToolResult, result_payload
from protocol.events import Call, Context, Interrupt, Respond, Result, User
from protocol.journal import JournalCall, batch_in_flight, idempotency_key, turn_in_flight
from protocol.turn import TurnMachine, TurnState
from protocol.turn_events import (
    AwaitClient,
    CallDone,
    Persist,
    Request,
    ResponseDone,
    Resume,
    RunTools,
    ToolResultMessage,
    ToolsDone,
    TurnStarted,
    UserMessage,
)
from tests.protocol.test_turn import kinds, only

QUICK = ToolResult(tool="count", status="success", content={"run": 1})
SLOW = ToolResult(tool="count", status="success", content={"run": 2})


def test_a_key_is_the_same_for_one_call_and_differs_between_calls_and_sessions() -> None:
    key = idempotency_key("sess-1", "call_7")
    assert key == idempotency_key("sess-1", "call_7")
    assert len(key) == 32 and int(key, 16) >= 0
    assert key != idempotency_key("sess-1", "call_8")
    assert key != idempotency_key("sess-2", "call_7")
    assert "sess-1" not in key


def test_history_ending_with_calls_is_a_batch_in_flight() -> None:
    one = Call(content='{"name":"count","args":{}}', id="call_3")
    two = Call(content='{"name":"confirm","args":{}}', id="call_4", runs_on="client")
    user = User(content="hi")
    assert batch_in_flight([user, one, two]) == [one, two]
    assert not turn_in_flight([user, one, two])
    assert batch_in_flight([user]) == []
    assert batch_in_flight([user, one, Result(content="[]", payload=result_payload(()))]) == []
    # Calls from before the journal carry no ids: the step is rerun as before.
    assert batch_in_flight([user, Call(content="{}")]) == []
    # A context message added while the batch ran does not hide it from a takeover.
    note = Context(role="system", content="hurry")
    assert batch_in_flight([user, one, two, note]) == [one, two]
    results = Result(content="[]", payload=result_payload(()))
    assert turn_in_flight([user, one, results, note])


def test_resume_reuses_logged_outcomes_and_reruns_the_rest_under_their_ids() -> None:
    machine = TurnMachine()
    journal = (
        JournalCall(id="call_3", name="count", args={"label": "quick"}, outcome=QUICK),
        JournalCall(id="call_4", name="count", args={"label": "slow"}),
    )
    out = machine.feed(Resume("the node stopped", journal))
    assert kinds(out) == ["TurnStarted", "Interrupt", "RunTools"]
    assert only(out, Interrupt).content == "the node stopped"
    run = only(out, RunTools)
    assert run.calls == (ToolCall("count", {"label": "slow"}),) and run.ids == ("call_4",)
    assert machine.state is TurnState.TOOLS
    # The rerun call's outcome is logged once; the reused one is never logged again.
    [logged] = machine.feed(CallDone("call_4", SLOW))
    assert isinstance(logged, Result) and logged.id == "call_4"
    done = machine.feed(ToolsDone((SLOW,)))
    assert kinds(done) == ["Persist", "Request"]
    [history] = only(done, Persist).items
    assert isinstance(history, Result)
    assert orjson.loads(history.content) == [
        {"tool": "count", "status": "success", "content": {"run": 1}},
        {"tool": "count", "status": "success", "content": {"run": 2}},
    ]
    assert only(done, Request).message == results_message(history.content)


def test_resume_of_a_batch_whose_outcomes_are_all_logged_runs_nothing() -> None:
    machine = TurnMachine()
    journal = (JournalCall(id="call_3", name="count", args={}, outcome=QUICK),)
    out = machine.feed(Resume("again", journal))
    assert not [a for a in out if isinstance(a, RunTools | AwaitClient | Result)]
    assert kinds(out)[:2] == ["TurnStarted", "Interrupt"]
    assert isinstance(out[-1], Request) and machine.state is TurnState.STREAMING
    assert isinstance(only(out, Persist).items[0], Result)


def test_resume_asks_the_client_again_under_the_same_id() -> None:
    machine = TurnMachine()
    journal = (JournalCall(id="call_9", name="confirm", args={}, runs_on="client"),)
    out = machine.feed(Resume("again", journal))
    assert only(out, AwaitClient).ids == ("call_9",)
    assert machine.awaits_client
    answered = machine.feed(ToolResultMessage("call_9", "success", True))
    assert kinds(answered) == ["Result", "Persist", "Request"]
    assert only(answered, Result).id == "call_9"


def test_resume_is_ignored_while_a_turn_runs_or_without_calls() -> None:
    machine = TurnMachine()
    assert machine.feed(Resume("x", ())) == ()
    machine.feed(UserMessage(content="hi"))
    journal = (JournalCall(id="call_1", name="count", args={}),)
    assert machine.feed(Resume("x", journal)) == ()


def test_a_tool_step_puts_its_calls_in_history_before_they_run() -> None:
    """The order the shell relies on: the Persist of the calls precedes RunTools."""
    machine = TurnMachine(call_number=40)
    machine.feed(UserMessage(content="hi"))
    machine.text('<execute>[{"name": "count", "args": {}}]</execute>')
    out = machine.feed(ResponseDone("cancelled"))
    names = kinds(out)
    assert names.index("Persist") < names.index("RunTools")
    assert only(out, Persist).items == (Call(content='{"name":"count","args":{}}', id="call_41"),)
    assert only(out, RunTools).ids == ("call_41",)
    assert not [a for a in out if isinstance(a, TurnStarted | Respond)]
