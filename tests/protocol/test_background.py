"""Tool calls that do not block the turn (issue 28), in the machine alone.

A background call answers the model at once ("started"), the turn goes on;
its real result is logged when it comes (one ``result`` per call) and given
to the model as the next step: at once when idle, after the turn otherwise.
"""

from __future__ import annotations

import orjson

from protocol.assembly import results_message
from protocol.background import STARTED
from protocol.calls import ToolCall, ToolResult, encode_results, result_payload
from protocol.events import Call, Cancelled, Metric, Result, Usage
from protocol.journal import JournalCall, background_in_flight
from protocol.turn import TurnMachine, TurnState
from protocol.turn_events import (
    Action,
    BackgroundDone,
    Cancel,
    CancelBackground,
    NativeCall,
    Persist,
    Refuse,
    Request,
    ResponseDone,
    ResumeBackground,
    RunTools,
    StartBackground,
    ToolResultMessage,
    UserMessage,
)
from tests.protocol.test_turn import kinds, only, stream

USAGE = Usage(input=10, output=5)
SLOW = '{"name": "slow", "args": {"n": 1}}'
DONE = ToolResult(tool="slow", status="success", content={"n": 1})


def started(machine: TurnMachine, *calls: str) -> tuple[list[Action], list[Call]]:
    machine.feed(UserMessage(content="go"))
    out = list(stream(machine, f"<execute>[{', '.join(calls)}]</execute>"))
    out += machine.feed(ResponseDone("cancelled", USAGE))
    return out, [a for a in out if isinstance(a, Call)]


def background_machine() -> TurnMachine:
    machine = TurnMachine(call_number=20)
    machine.batch.background = frozenset({"slow", "ask"})
    return machine


def test_a_background_call_starts_and_the_turn_goes_on_at_once() -> None:
    machine = background_machine()
    out, [call] = started(machine, SLOW)
    assert call.background is True
    start = only(out, StartBackground)
    assert start.calls == (ToolCall("slow", {"n": 1}),) and start.ids == (call.id,)
    assert not [a for a in out if isinstance(a, RunTools | Result)]  # no result yet
    names = kinds(out)
    assert names.index("Persist") < names.index("StartBackground")
    request = out[-1]
    assert isinstance(request, Request) and request.message is not None
    assert STARTED in request.message.content
    assert machine.state is TurnState.STREAMING and machine.background.running == {call.id: "slow"}


def test_its_result_is_logged_when_it_comes_and_is_the_next_step_after_the_turn() -> None:
    machine = background_machine()
    _out, [call] = started(machine, SLOW)
    # The result comes while the model still answers: logged now, delivered later.
    logged = machine.feed(BackgroundDone(call.id, DONE))
    assert kinds(logged) == ["Result"] and only(logged, Result).id == call.id
    stream(machine, "Working on it.<end>")
    closing = machine.feed(ResponseDone("completed", USAGE))
    names = kinds(closing)
    assert names.index("Metric") < names.index("TurnStarted")
    persist = [a for a in closing if isinstance(a, Persist)][-1]
    assert [(r.id, r.content) for r in persist.items] == [  # type: ignore[union-attr]
        (call.id, only(logged, Result).content)
    ]
    request = closing[-1]
    assert isinstance(request, Request)
    assert request.message == results_message(encode_results([DONE]))
    assert machine.feed(BackgroundDone(call.id, DONE)) == ()  # once


def test_a_result_that_comes_when_idle_starts_the_next_step_at_once() -> None:
    machine = background_machine()
    _out, [call] = started(machine, SLOW)
    stream(machine, "Started.<end>")
    machine.feed(ResponseDone("completed", USAGE))
    assert machine.idle
    out = machine.feed(BackgroundDone(call.id, DONE))
    assert kinds(out) == ["Result", "TurnStarted", "Persist", "Request"]


def test_cancel_cancels_the_running_background_calls_with_one_result_each() -> None:
    machine = background_machine()
    _out, [call] = started(machine, SLOW)
    out = machine.feed(Cancel())
    [result] = [a for a in out if isinstance(a, Result)]
    assert result.id == call.id and orjson.loads(result.content)[0]["status"] == "failure"
    assert only(out, CancelBackground).ids == (call.id,)
    assert kinds(out).index("Result") < kinds(out).index("Cancelled")
    assert only(out, Persist).items[-1] == result  # history knows it ended
    assert machine.feed(BackgroundDone(call.id, DONE)) == ()
    kept = background_machine()
    kept.cancel_background = False
    _out, [other] = started(kept, SLOW)
    assert not [a for a in kept.feed(Cancel()) if isinstance(a, CancelBackground)]
    assert kept.background.running == {other.id: "slow"}


def test_a_cancel_between_turns_cancels_the_background_calls_and_says_so() -> None:
    machine = background_machine()
    _out, calls = started(machine, SLOW, SLOW)
    stream(machine, "Started.<end>")
    machine.feed(ResponseDone("completed", USAGE))
    assert machine.idle and len(machine.background.running) == 2
    out = machine.feed(Cancel())
    assert kinds(out) == ["Persist", "Result", "Result", "Cancelled", "Metric", "CancelBackground"]
    assert only(out, CancelBackground).ids == tuple(c.id for c in calls)
    assert "2 background calls" in only(out, Cancelled).content
    assert only(out, Metric).step == Usage(input=0, output=0)
    assert machine.idle and not machine.background.running
    # Nothing left to cancel: the usual reply.
    [refusal] = machine.feed(Cancel())
    assert isinstance(refusal, Refuse) and refusal.error.code == "no_turn"
    kept = background_machine()
    kept.cancel_background = False
    started(kept, SLOW)
    stream(kept, "Started.<end>")
    kept.feed(ResponseDone("completed", USAGE))
    [refusal] = kept.feed(Cancel())
    assert isinstance(refusal, Refuse) and len(kept.background.running) == 1


def test_background_calls_past_the_sessions_limit_are_not_started() -> None:
    machine = background_machine()
    machine.background.limit = 3
    out, calls = started(machine, *[SLOW] * 5)
    start = only(out, StartBackground)
    assert start.ids == tuple(c.id for c in calls[:3])
    refused = [a for a in out if isinstance(a, Result)]
    assert [r.id for r in refused] == [c.id for c in calls[3:]]
    for result in refused:
        [payload] = orjson.loads(result.content)
        assert payload["status"] == "failure" and "at most 3 background calls" in payload["content"]
    # The model reads the three that started and the two that did not, in call order.
    request = out[-1]
    assert isinstance(request, Request)
    stream(machine, "Ok.<end>")
    machine.feed(ResponseDone("completed", USAGE))
    # The running ones still count: a new batch finds no room until one returns.
    out, [_late] = started(machine, SLOW)
    assert not [a for a in out if isinstance(a, StartBackground)]
    stream(machine, "Ok.<end>")
    machine.feed(ResponseDone("completed", USAGE))
    machine.feed(BackgroundDone(calls[0].id, DONE))
    assert machine.background.room == 1


def test_a_background_client_call_is_answered_whenever_the_client_can() -> None:
    class Router:
        def runs_on_client(self, name: str) -> bool:
            return name == "ask"

        def check_args(self, call: ToolCall) -> str | None:
            return None

    machine = TurnMachine(client_tools=Router())
    machine.batch.background = frozenset({"ask"})
    out, [call] = started(machine, '{"name": "ask", "args": {}}')
    assert call.runs_on == "client" and call.background is True
    assert not [a for a in out if isinstance(a, StartBackground)]  # the client runs it
    assert isinstance(out[-1], Request)  # not waited for
    stream(machine, "Asked.<end>")
    machine.feed(ResponseDone("completed", USAGE))
    answered = machine.feed(ToolResultMessage(call.id, "success", "yes"))
    assert kinds(answered)[:2] == ["Result", "TurnStarted"]


def test_a_takeover_reruns_running_background_calls_and_delivers_logged_ones() -> None:
    history = [
        Call(content=SLOW, id="call_1", background=True),
        Call(content=SLOW, id="call_2", background=True),
        Result(content="[]", payload=result_payload(())),
        Result(content="[]", payload=result_payload(()), id="call_2"),  # delivered already
    ]
    assert [c.id for c in background_in_flight(history)] == ["call_1"]
    machine = TurnMachine()
    out = machine.feed(
        ResumeBackground(
            (
                JournalCall(id="call_1", name="slow", args={"n": 1}, background=True),
                JournalCall(id="call_3", name="slow", args={}, outcome=DONE, background=True),
            )
        )
    )
    assert only(out, StartBackground).ids == ("call_1",)
    assert kinds(out)[1:] == ["TurnStarted", "Persist", "Request"]  # call_3's result is due


def test_a_native_background_call_past_the_limit_gets_its_failure_as_output() -> None:
    machine = background_machine()
    machine.background.limit = 1
    machine.voice = True
    machine.feed(UserMessage(content="go"))
    machine.feed(NativeCall("fc_1", "slow", "{}"))
    machine.feed(NativeCall("fc_2", "slow", "{}"))
    out = machine.feed(ResponseDone("completed", USAGE))
    assert len(only(out, StartBackground).ids) == 1
    request = out[-1]
    # The started one answers later (the provider's way); the other one's failure now.
    assert isinstance(request, Request) and [c for c, _ in request.outputs] == ["fc_2"]
    assert "at most 1 background calls" in orjson.loads(request.outputs[0][1])["content"]
