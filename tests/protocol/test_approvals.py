"""Calls that wait for a user's approval (issue 28), in the machine alone.

A tool that needs approval: its call is announced with a digest of exactly
that call, runs only after an ``approve`` with that digest and ``allow``, is
decided once, and is denied when nobody decides in time. Calls of the same
batch that need no approval run with it, once every decision is in.
"""

from __future__ import annotations

import orjson

from protocol.calls import ToolCall, ToolResult
from protocol.events import Approval, ApprovalRequired, Approve, Call, Result, Usage
from protocol.journal import JournalCall, approval_digest
from protocol.turn import TurnMachine, TurnState
from protocol.turn_events import (
    Action,
    ApprovalTimeout,
    AwaitApproval,
    Cancel,
    Persist,
    Refuse,
    Request,
    ResponseDone,
    Resume,
    RunTools,
    ToolsDone,
    UserMessage,
)
from tests.protocol.test_turn import kinds, only, stream

USAGE = Usage(input=10, output=5)
PAY = '{"name": "pay", "args": {"amount": 5}}'
LIST = '{"name": "list", "args": {"path": "."}}'
PAID = ToolResult(tool="pay", status="success", content="paid")
LISTED = ToolResult(tool="list", status="success", content=[])


def at_batch(*calls: str) -> tuple[TurnMachine, list[Action], list[Call]]:
    machine = TurnMachine(call_number=10)
    machine.batch.needs_approval = frozenset({"pay"})
    machine.feed(UserMessage(content="pay it"))
    out = list(stream(machine, f"<execute>[{', '.join(calls)}]</execute>"))
    out += machine.feed(ResponseDone("cancelled", USAGE))
    return machine, out, [a for a in out if isinstance(a, Call)]


def test_a_call_needing_approval_is_announced_with_its_digest_and_nothing_runs() -> None:
    machine, out, [call] = at_batch(PAY)
    asked = only(out, ApprovalRequired)
    assert (asked.id, asked.name, asked.args) == (call.id, "pay", {"amount": 5})
    assert asked.digest == approval_digest(call.id, "pay", {"amount": 5})
    assert only(out, AwaitApproval).ids == (call.id,)
    assert not [a for a in out if isinstance(a, RunTools)]
    names = kinds(out)
    assert names.index("Persist") < names.index("ApprovalRequired")  # the call is in history
    assert machine.awaits_approval and machine.state is TurnState.TOOLS


def test_allow_with_the_digest_runs_it_once() -> None:
    machine, out, [call] = at_batch(PAY)
    digest = only(out, ApprovalRequired).digest
    allowed = machine.feed(Approve(call.id, digest, "allow"))
    assert kinds(allowed) == ["Approval", "RunTools"]
    assert only(allowed, Approval).decision == "allow"
    assert only(allowed, RunTools).ids == (call.id,)
    # Used once: a second approve (even the same) is refused and runs nothing.
    again = only(machine.feed(Approve(call.id, digest, "allow")), Refuse)
    assert again.error.code == "unknown_call" and "already decided" in again.error.content
    done = machine.feed(ToolsDone((PAID,)))
    assert kinds(done) == ["Result", "Persist", "Request"]


def test_a_wrong_digest_is_refused_and_the_call_keeps_waiting() -> None:
    machine, out, [call] = at_batch(PAY)
    other = approval_digest(call.id, "pay", {"amount": 500})
    refused = only(machine.feed(Approve(call.id, other, "allow")), Refuse)
    assert refused.error.code == "wrong_digest" and call.id in refused.error.content
    assert machine.awaits_approval
    assert only(machine.feed(Approve("call_999", other, "allow")), Refuse).error.code == (
        "unknown_call"
    )
    digest = only(out, ApprovalRequired).digest
    assert only(machine.feed(Approve(call.id, digest, "allow")), RunTools)


def test_deny_tells_the_model_and_the_batch_goes_on_without_it() -> None:
    machine, out, [pay, listing] = at_batch(PAY, LIST)
    assert not [a for a in out if isinstance(a, RunTools)]  # the list call waits too
    denied = machine.feed(Approve(pay.id, only(out, ApprovalRequired).digest, "deny"))
    assert kinds(denied) == ["Approval", "Result", "RunTools"]
    [outcome] = orjson.loads(only(denied, Result).content)
    assert outcome["status"] == "failure" and "the user denied this call" in outcome["content"]
    assert only(denied, RunTools).ids == (listing.id,)
    done = machine.feed(ToolsDone((LISTED,)))
    history = only(done, Persist).items[-1]
    assert isinstance(history, Result)
    assert [r["tool"] for r in orjson.loads(history.content)] == ["pay", "list"]


def test_nobody_deciding_in_time_is_a_deny() -> None:
    machine, _out, [call] = at_batch(PAY)
    timed = machine.feed(ApprovalTimeout(120.0))
    approval = only(timed, Approval)
    assert (approval.id, approval.decision, approval.reason) == (call.id, "deny", "timeout")
    assert "within 120s" in orjson.loads(only(timed, Result).content)[0]["content"]
    assert isinstance(timed[-1], Request)
    assert machine.feed(ApprovalTimeout(120.0)) == ()


def test_cancel_while_waiting_settles_the_approval() -> None:
    machine, out, [call] = at_batch(PAY)
    assert kinds(machine.feed(Cancel())) == ["Persist", "Cancelled", "Metric"]
    late = only(machine.feed(Approve(call.id, only(out, ApprovalRequired).digest, "allow")), Refuse)
    assert "cancelled" in late.error.content


def test_a_takeover_waits_again_for_a_pending_approval_and_runs_an_allowed_call() -> None:
    machine = TurnMachine()
    pending = JournalCall(id="call_3", name="pay", args={"amount": 5}, approval="pending")
    out = machine.feed(Resume("again", (pending,)))
    assert only(out, AwaitApproval).ids == ("call_3",)
    assert not [a for a in out if isinstance(a, ApprovalRequired)]  # the log has it already
    digest = approval_digest("call_3", "pay", {"amount": 5})
    assert only(machine.feed(Approve("call_3", digest, "allow")), RunTools).calls == (
        ToolCall("pay", {"amount": 5}),
    )
    allowed = JournalCall(id="call_4", name="pay", args={}, approval="allowed")
    other = TurnMachine()
    assert only(other.feed(Resume("again", (allowed,))), RunTools).ids == ("call_4",)
