"""The turn state machine on its own: inputs in, actions out; no sockets, no event loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import msgspec
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.assembly import Message, results_message
from protocol.calls import ToolCall, ToolResult, result_payload
from protocol.events import (
    Call,
    Cancelled,
    Context,
    ContextMessage,
    End,
    Error,
    Event,
    Execute,
    Interrupt,
    Metric,
    Replying,
    ReplyNow,
    Respond,
    Result,
    Think,
    Usage,
    User,
)
from protocol.turn import (
    TurnMachine,
    TurnState,
    turn_in_flight,
)
from protocol.turn_events import (
    GUARDRAIL_CANCEL,
    Account,
    Action,
    AddMessage,
    Backoff,
    CallDone,
    Cancel,
    DropUpstream,
    Persist,
    Refuse,
    ReplaceResponse,
    Request,
    Rerun,
    ResponseDone,
    RetryNow,
    RunTools,
    ShellFailed,
    Shutdown,
    StopResponse,
    TextDelta,
    ToolsDone,
    TurnInput,
    TurnStarted,
    UpstreamFailed,
    UpstreamLost,
    UpstreamStalled,
    UserMessage,
)

CALL = '<think>I list.</think><execute>[{"name": "list", "args": {"path": "."}}]</execute>'
MALFORMED = "<execute>[{bad</execute>"
OK = (ToolResult(tool="list", status="success", content=[]),)
OK_PAYLOAD = result_payload(OK)
USAGE = Usage(input=10, output=5)
ZERO = Usage(input=0, output=0)

_SYNC = (Persist, Account, TurnStarted, DropUpstream, Refuse)
_AWAITED = (Request, StopResponse, ReplaceResponse, RunTools, Backoff)


def kinds(actions: Sequence[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def events(actions: Sequence[Action]) -> list[Event]:
    return [a for a in actions if not isinstance(a, _SYNC + _AWAITED)]  # type: ignore[misc]


T = TypeVar("T")


def only(actions: Sequence[Action], kind: type[T]) -> T:
    [found] = [a for a in actions if isinstance(a, kind)]
    return found


def stream(machine: TurnMachine, text: str, size: int = 3) -> list[Action]:
    out: list[Action] = []
    for i in range(0, len(text), size):
        out += machine.text(text[i : i + size])
    return out


def started(**settings: int) -> TurnMachine:
    machine = TurnMachine(**settings)  # type: ignore[arg-type]
    machine.feed(UserMessage(content="hi"))
    return machine


# --- a turn, step by step ---------------------------------------------------------


def test_a_user_message_starts_a_turn_and_asks_the_model() -> None:
    machine = TurnMachine()
    actions = machine.feed(UserMessage(content="hi"))
    assert kinds(actions) == ["TurnStarted", "User", "Persist", "Request"]
    assert only(actions, Persist).items == (User(content="hi"),)
    assert only(actions, Request).message == Message(role="user", content="hi")
    assert machine.state is TurnState.STREAMING


def test_an_answer_with_end_closes_with_end_then_its_metric() -> None:
    machine = started()
    out = stream(machine, "<think>Hm.</think>Hello there.<end> overrun")
    assert [type(e) for e in out][-1] is End
    assert "overrun" not in "".join(getattr(e, "content", "") for e in out)
    # The answer goes into history just before its end (the same log round): a node
    # that dies before the response's usage comes leaves a whole turn, not one to rerun.
    assert kinds(out)[-2:] == ["Persist", "End"]
    assert only(out, Persist).items == (Think(content="Hm."), Respond(content="Hello there."))
    assert machine.state is TurnState.ENDING
    done = machine.feed(ResponseDone("completed", USAGE))
    assert kinds(done) == ["Account", "Metric"]
    assert only(done, Metric) == Metric(step=USAGE, total=USAGE)
    assert machine.idle and machine.meter.total == USAGE


def test_a_message_sent_while_the_turn_closes_starts_next_naming_its_command() -> None:
    machine = started()
    stream(machine, "Done.<end>")
    assert not machine.feed(UserMessage(content="next", id="m-2", item="i-2"))  # held
    done = machine.feed(ResponseDone("completed", USAGE))
    user = only(done, User)
    # Logged with its command's id and the name its client gave it (an OpenAI item id).
    assert (user.content, user.reply_to, user.item) == ("next", "m-2", "i-2")
    kept = [a for a in done if isinstance(a, Persist)][-1]
    assert kept.items == (User(content="next"),)  # history keeps no id
    assert machine.state is TurnState.STREAMING


def test_an_answer_without_end_still_ends_before_its_metric() -> None:
    machine = started()
    stream(machine, "Just text")
    done = machine.feed(ResponseDone("completed", USAGE))
    assert kinds(done) == ["Persist", "End", "Account", "Metric"]
    assert machine.idle


def test_a_tool_step_stops_the_model_runs_the_batch_and_continues() -> None:
    machine = started()
    out = stream(machine, CALL + "hallucinated overrun")
    assert kinds(out)[-3:] == ["Call", "Execute", "StopResponse"]
    assert machine.state is TurnState.STOPPING
    assert machine.text("more") == ()
    done = machine.feed(ResponseDone("cancelled", USAGE))
    # The step goes into history (its call with its id) before the call runs.
    assert kinds(done) == ["Account", "Metric", "Persist", "ReplaceResponse", "RunTools"]
    assert only(done, Persist).items == (
        Think(content="I list."),
        Call(content='{"name":"list","args":{"path":"."}}', id="call_1"),
    )
    assert only(done, ReplaceResponse).text == CALL
    run = only(done, RunTools)
    assert run.calls == (ToolCall(name="list", args={"path": "."}),)
    assert run.ids == ("call_1",)
    assert machine.state is TurnState.TOOLS
    # The call's outcome is logged as soon as it finished (the journal)…
    [logged] = machine.feed(CallDone("call_1", OK[0]))
    assert isinstance(logged, Result)
    assert logged.id == "call_1"
    assert orjson.loads(logged.content) == [msgspec.to_builtins(OK[0])]
    assert machine.feed(CallDone("call_1", OK[0])) == ()  # once
    # …and the batch's end hands all results to history and the model.
    results = machine.feed(ToolsDone(OK))
    assert kinds(results) == ["Persist", "Request"]
    [result] = only(results, Persist).items
    assert isinstance(result, Result)
    assert result.content == logged.content
    assert only(results, Request).message == results_message(result.content)
    stream(machine, "Done.<end>")
    last = machine.feed(ResponseDone("completed", USAGE))
    assert only(last, Metric) == Metric(step=USAGE, total=Usage(input=20, output=10))
    assert machine.idle


def test_a_malformed_block_is_handed_back_and_three_in_a_row_stop_the_turn() -> None:
    machine = started()
    for round_ in (1, 2):
        out = stream(machine, MALFORMED)
        assert [e.code for e in events(out) if isinstance(e, Error)] == ["malformed_execute"]
        done = machine.feed(ResponseDone("cancelled", USAGE))
        assert kinds(done) == [
            "Account",
            "Metric",
            "Result",
            "Persist",
            "ReplaceResponse",
            "Request",
        ], round_
        assert '"status":"failure"' in only(done, Result).content
    stream(machine, MALFORMED)
    assert machine.feed(ContextMessage(role="system", content="Be careful.")) == ()  # waits
    done = machine.feed(ResponseDone("cancelled", USAGE))
    # The provider's copy of the answer is set right before the waiting message goes in.
    assert kinds(done) == [
        "Persist",
        "Error",
        "End",
        "Account",
        "Metric",
        "ReplaceResponse",
        "Context",
        "Persist",
        "AddMessage",
    ]
    assert "three malformed" in only(done, Error).content
    assert machine.idle


def test_a_good_batch_resets_the_malformed_count() -> None:
    machine = started()
    for text in (MALFORMED, MALFORMED, CALL):
        stream(machine, text)
        if machine.feed(ResponseDone("cancelled", USAGE)) and machine.state is TurnState.TOOLS:
            machine.feed(ToolsDone(OK))
    for _ in range(2):
        stream(machine, MALFORMED)
        machine.feed(ResponseDone("cancelled", USAGE))
    assert machine.state is TurnState.STREAMING  # two in a row again: not yet stopped


def test_the_step_limit_stops_the_turn_after_its_last_results() -> None:
    machine = started(max_steps=2)
    stream(machine, CALL)
    machine.feed(ResponseDone("cancelled", USAGE))
    assert kinds(machine.feed(ToolsDone(OK)))[-1] == "Request"
    stream(machine, CALL)
    machine.feed(ResponseDone("cancelled", USAGE))
    results = machine.feed(ToolsDone(OK))
    assert kinds(results) == ["Result", "Persist", "Error", "End", "Metric"]
    assert "limit of 2 model steps" in only(results, Error).content
    # Both steps were reported after their execute: nothing is left to report.
    assert only(results, Metric).step == ZERO
    assert machine.idle


# --- the upstream failing -----------------------------------------------------------


def test_upstream_loss_before_any_output_retries_without_interrupt() -> None:
    machine = started()
    lost = machine.feed(UpstreamLost("dropped"))
    assert kinds(lost) == ["DropUpstream", "Backoff"]
    assert only(lost, Backoff) == Backoff(attempt=1, delay=0.2)
    assert machine.state is TurnState.BACKOFF
    assert machine.feed(RetryNow()) == [Request()]  # reopen from history
    stream(machine, "Hi<end>")
    done = machine.feed(ResponseDone("completed", USAGE))
    assert only(done, Metric).estimated is not True


def test_upstream_loss_after_partial_output_interrupts_reruns_and_counts_it() -> None:
    machine = started()
    stream(machine, "<think>partial reasoning</think>Hel")
    lost = machine.feed(UpstreamLost("dropped"))
    assert kinds(lost) == ["DropUpstream", "Interrupt", "Backoff"]
    assert "rerun" in only(lost, Interrupt).content
    machine.feed(RetryNow())
    answer = stream(machine, "Hello<end>")
    done = machine.feed(ResponseDone("completed", USAGE))
    # The partial step is not history; its billed output is counted, estimated.
    assert only(answer, Persist).items == (Respond(content="Hello"),)
    metric = only(done, Metric)
    assert metric.step.output > USAGE.output and metric.estimated is True


def test_upstream_loss_beyond_the_retries_fails_the_turn_with_error_end_metric() -> None:
    machine = started(upstream_retries=1)
    machine.feed(UpstreamLost("dropped"))
    machine.feed(RetryNow())
    failed = machine.feed(UpstreamLost("refused"))
    assert kinds(failed) == ["DropUpstream", "Error", "Persist", "End", "Metric"]
    assert only(failed, Error).code == "upstream" and "refused" in only(failed, Error).content
    assert machine.idle


def test_upstream_loss_after_execute_runs_the_calls_anyway() -> None:
    machine = started()
    stream(machine, CALL)
    lost = machine.feed(UpstreamLost("dropped"))
    assert kinds(lost) == [
        "DropUpstream",
        "Account",
        "Metric",
        "Persist",
        "ReplaceResponse",
        "RunTools",
    ]
    assert only(lost, Metric).estimated is True
    assert machine.state is TurnState.TOOLS


def test_upstream_loss_after_end_closes_the_turn_without_a_rerun() -> None:
    machine = started()
    answer = stream(machine, "Done.<end>")
    lost = machine.feed(UpstreamLost("dropped"))
    assert kinds(lost) == ["DropUpstream", "Account", "Metric"]
    assert only(answer, Persist).items == (Respond(content="Done."),)  # kept with its end
    assert machine.idle


def test_an_upstream_error_fails_the_turn() -> None:
    machine = started()
    stream(machine, "Hel")
    failed = machine.feed(UpstreamFailed("server_error", "boom"))
    assert kinds(failed) == ["DropUpstream", "Error", "Persist", "End", "Account", "Metric"]
    assert only(failed, DropUpstream).stop
    assert "server_error: boom" in only(failed, Error).content


def test_a_failed_response_fails_the_turn() -> None:
    machine = started()
    stream(machine, "Hel")
    failed = machine.feed(ResponseDone("failed", USAGE, detail="rate limited"))
    assert kinds(failed) == ["DropUpstream", "Error", "Persist", "End", "Account", "Metric"]
    assert "failed: rate limited" in only(failed, Error).content
    assert only(failed, Metric).step == USAGE


# --- cancel, in every state -----------------------------------------------------------


def test_cancel_while_streaming_stops_the_model_and_reports_its_usage() -> None:
    machine = started()
    stream(machine, "Hello, wor")
    cancel = machine.feed(Cancel())
    assert kinds(cancel) == ["Persist", "Cancelled", "StopResponse"]
    assert only(cancel, Persist).items == (
        Respond(content="Hello, wor"),
        Cancelled(content="cancelled by the user"),
    )
    assert machine.state is TurnState.CANCELLING
    assert machine.text("ld") == ()
    done = machine.feed(ResponseDone("cancelled", USAGE))
    assert kinds(done) == ["DropUpstream", "Account", "Metric"]
    assert only(done, Metric).step == USAGE
    assert machine.idle


def test_an_end_turn_rules_cancel_says_a_guardrail_stopped_it_not_the_user() -> None:
    machine = started()
    stream(machine, "Hello, wor")
    cancel = machine.feed(Cancel(id=GUARDRAIL_CANCEL))
    assert only(cancel, Cancelled).content == "stopped by a guardrail"
    assert machine.state is TurnState.CANCELLING


def test_cancel_while_stopping_waits_for_the_usage_too() -> None:
    machine = started()
    stream(machine, CALL)
    cancel = machine.feed(Cancel())
    assert kinds(cancel) == ["Persist", "Cancelled", "StopResponse"]
    done = machine.feed(ResponseDone("cancelled", None))
    # No usage reported: estimated from what the model wrote.
    assert only(done, Metric).estimated is True and only(done, Metric).step.output > 0


def test_cancel_while_tools_run_closes_at_once() -> None:
    machine = started()
    stream(machine, CALL)
    machine.feed(ResponseDone("cancelled", USAGE))
    cancel = machine.feed(Cancel())
    assert kinds(cancel) == ["Persist", "Cancelled", "Metric"]
    assert only(cancel, Metric).step == ZERO  # the step was reported after execute
    assert machine.idle
    assert machine.feed(ToolsDone(OK)) == ()  # the interrupted batch's late results


def test_cancel_during_a_backoff_closes_with_the_lost_attempts_usage() -> None:
    machine = started()
    stream(machine, "Hello")
    machine.feed(UpstreamLost("dropped"))
    cancel = machine.feed(Cancel())
    assert kinds(cancel) == ["Persist", "Cancelled", "Account", "Metric"]
    assert only(cancel, Metric).estimated is True
    assert machine.feed(RetryNow()) == ()


def test_cancel_when_nothing_can_be_cancelled_is_refused() -> None:
    idle = TurnMachine()
    ending = started()
    stream(ending, "Done.<end>")
    cancelling = started()
    cancelling.feed(Cancel())
    for machine in (idle, ending, cancelling):
        [refusal] = machine.feed(Cancel())
        assert isinstance(refusal, Refuse) and refusal.error.code == "no_turn"


def test_a_cancelled_response_that_never_reports_closes_on_loss() -> None:
    machine = started()
    stream(machine, "Hello")
    machine.feed(Cancel())
    closed = machine.feed(UpstreamLost("no end within 5s"))
    assert kinds(closed) == ["DropUpstream", "Account", "Metric"]
    assert machine.idle


# --- commands while a turn runs --------------------------------------------------------


def test_a_message_during_a_turn_is_refused() -> None:
    machine = started()
    [refusal] = machine.feed(UserMessage(content="again"))
    assert isinstance(refusal, Refuse) and refusal.error.code == "turn_active"


def test_a_message_sent_on_end_or_cancelled_queues_behind_the_metric() -> None:
    for closing in ("Done.<end>", None):
        machine = started()
        if closing is None:
            machine.feed(Cancel())
        else:
            stream(machine, closing)
        assert machine.feed(UserMessage(content="next")) == ()
        [refusal] = machine.feed(UserMessage(content="and another"))
        assert isinstance(refusal, Refuse)
        done = machine.feed(ResponseDone("completed", USAGE))
        names = kinds(done)
        assert names.index("Metric") < names.index("TurnStarted") < names.index("User")
        assert only(done, User).content == "next"
        assert machine.state is TurnState.STREAMING


def test_rerun_after_takeover_interrupts_and_asks_again() -> None:
    machine = TurnMachine()
    actions = machine.feed(Rerun("the node stopped"))
    assert kinds(actions) == ["TurnStarted", "Interrupt", "Request"]
    assert only(actions, Request).message is None  # history already ends with the prompt
    assert machine.feed(Rerun("again")) == ()
    assert turn_in_flight([User(content="x")])
    assert turn_in_flight([User(content="x"), Result(content="[]", payload=OK_PAYLOAD)])
    assert not turn_in_flight([User(content="x"), Respond(content="y")])
    assert not turn_in_flight([])


def test_inputs_that_make_no_sense_are_ignored() -> None:
    machine = TurnMachine()
    assert machine.text("stray") == ()
    for stray in (
        ResponseDone("completed", USAGE),
        ToolsDone(OK),
        RetryNow(),
        UpstreamLost("x"),
        UpstreamStalled(1.0),
        UpstreamFailed("x", "y"),
        ShellFailed("x"),
        Shutdown(),
    ):
        assert not machine.feed(stray), stray
    assert machine.idle and machine.meter.total == ZERO


def test_a_shell_failure_ends_the_turn_with_internal_error() -> None:
    machine = started()
    failed = machine.feed(ShellFailed("KeyError"))
    assert kinds(failed) == ["DropUpstream", "Error", "Persist", "End", "Metric"]
    assert only(failed, Error).code == "internal"


def test_shutdown_forgets_the_turn_and_writes_nothing() -> None:
    machine = started()
    machine.feed(UserMessage(content="queued?"))
    assert machine.feed(Shutdown()) == [DropUpstream(stop=True)]
    assert machine.idle


# --- any order of inputs --------------------------------------------------------------

_INPUTS: list[TurnInput] = [
    UserMessage(content="u"),
    Rerun("r"),
    TextDelta("Hi "),
    TextDelta("<think>t</think>"),
    TextDelta('<execute>[{"name": "list", "args": {}}]</execute>'),
    TextDelta(MALFORMED),
    TextDelta("<end>"),
    TextDelta("<"),
    TextDelta("<exec"),
    ResponseDone("completed", USAGE),
    ResponseDone("cancelled", None),
    ResponseDone("failed", Usage(input=1, output=0)),
    ResponseDone("completed", USAGE, estimated=True),
    UpstreamFailed("e", "m"),
    UpstreamLost("l"),
    UpstreamStalled(30.0),
    ToolsDone(OK),
    RetryNow(),
    Cancel(),
    ShellFailed("x"),
    Shutdown(),
]


_DELTAS = [i for i in _INPUTS if isinstance(i, TextDelta)]
_ENDS = [
    i
    for i in _INPUTS
    if isinstance(i, ResponseDone | UpstreamLost | UpstreamFailed | UpstreamStalled)
]
# Inputs the shell would really feed in each state (the rest are strays).
_LIKELY: dict[TurnState, list[TurnInput]] = {
    TurnState.IDLE: [UserMessage(content="u"), Rerun("r")],
    TurnState.STREAMING: [*_DELTAS, *_DELTAS, *_ENDS, Cancel()],
    TurnState.STOPPING: [*_ENDS, Cancel(), TextDelta("x")],
    TurnState.ENDING: [*_ENDS, UserMessage(content="u"), Cancel()],
    TurnState.CANCELLING: [*_ENDS, UserMessage(content="u"), TextDelta("x")],
    TurnState.TOOLS: [ToolsDone(OK), ToolsDone(OK), Cancel(), ShellFailed("x")],
    TurnState.BACKOFF: [RetryNow(), RetryNow(), Cancel()],
}


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(1, 4), st.integers(0, 3))
def test_any_order_of_inputs_keeps_the_end_of_turn_rule(
    data: st.DataObject, max_steps: int, retries: int
) -> None:
    """Mostly likely inputs for the state, sometimes any input: the rules always hold."""
    machine = TurnMachine(max_steps=max_steps, upstream_retries=retries)
    open_turn = False  # a turn started and has not had its closing metric
    closing = False  # its closing event was emitted; the next event must be the metric
    accounted = ZERO
    for _ in range(data.draw(st.integers(0, 80))):
        likely = data.draw(st.integers(0, 9)) > 0
        given_input = data.draw(st.sampled_from(_LIKELY[machine.state] if likely else _INPUTS))
        actions = machine.feed(given_input)
        assert isinstance(machine.state, TurnState)
        awaited = False
        for action in actions:
            # Events and history first, awaits last (a cancel may drop the awaits).
            if isinstance(action, _AWAITED):
                awaited = True
            elif isinstance(action, TurnStarted):
                assert not open_turn, "a turn started before the previous one closed"
                open_turn, closing, awaited = True, False, False
            else:
                assert not awaited or isinstance(action, Refuse), kinds(actions)
            if isinstance(action, Account):
                accounted = accounted + action.usage
            if isinstance(action, _SYNC + _AWAITED):
                continue
            event: Event = action  # type: ignore[assignment]
            if closing:
                assert isinstance(event, Metric), f"{type(event).__name__} after the closing event"
                assert event.total == accounted == machine.meter.total
                open_turn = closing = False
                continue
            assert open_turn, f"{type(event).__name__} outside a turn"
            if isinstance(event, End | Cancelled):
                closing = True
            assert not isinstance(event, Metric) or event.total == accounted
            assert type(event) in (
                User,
                Think,
                Respond,
                Call,
                Execute,
                End,
                Metric,
                Error,
                Interrupt,
                Cancelled,
                Result,
            )
        if isinstance(given_input, Shutdown):
            open_turn = closing = False  # the session stops: nothing more is written
        assert machine.idle == (not open_turn), (machine.state, open_turn)


def test_a_reply_starts_a_turn_with_no_new_message_and_waits_like_one() -> None:
    """``reply``: the model answers the conversation as it is (a greeting): the turn
    logs ``reply`` (naming the command) and asks the model with no message; while a
    turn runs it is refused, and while one closes it waits for it, as a message does."""
    machine = TurnMachine()
    actions = machine.feed(ReplyNow(id="r-1"))
    assert kinds(actions) == ["TurnStarted", "Replying", "Request"]
    assert only(actions, Replying).reply_to == "r-1"
    assert only(actions, Request).message is None
    assert not [a for a in actions if isinstance(a, Persist)]  # history gains nothing
    assert only(machine.feed(ReplyNow(id="r-2")), Refuse).error.code == "turn_active"
    stream(machine, "Hello there.<end>")
    assert not machine.feed(ReplyNow(id="r-3"))  # held: the turn ends
    done = machine.feed(ResponseDone("completed", USAGE))
    assert only(done, Replying).reply_to == "r-3"
    assert machine.state is TurnState.STREAMING


def test_context_is_added_between_turns_and_while_tools_run_and_waits_for_an_answer() -> None:
    """``context``: logged (naming its command and item), kept in history where it was
    added, and told to the open connection, with no turn; while the model writes its
    answer it waits, and goes in once the answer is written, before a turn queued
    meanwhile."""
    machine = TurnMachine()
    added = machine.feed(ContextMessage(role="system", content="Be brief.", id="c-1", item="s1"))
    assert kinds(added) == ["Context", "Persist", "AddMessage"]
    logged = only(added, Context)
    assert (logged.role, logged.content, logged.reply_to, logged.item) == (
        "system",
        "Be brief.",
        "c-1",
        "s1",
    )
    assert only(added, Persist).items == (Context(role="system", content="Be brief."),)
    assert only(added, AddMessage).message.role == "system"
    assert machine.state is TurnState.IDLE  # no turn
    machine.feed(UserMessage(content="hi"))
    assert machine.feed(ContextMessage(role="user", content="mid", id="c-2")) == ()
    stream(machine, CALL)
    done = machine.feed(ResponseDone("cancelled", USAGE))
    assert machine.state is TurnState.TOOLS
    # The step went into history first, and the message waited for it; both come
    # before the tools run (what the turn waits on).
    assert kinds(done)[-4:] == ["Context", "Persist", "AddMessage", "RunTools"]
    assert kinds(done).index("Persist") < kinds(done).index("Context")
    assert kinds(done).index("ReplaceResponse") < kinds(done).index("AddMessage")
    assert only(done, Context).reply_to == "c-2"
    during = machine.feed(ContextMessage(role="assistant", content="Checking."))
    assert kinds(during) == ["Context", "Persist", "AddMessage"]
    # An assistant line is told as an answer of its own is written.
    assert only(during, AddMessage).message.content == "Checking.\n<end>"
    assert machine.state is TurnState.TOOLS


def test_context_sent_while_a_turn_closes_goes_in_before_the_queued_turn() -> None:
    machine = TurnMachine()
    machine.feed(UserMessage(content="hi"))
    stream(machine, "Hello.<end>")
    # The answer is in history (its end was sent): the message is logged and kept at once,
    # so a node that dies before the response's usage keeps it; the provider is told after.
    added = machine.feed(ContextMessage(role="system", content="Now French."))
    assert kinds(added) == ["Context", "Persist"]
    assert machine.feed(UserMessage(content="again")) == ()  # queued behind the closing turn
    out = machine.feed(ResponseDone("completed", USAGE))
    assert kinds(out).index("AddMessage") < kinds(out).index("User")
    assert only(out, AddMessage).message.content == "Now French."
    assert "Context" not in kinds(out)  # logged once
    assert machine.state is TurnState.STREAMING


def test_context_sent_while_the_model_writes_waits_for_the_answer() -> None:
    machine = TurnMachine()
    machine.feed(UserMessage(content="hi"))
    stream(machine, "Hel")
    assert machine.feed(ContextMessage(role="system", content="Now French.")) == ()
    out = stream(machine, "lo.<end>") + list(machine.feed(ResponseDone("completed", USAGE)))
    # History keeps the answer, then the message (where the client added it).
    persisted = [item for a in out if isinstance(a, Persist) for item in a.items]
    assert persisted == [Respond(content="Hello."), Context(role="system", content="Now French.")]


def test_context_between_turns_is_bounded_until_a_turn_begins() -> None:
    """Context adds to what every later turn is given: a client may not grow it without
    bound between turns (each turn, which is counted against the key, gives room again)."""
    from protocol.turn import CONTEXTS_PER_TURN

    machine = TurnMachine()
    for _ in range(CONTEXTS_PER_TURN):
        assert kinds(machine.feed(ContextMessage(role="user", content="x")))[0] == "Context"
    refused = only(machine.feed(ContextMessage(role="user", content="x", id="c")), Refuse)
    assert refused.error.code == "rate_limited" and "start a turn" in refused.error.content
    machine.feed(UserMessage(content="hi"))
    stream(machine, "Hello.<end>")
    machine.feed(ResponseDone("completed", USAGE))
    assert kinds(machine.feed(ContextMessage(role="user", content="x")))[0] == "Context"
