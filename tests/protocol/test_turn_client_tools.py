"""The turn machine's wait for client-side tool results (issue 14): no sockets, no loop.

A stand-in router says which tools run on the client and checks args the way
``tools.client.ClientTools`` does (by a rule, here: ``question`` must be a
string), so these tests need nothing outside ``protocol``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.calls import ToolCall, ToolResult
from protocol.events import Call, Cancelled, End, Error, Event, Interrupt, Metric, Result, Usage
from protocol.turn import (
    TurnMachine,
    TurnState,
)
from protocol.turn_events import (
    Action,
    AwaitClient,
    Cancel,
    ClientTimeout,
    NativeCall,
    Persist,
    Refuse,
    Request,
    ResponseDone,
    RunTools,
    ShellFailed,
    Shutdown,
    SpeechBegan,
    TextDelta,
    ToolResultMessage,
    ToolsDone,
    TurnInput,
    TurnStarted,
    UpstreamLost,
    UserMessage,
)
from tests.protocol.test_turn import _AWAITED, _SYNC, kinds, only, stream

USAGE = Usage(input=10, output=5)


class Router:
    """``confirm`` and ``pick`` run on the client; ``question`` must be a string."""

    def runs_on_client(self, name: str) -> bool:
        return name in ("confirm", "pick")

    def check_args(self, call: ToolCall) -> str | None:
        question = call.args.get("question", "")
        return None if isinstance(question, str) else "args.question: 42 is not of type 'string'"


def block(*calls: tuple[str, dict[str, Any]]) -> str:
    body = orjson.dumps([{"name": n, "args": a} for n, a in calls]).decode()
    return f"<execute>{body}</execute>"


def at_tools(*calls: tuple[str, dict[str, Any]]) -> tuple[TurnMachine, list[Call], list[Action]]:
    """A machine whose model just wrote ``calls``: the batch's actions, and its call events."""
    machine = TurnMachine(client_tools=Router(), call_number=100)
    machine.feed(UserMessage(content="hi"))
    out = stream(machine, block(*calls))
    out += machine.feed(ResponseDone("cancelled", USAGE))
    return machine, [a for a in out if isinstance(a, Call)], out


def results(actions: Sequence[Action]) -> list[dict[str, Any]]:
    """The batch's results as the model reads them (history's one ``Result``, in call order)."""
    persist = [a for a in actions if isinstance(a, Persist) and isinstance(a.items[-1], Result)]
    assert len(persist) == 1, kinds(actions)
    return list(orjson.loads(persist[0].items[-1].content))  # type: ignore[union-attr]


def logged(actions: Sequence[Action]) -> dict[str, list[dict[str, Any]]]:
    """The ``result`` events logged (the journal): call id → its results."""
    return {str(a.id): list(orjson.loads(a.content)) for a in actions if isinstance(a, Result)}


ASK = ("confirm", {"question": "ok?"})
LIST = ("list", {"path": "."})
LISTED = ToolResult(tool="list", status="success", content=["a"])


def test_a_client_may_answer_on_the_call_before_the_batch_runs() -> None:
    """Clients react to `call`; its answer may arrive while the model's response stops."""
    machine = TurnMachine(client_tools=Router(), call_number=100)
    machine.feed(UserMessage(content="hi"))
    out = stream(machine, block(ASK, LIST))
    (ask, _listed) = [a for a in out if isinstance(a, Call)]
    assert machine.state is TurnState.STOPPING
    assert machine.feed(ToolResultMessage(ask.id, "success", True)) == ()  # kept, no refusal
    batch = machine.feed(ResponseDone("cancelled", USAGE))
    assert not [a for a in batch if isinstance(a, AwaitClient)]  # nothing left to wait for
    done = machine.feed(ToolsDone((LISTED,)))
    assert results(done) == [
        {"tool": "confirm", "status": "success", "content": True},
        {"tool": "list", "status": "success", "content": ["a"]},
    ]
    # Answered once: a second answer to it is refused.
    assert only(machine.feed(ToolResultMessage(ask.id, "success", False)), Refuse)


def test_a_batch_of_only_early_answers_closes_at_once_in_order() -> None:
    machine = TurnMachine(client_tools=Router(), call_number=100)
    machine.feed(UserMessage(content="hi"))
    (ask,) = [a for a in stream(machine, block(ASK)) if isinstance(a, Call)]
    machine.feed(ToolResultMessage(ask.id, "success", "yes", item="out_1"))
    batch = machine.feed(ResponseDone("cancelled", USAGE))
    names = kinds(batch)
    assert names.index("Result") < names.index("ReplaceResponse") < names.index("Request")
    assert results(batch) == [{"tool": "confirm", "status": "success", "content": "yes"}]
    # The name its client gave the answer is logged with it, early or not.
    assert only(batch, Result).item == "out_1"


def test_a_client_call_carries_an_id_and_runs_on_client_and_the_turn_waits() -> None:
    machine, [call], out = at_tools(ASK)
    assert (call.id, call.runs_on) == ("call_101", "client")
    assert only(out, AwaitClient).ids == ("call_101",)
    assert not [a for a in out if isinstance(a, RunTools)]
    assert machine.awaits_client and machine.batch.waiting == ("call_101",)
    done = machine.feed(ToolResultMessage("call_101", "success", True, item="out_2"))
    assert kinds(done) == ["Result", "Persist", "Request"]
    assert only(done, Result).item == "out_2"
    assert results(done) == [{"tool": "confirm", "status": "success", "content": True}]
    assert not machine.awaits_client and machine.state is TurnState.STREAMING


@pytest.mark.parametrize("client_first", [True, False])
def test_a_mixed_batch_runs_server_calls_meanwhile_and_keeps_call_order(
    client_first: bool,
) -> None:
    machine, calls, out = at_tools(LIST, ASK, LIST)
    assert [c.runs_on for c in calls] == ["gateway", "client", "gateway"]
    assert only(out, RunTools).calls == (ToolCall("list", {"path": "."}),) * 2
    assert kinds(out)[-2:] == ["AwaitClient", "RunTools"]
    answer = ToolResultMessage(calls[1].id, "failure", "the user said no")
    # Each call's outcome is logged as it comes (the journal), whoever answers first.
    if client_first:
        assert list(logged(machine.feed(answer))) == [calls[1].id]
        done = machine.feed(ToolsDone((LISTED, LISTED)))
        assert list(logged(done)) == [calls[0].id, calls[2].id]
    else:
        assert list(logged(machine.feed(ToolsDone((LISTED, LISTED))))) == [
            calls[0].id,
            calls[2].id,
        ]
        done = machine.feed(answer)
        assert list(logged(done)) == [calls[1].id]
    assert [(r["tool"], r["status"]) for r in results(done)] == [
        ("list", "success"),
        ("confirm", "failure"),
        ("list", "success"),
    ]


def test_args_that_break_the_schema_are_answered_without_the_client() -> None:
    machine, [call], out = at_tools(("confirm", {"question": 42}))
    assert call.runs_on == "gateway"
    assert not [a for a in out if isinstance(a, AwaitClient | RunTools)]
    [result] = results(out)
    assert result["status"] == "failure" and "args.question" in result["content"]
    assert machine.state is TurnState.STREAMING


def test_unanswered_calls_fail_at_the_timeout_and_late_answers_are_refused() -> None:
    machine, calls, _ = at_tools(ASK, ("pick", {}))
    machine.feed(ToolResultMessage(calls[1].id, "success", "b"))
    done = machine.feed(ClientTimeout(60.0))
    first, second = results(done)
    assert first["status"] == "failure" and "within 60s" in first["content"]
    assert second == {"tool": "pick", "status": "success", "content": "b"}
    late = only(machine.feed(ToolResultMessage(calls[0].id, "success", True)), Refuse)
    assert late.error.code == "unknown_call" and "timed out after 60s" in late.error.content
    twice = only(machine.feed(ToolResultMessage(calls[1].id, "success", "b")), Refuse)
    assert "already answered" in twice.error.content


def test_an_unknown_id_is_refused_and_the_wait_goes_on() -> None:
    machine, [call], _ = at_tools(ASK)
    refusal = only(machine.feed(ToolResultMessage("call_1", "success", 1)), Refuse)
    assert refusal.error.code == "unknown_call" and "call_1" in refusal.error.content
    assert machine.awaits_client
    assert only(machine.feed(ToolResultMessage(call.id, "success", 1)), Result)


def test_a_timeout_with_nothing_waited_for_does_nothing() -> None:
    machine, _, _ = at_tools(LIST)
    assert machine.feed(ClientTimeout(1.0)) == ()
    assert machine.state is TurnState.TOOLS


# Every point of the wait a cancel can come at: (answers and server results before it).
_BEFORE_CANCEL = [
    [],
    ["tools"],
    ["ask"],
    ["pick"],
    ["ask", "tools"],
    ["tools", "pick"],
]


@pytest.mark.parametrize("before", _BEFORE_CANCEL)
def test_cancel_at_any_point_of_the_wait_closes_the_turn_once(before: list[str]) -> None:
    machine, calls, _ = at_tools(ASK, LIST, ("pick", {}))
    feeds = {
        "tools": ToolsDone((LISTED,)),
        "ask": ToolResultMessage(calls[0].id, "success", True),
        "pick": ToolResultMessage(calls[2].id, "success", "x"),
    }
    for step in before:
        assert {type(a) for a in machine.feed(feeds[step])} == {Result}
    out = machine.feed(Cancel())
    assert kinds(out) == ["Persist", "Cancelled", "Metric"]
    assert machine.idle and not machine.awaits_client
    # Whatever arrives after the cancel changes nothing and says why.
    assert machine.feed(ToolsDone((LISTED,))) == ()
    for call in (calls[0], calls[2]):
        late = machine.feed(ToolResultMessage(call.id, "success", 1))
        assert only(late, Refuse).error.code == "unknown_call"
    assert machine.feed(ClientTimeout(1.0)) == ()


def test_shutdown_while_waiting_forgets_the_calls() -> None:
    machine, [call], _ = at_tools(ASK)
    machine.feed(Shutdown())
    assert machine.idle
    assert only(machine.feed(ToolResultMessage(call.id, "success", 1)), Refuse)


def test_ids_never_repeat_across_steps() -> None:
    machine, [first], _out = at_tools(ASK)
    machine.feed(ToolResultMessage(first.id, "success", 1))
    second = [a for a in stream(machine, block(ASK)) if isinstance(a, Call)]
    assert second[0].id == "call_102"


# --- any order of inputs ----------------------------------------------------------

_IDS = ("call_1", "call_2", "call_3", "call_9")
_ANSWERS: list[TurnInput] = [ToolResultMessage(i, "success", i) for i in _IDS]
_INPUTS: list[TurnInput] = [
    UserMessage(content="u"),
    TextDelta(block(ASK)),
    TextDelta(block(ASK, LIST, ("pick", {}))),
    TextDelta(block(("confirm", {"question": 42}), LIST)),
    TextDelta("<end>"),
    ResponseDone("completed", USAGE),
    ResponseDone("cancelled", None),
    UpstreamLost("l"),
    ToolsDone((LISTED,)),
    ClientTimeout(1.0),
    *_ANSWERS,
    Cancel(),
    ShellFailed("x"),
]
_LIKELY: dict[TurnState, list[TurnInput]] = {
    TurnState.IDLE: [UserMessage(content="u")],
    TurnState.STREAMING: [_INPUTS[1], _INPUTS[2], _INPUTS[3], _INPUTS[4], _INPUTS[5], Cancel()],
    TurnState.STOPPING: [ResponseDone("cancelled", USAGE), UpstreamLost("l"), Cancel()],
    TurnState.ENDING: [ResponseDone("completed", USAGE), Cancel()],
    TurnState.CANCELLING: [ResponseDone("cancelled", None), UpstreamLost("l")],
    TurnState.TOOLS: [*_ANSWERS, *_ANSWERS, ToolsDone((LISTED,)), ClientTimeout(1.0), Cancel()],
    TurnState.BACKOFF: [Cancel()],
}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_order_of_client_answers_and_cancels_keeps_the_rules(data: st.DataObject) -> None:
    """One closing event then one metric per turn; one result per call, logged once; the
    model's results (history) per batch, in call order."""
    machine = TurnMachine(client_tools=Router(), max_steps=3)
    open_turn = closing = False
    expected: dict[str, str] = {}  # the batch in flight: call id → tool name, in call order
    logged_ids: set[str] = set()
    for _ in range(data.draw(st.integers(0, 60))):
        likely = data.draw(st.integers(0, 9)) > 0
        given_input = data.draw(st.sampled_from(_LIKELY[machine.state] if likely else _INPUTS))
        actions = machine.feed(given_input)
        awaited = False
        for action in actions:
            if isinstance(action, (*_AWAITED, AwaitClient)):
                awaited = True
                continue
            assert not awaited or isinstance(action, Refuse), kinds(actions)
            if isinstance(action, TurnStarted):
                assert not open_turn
                open_turn = True
                continue
            if (
                isinstance(action, Persist)
                and action.items
                and isinstance(action.items[-1], Result)
            ):
                got = [r["tool"] for r in orjson.loads(action.items[-1].content)]
                if expected:
                    assert got == list(expected.values())
                    assert logged_ids == set(expected)  # every call's result was logged
                expected, logged_ids = {}, set()
            if isinstance(action, _SYNC):
                continue
            event: Event = action  # type: ignore[assignment]
            if closing:
                assert isinstance(event, Metric)
                open_turn = closing = False
                continue
            assert open_turn
            if isinstance(event, Call):
                expected[event.id] = orjson.loads(event.content)["name"]
            if isinstance(event, Result) and isinstance(event.id, str):
                assert event.id in expected and event.id not in logged_ids
                logged_ids.add(event.id)
            if isinstance(event, End | Cancelled):
                closing, expected, logged_ids = True, {}, set()
            if isinstance(event, Interrupt) or (
                isinstance(event, Error) and event.code == "upstream"
            ):
                expected, logged_ids = {}, set()  # the step is rerun, or the turn stops
        if not machine.awaits_client:
            assert machine.batch.waiting == () or machine.state is TurnState.TOOLS
        assert machine.idle == (not open_turn), (machine.state, open_turn)


def test_native_calls_of_a_voice_session_wait_for_the_client_too() -> None:
    """A native function call to a client tool goes to the client; its answer and the
    server call's result go back to the provider as function outputs, in call order."""
    machine = TurnMachine(client_tools=Router(), call_number=7)
    machine.voice = True
    machine.feed(UserMessage(content="delete it?"))
    [asked] = machine.feed(NativeCall("fc_1", "confirm", '{"question": "Delete it?"}'))
    [listed] = machine.feed(NativeCall("fc_2", "list", '{"path": "."}'))
    assert isinstance(asked, Call) and asked.runs_on == "client" and asked.id == "call_8"
    assert isinstance(listed, Call) and listed.runs_on == "gateway" and listed.id == "call_9"
    out = machine.feed(ResponseDone("completed", USAGE))
    wait = only(out, AwaitClient)
    run = only(out, RunTools)
    assert wait.ids == ("call_8",) and [c.name for c in run.calls] == ["list"]
    assert machine.awaits_client
    assert list(logged(machine.feed(ToolsDone((ToolResult("list", "success", ["a.txt"]),))))) == [
        "call_9"
    ]
    after = machine.feed(ToolResultMessage("call_8", "success", True))
    request = after[-1]
    assert isinstance(request, Request) and request.message is None
    assert [call_id for call_id, _ in request.outputs] == ["fc_1", "fc_2"]
    assert orjson.loads(request.outputs[0][1]) == {
        "tool": "confirm",
        "status": "success",
        "content": True,
    }


def test_a_provider_calling_hundreds_of_tools_in_one_response_runs_the_first_256() -> None:
    """As an ``<execute>`` block takes at most 256 calls; past them one error says the
    rest are dropped, and each dropped call costs no event."""
    machine = TurnMachine(client_tools=Router())
    machine.voice = True
    machine.feed(UserMessage(content="list everything"))
    out = [a for n in range(300) for a in machine.feed(NativeCall(f"fc_{n}", "list", "{}"))]
    assert sum(isinstance(a, Call) for a in out) == 256
    [dropped] = [a for a in out if isinstance(a, Error)]
    assert dropped.code == "malformed_execute" and "the rest are dropped" in dropped.content
    run = only(machine.feed(ResponseDone("completed", USAGE)), RunTools)
    assert len(run.calls) == 256
    answered = machine.feed(ToolsDone(tuple(ToolResult("list", "success", []) for _ in range(256))))
    request = answered[-1]
    assert isinstance(request, Request)
    assert [call_id for call_id, _ in request.outputs] == [f"fc_{n}" for n in range(256)]


def test_a_provider_call_with_an_endless_tool_name_is_refused_short() -> None:
    machine = TurnMachine(client_tools=Router())
    machine.voice = True
    machine.feed(UserMessage(content="hi"))
    refused, call = machine.feed(NativeCall("fc_1", "x" * 900_000, "{}"))
    assert isinstance(refused, Error) and "900,000 characters" in refused.content
    assert isinstance(call, Call) and len(call.content) < 200


def test_speech_while_the_client_works_cancels_the_wait() -> None:
    machine = TurnMachine(client_tools=Router())
    machine.voice = True
    machine.feed(UserMessage(content="delete it?"))
    machine.feed(NativeCall("fc_1", "confirm", '{"question": "Delete it?"}'))
    machine.feed(ResponseDone("completed", USAGE))
    assert machine.awaits_client
    out = machine.feed(SpeechBegan(120))
    assert any(isinstance(a, Cancelled) and a.reason == "barge_in" for a in out)
    assert machine.idle and not machine.awaits_client
    [refused] = machine.feed(ToolResultMessage("call_1", "success", True))
    assert isinstance(refused, Refuse) and "cancelled" in refused.error.content
