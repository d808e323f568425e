"""The caller's keys decide calls waiting for approval: 1 allows, 2 denies, oldest first."""

from __future__ import annotations

import msgspec

from gateway.phone.keypad import KeypadApprovals
from protocol.events import Approval, ApprovalRequired, Approve

encode = msgspec.json.Encoder().encode


def asked(call_id: str) -> bytes:
    return encode(ApprovalRequired(id=call_id, name="end_call", args={}, digest=f"d-{call_id}"))


def test_1_allows_and_2_denies_the_oldest_call_waiting() -> None:
    keypad = KeypadApprovals()
    keypad.asked(asked("a"))
    keypad.asked(asked("b"))
    assert keypad.press("1") == Approve(id="a", digest="d-a", decision="allow")
    assert keypad.press("2") == Approve(id="b", digest="d-b", decision="deny")
    assert keypad.press("1") is None  # nothing waits: an ordinary key press


def test_other_keys_decide_nothing_and_a_call_decided_elsewhere_waits_no_more() -> None:
    keypad = KeypadApprovals()
    keypad.asked(asked("a"))
    assert keypad.press("5") is None and keypad.press("#") is None
    keypad.decided(encode(Approval(id="a", digest="d-a", decision="allow")))
    assert keypad.waiting == 0
    assert keypad.press("1") is None
