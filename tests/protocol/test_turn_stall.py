"""A provider gone silent mid-response (``UpstreamStalled``): the machine's decisions alone."""

from __future__ import annotations

from protocol.events import End, Error, Interrupt, Metric
from protocol.turn import TurnMachine
from protocol.turn_events import (
    Backoff,
    DropUpstream,
    Request,
    ResponseDone,
    RetryNow,
    RunTools,
    ToolsDone,
    UpstreamStalled,
)
from tests.protocol.test_turn import CALL, OK, USAGE, kinds, only, started, stream

SILENT = UpstreamStalled(30.0)


def test_the_first_silence_reruns_the_step_on_a_new_connection() -> None:
    machine = started()
    stalled = machine.feed(SILENT)
    assert kinds(stalled) == ["DropUpstream", "Interrupt", "Backoff"]
    assert only(stalled, DropUpstream).stop is True
    assert "sent nothing for 30s" in only(stalled, Interrupt).content
    assert "discard" not in only(stalled, Interrupt).content  # nothing was shown yet
    assert only(stalled, Backoff).delay == 0.0
    [retry] = machine.feed(RetryNow())
    assert isinstance(retry, Request)
    # The rerun answers: the turn ends as usual, with no error.
    stream(machine, "Hi.<end>")
    done = machine.feed(ResponseDone("completed", USAGE))
    assert not any(isinstance(a, Error) for a in done) and machine.idle


def test_a_second_silence_in_the_step_ends_the_turn_with_upstream_timeout() -> None:
    machine = started()
    stream(machine, "Partly")
    first = machine.feed(SILENT)
    assert "discard its partial output" in only(first, Interrupt).content
    machine.feed(RetryNow())
    second = machine.feed(SILENT)
    error = only(second, Error)
    assert error.code == "upstream_timeout" and "send your message again" in error.content
    assert kinds(second)[0] == "DropUpstream"
    assert isinstance(second[-1], Metric) and any(isinstance(a, End) for a in second)
    assert machine.idle


def test_each_step_gets_its_own_retry() -> None:
    machine = started()
    machine.feed(SILENT)
    machine.feed(RetryNow())
    stream(machine, CALL)
    machine.feed(ResponseDone("completed", USAGE))
    machine.feed(ToolsDone(OK))  # the next step asks the model with the results
    assert machine.state.value == "streaming"
    # The previous step's retry is spent; this step has its own.
    assert kinds(machine.feed(SILENT))[-1] == "Backoff"


def test_silence_after_the_calls_were_complete_runs_them() -> None:
    machine = started()
    stream(machine, CALL)  # stopping: waiting for the response's end
    out = machine.feed(SILENT)
    assert any(isinstance(a, RunTools) for a in out)
    assert not any(isinstance(a, Error) for a in out)


def test_silence_while_waiting_for_the_usage_closes_the_turn_with_an_estimate() -> None:
    machine = started()
    stream(machine, "Done.<end>")
    out = machine.feed(SILENT)
    assert only(out, Metric).estimated is True and machine.idle
    assert not any(isinstance(a, Error) for a in out)


def test_a_machine_with_no_retries_still_reruns_a_silent_step_once() -> None:
    machine = started(upstream_retries=0)
    assert kinds(machine.feed(SILENT))[-1] == "Backoff"
    assert isinstance(machine, TurnMachine)
