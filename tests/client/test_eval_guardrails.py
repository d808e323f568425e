"""``gateway eval`` asserts guardrails (issue 41): a message an input rule blocks is a
turn that ends ``blocked``; ``guardrail = NAME`` holds when that rule tripped on the
turn (its message or its answer), ``no_guardrail`` when none did."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gateway.client.evals import Expect, check
from gateway.client.transcript import turns_of
from protocol.events import Event, decode_event
from tests.support.guardrail_rules import PASSWORDS_AND_CARDS
from tests.support.recorded import gateway_cli, serve

RULES = PASSWORDS_AND_CARDS

SCENARIOS = """
[[scenario]]
name = "guarded"

[[scenario.turn]]
user = "my password is hunter2"
expect = { ends = "blocked", guardrail = "no-passwords" }

[[scenario.turn]]
user = "/raw Your card is 4242 4242 4242 4242, thanks!<end>"
expect = { guardrail = "no-cards", contains = "is [redacted], thanks", ends = "end" }

[[scenario.turn]]
user = "hello"
expect = { no_guardrail = true, contains = "Echo: hello" }

[[scenario.turn]]
user = "hello again"
expect = { guardrail = "no-cards" }
"""


@pytest.mark.timeout(60)
async def test_eval_asserts_a_blocked_message_and_a_redacted_answer(tmp_path: Path) -> None:
    rules = tmp_path / "guardrails.toml"
    rules.write_text(RULES)
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(SCENARIOS)
    with serve(tmp_path, "--guardrails", str(rules)) as node:
        code, out, err = await gateway_cli("eval", str(scenarios), "--url", node.url)
    assert code == 1, out + err  # the last turn's expectation fails, and says why
    assert "3 of 4 turns passed" in out, out
    assert "FAIL guarded turn 4: expected the guardrail 'no-cards' to trip; tripped: none" in out


def events(*fields: dict[str, object]) -> list[tuple[float, Event]]:
    return [
        (0.0, decode_event(msgspec.json.encode({**f, "seq": seq})))
        for seq, f in enumerate(fields, start=1)
    ]


def test_guardrails_are_part_of_the_turn_they_judged() -> None:
    usage = {"input": 1, "output": 1}
    metric = {"type": "metric", "step": usage, "total": usage, "cost": {"step": 0.0}}
    blocked, redacted = turns_of(
        events(
            {"type": "guardrail", "rule": "pw", "action": "block", "on": "input"},
            {"type": "guardrail", "rule": "mail", "action": "redact", "on": "input"},
            {"type": "user", "content": "write to [redacted]"},
            {"type": "respond", "content": "ok"},
            {"type": "guardrail", "rule": "cards", "action": "redact", "on": "output"},
            {"type": "end"},
            metric,
        )
    )
    assert (blocked.outcome, blocked.guardrails) == ("blocked", ["pw"])
    assert (redacted.outcome, redacted.guardrails) == ("end", ["mail", "cards"])
    assert check(blocked, Expect(ends="blocked", guardrail="pw")) == []
    assert check(redacted, Expect(no_guardrail=True)) == [
        "expected no guardrail to trip; tripped: mail, cards"
    ]
