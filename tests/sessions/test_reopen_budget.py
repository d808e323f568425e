"""How soon an outdated provider connection may be replaced (``ReopenBudget``), without sockets."""

from __future__ import annotations

import math

from gateway.sessions.asking import REOPEN_BURST, REOPEN_EVERY, ReopenBudget


def test_a_burst_goes_at_once_then_one_per_interval() -> None:
    budget = ReopenBudget(-math.inf)
    now = 100.0
    for _ in range(REOPEN_BURST):
        assert budget.due(now) == now
        budget.spend(now)
    assert budget.due(now) == now + REOPEN_EVERY
    later = now + REOPEN_EVERY
    assert budget.due(later) == later
    budget.spend(later)
    assert budget.due(later) == later + REOPEN_EVERY


def test_a_reopen_that_is_never_held_back_still_spends_the_budget() -> None:
    """A typed turn's reopen is not held back, but the next idle one waits the longer."""
    budget = ReopenBudget(-math.inf)
    for _ in range(REOPEN_BURST + 2):
        budget.spend(0.0)
    assert budget.due(0.0) == 3 * REOPEN_EVERY
    assert budget.due(3 * REOPEN_EVERY) == 3 * REOPEN_EVERY


def test_the_budget_refills_to_its_burst_not_beyond() -> None:
    budget = ReopenBudget(-math.inf)
    budget.spend(0.0)
    hour = 3600.0
    for _ in range(REOPEN_BURST):
        assert budget.due(hour) == hour
        budget.spend(hour)
    assert budget.due(hour) > hour
