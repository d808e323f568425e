"""Key policies: what a key's sessions may ask for, refused up front or cut to it."""

from __future__ import annotations

from gateway.sessions.policy import KeyPolicy, refusal, within
from protocol.configuration import SessionConfig


def test_a_reasoning_effort_outside_the_keys_list_is_refused_naming_the_list() -> None:
    policy = KeyPolicy(reasoning_efforts=("minimal", "low"))
    assert refusal(policy, SessionConfig(reasoning_effort="low")) is None
    assert refusal(policy, SessionConfig()) is None  # the model's default is always fine
    refused = refusal(policy, SessionConfig(reasoning_effort="xhigh"))
    assert refused is not None
    assert "'xhigh' is not allowed" in refused and "minimal" in refused and "low" in refused


def test_a_stored_session_is_cut_to_a_tightened_policy() -> None:
    policy = KeyPolicy(reasoning_efforts=("minimal",))
    cut = within(policy, SessionConfig(reasoning_effort="high", instructions="x"))
    assert cut.reasoning_effort is None and cut.instructions == "x"
    kept = SessionConfig(reasoning_effort="minimal")
    assert within(policy, kept) is kept
