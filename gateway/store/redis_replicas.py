"""Whether each Redis master's replicas confirm writes (``WAIT``), as the store last saw.

The group commit ends each master's pipeline with ``WAIT 1 timeout`` under
durability "replicated" or "replicated-or-local", and ``confirmed_seq`` asks
again for a session whose append was not confirmed; each answer is noted here
per master. What it says is for operators: ``/readyz`` turns 503 while, under
"replicated", sessions hold their events for want of a replica
(``holding``), and the metrics show a master whose writes go out unconfirmed
under "replicated-or-local" (``unconfirmed``).

Under "replicated-or-local" a master with no confirming replica is not waited
on for the full ``replica_timeout`` per pipeline (that would stall its sessions
a second per batch, the opposite of the mode's point): its pipelines end with
a ``WAIT`` of ``PROBE_MS`` instead, which notices the replica's return within a
batch or two.
"""

from __future__ import annotations

import time
from typing import Final

from gateway.store.base import Durability

__all__ = ["PROBE_MS", "ReplicaWatch"]

PROBE_MS: Final = 10
"""How long a degraded master's pipeline waits for a replica (replicated-or-local)."""


class ReplicaWatch:
    """Per master: since when no replica confirms its writes (absent: they do)."""

    def __init__(self, durability: Durability, replica_timeout_ms: int, where: str) -> None:
        self.durability: Durability = durability
        self.replica_timeout_ms = replica_timeout_ms
        self.where = where
        self._since: dict[str, float] = {}  # master name → monotonic time of the first miss

    def confirmed(self, master: str, ok: bool) -> None:
        """A ``WAIT`` at ``master`` was answered: by a replica (``ok``) or by its timeout."""
        if ok:
            self._since.pop(master, None)
        else:
            self._since.setdefault(master, time.monotonic())

    def wait_ms(self, master: str) -> int:
        """How long ``master``'s next pipeline waits for a replica."""
        if self.durability == "replicated-or-local" and master in self._since:
            return min(PROBE_MS, self.replica_timeout_ms)
        return self.replica_timeout_ms

    def unconfirmed(self) -> list[str]:
        """The masters whose replicas did not confirm the last write asked of them."""
        return sorted(self._since)

    def holding(self) -> str | None:
        """Under "replicated": why sessions hold events now (for ``/readyz``); else None."""
        if self.durability != "replicated" or not self._since:
            return None
        since = min(self._since.values())
        masters = ", ".join(self.unconfirmed())
        return (
            f"no Redis replica has confirmed writes to {masters} ({self.where}) for "
            f"{time.monotonic() - since:.1f}s (durability replicated): sessions there hold "
            "their events until one does; bring a replica back in sync"
        )
