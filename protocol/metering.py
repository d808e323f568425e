"""What a turn's model steps cost in tokens, between two ``metric`` events.

The turn machine (``protocol.turn``) counts each attempt's usage once (as
the provider reported it, or estimated from characters when it did not),
adds it up until the next ``metric``, and then hands out ``Account`` (charge
it) and ``Metric`` (report it) together, so counters, quotas and the
client's view always agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from protocol.events import Metric, Usage
from protocol.turn_events import Account, Action

__all__ = ["ZERO_USAGE", "UsageMeter", "billed_tokens_estimate"]

ZERO_USAGE: Final = Usage(input=0, output=0)


def billed_tokens_estimate(chars: int) -> int:
    """Tokens a provider bills for ``chars`` characters it did not report (~4 per token).

    For usage that was never reported (a lost connection, an abandoned
    Gemini turn): an estimate of what was billed, not a budget.
    """
    return (chars + 3) // 4


class UsageMeter:
    """The usage since the turn's last metric, and the session's ``total``."""

    __slots__ = ("_counted", "_estimated", "_unreported", "total")

    def __init__(self, total: Usage = ZERO_USAGE) -> None:
        self.total = total
        self._unreported = ZERO_USAGE  # usage since the turn's last metric
        self._estimated = False
        self._counted = False  # this attempt's usage was counted (reported or estimated)

    def new_turn(self) -> None:
        self._unreported = ZERO_USAGE
        self._estimated = False

    def new_attempt(self) -> None:
        self._counted = False

    def count(self, usage: Usage | None, estimated: bool, chars: Callable[[], int]) -> None:
        """Add an attempt's usage (once); without one, an estimate from ``chars()`` of output.

        ``chars`` is called only when there is no report: the text the parser
        accepted (an overrun past a stop marker is not seen) — no per-delta
        counter is kept on the hot path.
        """
        if self._counted:
            return
        self._counted = True
        if usage is None:
            seen = chars()
            if not seen:
                return
            usage = Usage(input=0, output=billed_tokens_estimate(seen))
            estimated = True
        self._unreported = self._unreported + usage
        self._estimated = self._estimated or estimated

    def lost(self, chars: int) -> list[Action]:
        """``Account`` and ``Metric`` for a turn a new node found closed without its metric
        (its node died waiting for the provider's usage): estimated from the ``chars`` of
        text it was shown, as any usage never reported."""
        self._counted = False
        self.count(None, True, lambda: chars)
        self._estimated = True
        return self.metric()

    def metric(self) -> list[Action]:
        """``Account`` and ``Metric`` for the usage since the last metric (zero: no ``Account``)."""
        step, self._unreported = self._unreported, ZERO_USAGE
        estimated, self._estimated = self._estimated, False
        out: list[Action] = []
        if step.input or step.output or step.seconds:
            out.append(Account(step))
            self.total = self.total + step
        metric = Metric(step=step, total=self.total)
        if estimated:
            metric.estimated = True
        out.append(metric)
        return out
