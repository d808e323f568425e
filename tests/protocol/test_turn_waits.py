"""What the machine tells its shell to wait for, and until when; time and setups as inputs."""

from __future__ import annotations

from protocol.turn import TurnMachine, TurnState
from protocol.turn_events import (
    Await,
    Cancel,
    Opened,
    Reconfigured,
    Request,
    ResponseDone,
    Source,
    Tick,
    UserMessage,
)
from protocol.turn_timers import CANCEL_REPORT_WAIT
from tests.protocol.test_turn import stream
from tests.protocol.test_turn_client_tools import ASK, Router, at_tools, block, results


def test_the_wait_follows_the_turn() -> None:
    machine = TurnMachine()
    assert machine.wait(10.0, listening=False) == Await(Source.NOTHING)  # the driver stops
    assert machine.wait(10.0, listening=True) == Await(Source.LISTEN)  # voice between turns
    machine.feed(UserMessage(content="hi"))
    assert machine.wait(10.0, listening=False) == Await(Source.RESPONSE)
    machine.feed(Cancel())
    assert machine.state is TurnState.CANCELLING
    # The stopped response's end comes within a round trip, or the connection is gone.
    assert machine.wait(10.0, listening=True) == Await(Source.UPSTREAM, 10.0 + CANCEL_REPORT_WAIT)


def test_a_client_call_times_out_at_the_deadline_the_machine_set() -> None:
    machine, _calls, _out = at_tools(ASK)
    machine.timers.client_timeout = 60.0
    assert machine.awaits_client
    machine.feed(Tick(100.0))  # as the shell performs AwaitClient: the timer starts
    assert machine.wait(130.0, listening=False) == Await(Source.COMMAND, 160.0)
    assert machine.wait(130.0, listening=True) == Await(Source.LISTEN, 160.0)
    assert machine.feed(Tick(159.9)) == []  # not yet
    out = machine.feed(Tick(160.0))
    assert results(out)[0]["status"] == "failure"  # the unanswered call failed: the turn goes on
    assert not machine.awaits_client and machine.state is TurnState.STREAMING


def test_a_reconfigured_session_asks_on_a_connection_opened_for_the_new_setup() -> None:
    machine = TurnMachine(client_tools=Router())
    machine.feed(Opened(machine.setup))
    first = machine.feed(UserMessage(content="hi"))[-1]
    assert isinstance(first, Request) and not first.fresh
    stream(machine, "<end>")
    machine.feed(ResponseDone("completed"))
    opened_for = machine.setup
    machine.feed(Reconfigured())  # configure: the open connection has the old prompt
    second = machine.feed(UserMessage(content="again"))[-1]
    assert isinstance(second, Request) and second.fresh
    stream(machine, block(ASK))
    machine.feed(ResponseDone("completed"))
    machine.feed(Opened(opened_for))  # an open that began before the change is still old
    assert machine.state is TurnState.TOOLS
    machine.feed(Opened(machine.setup))  # the shell reopened for the new setup
    machine.feed(Tick(0.0))
    nxt = machine.feed(Tick(1e9))[-1]  # the call times out; the next step asks as is
    assert isinstance(nxt, Request) and not nxt.fresh
