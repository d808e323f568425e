"""The turn machine's timers: how long client-side calls and approvals may wait.

The machine has no clock; time comes in as ``Tick(now)``. ``AwaitClient`` and
``AwaitApproval`` arm a timer; the shell feeds ``Tick`` as it performs them,
which starts it, and again when a deadline from ``TurnMachine.wait`` passes,
which fires the timers that are due.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CANCEL_REPORT_WAIT", "Timers"]

# How long a cancelled response may take to report its end (and usage) before
# the turn closes with an estimate: OpenAI answers a response.cancel within a
# round trip; the Gemini adapter bounds its own wait by its cancel_grace.
CANCEL_REPORT_WAIT: Final = 5.0


class Timers:
    """The deadlines of one batch's waits (loop time; None: armed, not started)."""

    __slots__ = ("approval", "approval_timeout", "client", "client_timeout")

    def __init__(self, client_timeout: float = 60.0, approval_timeout: float = 120.0) -> None:
        self.client_timeout = client_timeout
        self.approval_timeout = approval_timeout
        self.client: float | None = 0.0
        self.approval: float | None = 0.0

    def arm(self, *, client: bool, approval: bool) -> None:
        """The batch's waits begin: their timers start at the next ``Tick``."""
        if client:
            self.client = None
        if approval:
            self.approval = None

    def start(self, now: float) -> None:
        if self.client is None:
            self.client = now + self.client_timeout
        if self.approval is None:
            self.approval = now + self.approval_timeout

    def deadline(self, *, client: bool, approval: bool) -> float | None:
        """The first deadline of the waits that run (None: none is started)."""
        due = [
            at
            for at, runs in ((self.client, client), (self.approval, approval))
            if runs and at is not None
        ]
        return min(due, default=None)

    def client_due(self, now: float) -> bool:
        return self.client is not None and now >= self.client

    def approval_due(self, now: float) -> bool:
        return self.approval is not None and now >= self.approval
