"""Provider fallback: which provider a node's sessions use next, as a pure breaker.

A node is configured with an ordered list of providers (``--provider
openai,gemini``). Each has a circuit: closed while it works; opened at once by a
failure a retry will not fix (``fatal``: auth, quota, model refused) or by
``trip_after`` failures within ``window`` seconds across the node's sessions
(repeated connect failures); while open, sessions use the next provider whose
circuit is closed. After ``cooldown`` seconds an open circuit lets the next
request try the provider again (half-open): a success closes it, a failure
opens it for another cooldown. So the primary comes back by itself.

Time is passed in (``now``, seconds of any monotonic clock): no clock is read
here, so tests feed the breaker any history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["ProviderBreaker"]


class _Circuit:
    __slots__ = ("failures", "open_until")

    def __init__(self) -> None:
        self.failures: deque[float] = deque()  # times of recent non-fatal failures
        self.open_until: float | None = None  # open until then (None: closed)


class ProviderBreaker:
    """The circuits of an ordered list of providers (the first is the primary)."""

    def __init__(
        self,
        providers: Sequence[str],
        *,
        trip_after: int = 3,
        window: float = 30.0,
        cooldown: float = 60.0,
    ) -> None:
        if not providers:
            raise ValueError("a provider breaker needs at least one provider")
        if len(set(providers)) != len(providers):
            raise ValueError(f"providers must be distinct, got {list(providers)}")
        self.providers = tuple(providers)
        self.trip_after = trip_after
        self.window = window
        self.cooldown = cooldown
        self._circuits = {name: _Circuit() for name in self.providers}

    def is_open(self, provider: str, now: float) -> bool:
        """The provider is being avoided (its cooldown has not ended)."""
        until = self._circuits[provider].open_until
        return until is not None and now < until

    def choose(self, now: float) -> str:
        """The provider the next connection uses: the first one not avoided.

        When every circuit is open, the one that reopens soonest: a session
        never has no provider to try (its turn's retry limit still applies).
        """
        for name in self.providers:
            if not self.is_open(name, now):
                return name
        return min(self.providers, key=lambda n: self._circuits[n].open_until or 0.0)

    def failed(self, provider: str, now: float, *, fatal: bool) -> str:
        """Record a failure of ``provider``; the provider to use next (maybe the same)."""
        circuit = self._circuits[provider]
        if fatal:
            circuit.failures.clear()
            circuit.open_until = now + self.cooldown
        else:
            failures = circuit.failures
            failures.append(now)
            while failures and failures[0] <= now - self.window:
                failures.popleft()
            half_open = circuit.open_until is not None
            if len(failures) >= self.trip_after or half_open:
                failures.clear()
                circuit.open_until = now + self.cooldown
        return self.choose(now)

    def succeeded(self, provider: str) -> None:
        """A response from ``provider`` completed: its circuit closes."""
        circuit = self._circuits[provider]
        circuit.failures.clear()
        circuit.open_until = None
