"""A check for the tests that drive the turn machine: it moves only along the table.

``protocol.turn_table`` declares, for every (state, input) pair, the states the
machine may go to (or that it ignores the input). The fixture ``moves_by_the_table``
wraps ``TurnMachine.feed`` and the hot path ``text`` so every test that drives a
machine (the machine's own, and the sessions' through a real driver) fails on a
move the table does not declare: the diagram in the docs can then be trusted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from protocol.turn import TurnMachine
from protocol.turn_events import Action, TextDelta, TurnInput
from protocol.turn_state import TurnState
from protocol.turn_table import TRANSITIONS


def check_move(before: TurnState, kind: type, after: TurnState) -> None:
    entry = TRANSITIONS[before, kind]
    declared = () if entry is None else entry[1]
    assert after is before or after in declared, (
        f"the machine went {before.value} --{kind.__name__}--> {after.value}, which "
        "protocol/turn_table.py does not declare: declare the arrow (and regenerate the "
        "diagram in docs/architecture.md), or fix the step"
    )


@pytest.fixture(autouse=True)
def moves_by_the_table(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    feed, text = TurnMachine.feed, TurnMachine.text

    def checked_feed(machine: TurnMachine, given: TurnInput) -> Sequence[Action]:
        before = machine.state
        out = feed(machine, given)
        check_move(before, type(given), machine.state)
        return out

    def checked_text(machine: TurnMachine, delta: str) -> Sequence[Action]:
        before = machine.state
        out = text(machine, delta)
        check_move(before, TextDelta, machine.state)
        return out

    monkeypatch.setattr(TurnMachine, "feed", checked_feed)
    monkeypatch.setattr(TurnMachine, "text", checked_text)
    yield
