"""Provider fallback: the breaker's decisions and the turn machine's transitions (no I/O)."""

from __future__ import annotations

import pytest

from protocol.events import End, Error, Interrupt, Respond
from protocol.fallback import ProviderBreaker
from protocol.turn import (
    TurnState,
)
from protocol.turn_events import (
    Backoff,
    Request,
    ResponseDone,
    RetryNow,
    UpstreamFailed,
    UpstreamLost,
)
from tests.protocol.test_turn import USAGE, kinds, only, started, stream

# --- the breaker ---------------------------------------------------------------------


def test_the_primary_is_used_while_it_works() -> None:
    breaker = ProviderBreaker(["openai", "gemini"])
    assert breaker.choose(0.0) == "openai"
    assert breaker.failed("openai", 1.0, fatal=False) == "openai"  # one failure: retry it


def test_a_fatal_failure_switches_at_once_and_the_primary_returns_after_the_cooldown() -> None:
    breaker = ProviderBreaker(["openai", "gemini"], cooldown=60.0)
    assert breaker.failed("openai", 10.0, fatal=True) == "gemini"
    assert breaker.choose(69.9) == "gemini"
    assert breaker.choose(70.0) == "openai"  # half-open: tried again
    # Failing again while half-open opens it for another cooldown at once.
    assert breaker.failed("openai", 70.5, fatal=False) == "gemini"
    assert breaker.choose(130.0) == "gemini"
    assert breaker.choose(130.5) == "openai"
    breaker.succeeded("openai")
    assert breaker.failed("openai", 131.0, fatal=False) == "openai"  # closed again


def test_repeated_failures_within_the_window_trip_the_circuit() -> None:
    breaker = ProviderBreaker(["openai", "gemini"], trip_after=3, window=30.0)
    assert breaker.failed("openai", 0.0, fatal=False) == "openai"
    assert breaker.failed("openai", 40.0, fatal=False) == "openai"  # the first aged out
    assert breaker.failed("openai", 50.0, fatal=False) == "openai"
    assert breaker.failed("openai", 60.0, fatal=False) == "gemini"


def test_when_every_provider_is_open_the_one_reopening_first_is_tried() -> None:
    breaker = ProviderBreaker(["openai", "gemini"], cooldown=10.0)
    breaker.failed("openai", 0.0, fatal=True)
    assert breaker.failed("gemini", 5.0, fatal=True) == "openai"


def test_providers_are_listed_once() -> None:
    with pytest.raises(ValueError, match="distinct"):
        ProviderBreaker(["openai", "openai"])


# --- the turn ------------------------------------------------------------------------


def test_a_fatal_loss_with_a_fallback_reruns_the_step_at_once_naming_the_provider() -> None:
    machine = started()
    stream(machine, "<think>partial</think>Hel")
    lost = machine.feed(UpstreamLost("HTTP 401", fatal=True, fallback="gemini"))
    assert kinds(lost) == ["DropUpstream", "Interrupt", "Backoff"]
    assert "gemini" in only(lost, Interrupt).content
    assert only(lost, Backoff).delay == 0.0
    assert machine.feed(RetryNow()) == [Request()]  # reopened from history, on gemini
    stream(machine, "Hello<end>")
    done = machine.feed(ResponseDone("completed", USAGE))
    assert [a for a in done if isinstance(a, Respond)] == []
    assert machine.idle


def test_a_fallback_before_any_output_sends_no_interrupt() -> None:
    machine = started()
    lost = machine.feed(UpstreamLost("HTTP 401", fatal=True, fallback="gemini"))
    assert kinds(lost) == ["DropUpstream", "Backoff"]


def test_a_fatal_loss_without_a_fallback_fails_the_turn_without_retrying() -> None:
    machine = started(upstream_retries=3)
    failed = machine.feed(UpstreamLost("HTTP 401", fatal=True))
    assert kinds(failed) == ["DropUpstream", "Error", "Persist", "End", "Metric"]
    assert "refused" in only(failed, Error).content
    assert machine.idle


def test_a_provider_error_with_a_fallback_reruns_instead_of_failing() -> None:
    machine = started()
    stream(machine, "Hel")
    out = machine.feed(UpstreamFailed("insufficient_quota", "no credit", fallback="gemini"))
    assert kinds(out) == ["DropUpstream", "Interrupt", "Backoff"]
    assert machine.state is TurnState.BACKOFF


def test_fallbacks_count_as_attempts_so_a_turn_ends_when_every_provider_fails() -> None:
    machine = started(upstream_retries=2)
    machine.feed(UpstreamLost("401", fatal=True, fallback="gemini"))
    machine.feed(RetryNow())
    machine.feed(UpstreamLost("403", fatal=True, fallback="openai"))
    machine.feed(RetryNow())
    failed = machine.feed(UpstreamLost("401", fatal=True, fallback="gemini"))
    assert kinds(failed)[-3:] == ["Persist", "End", "Metric"]
    assert any(isinstance(a, End) for a in failed)
    assert machine.idle
