"""Prometheus metrics of one gateway node, served at ``GET /metrics``.

Each node gets its own ``CollectorRegistry`` so several nodes in one process
(tests, benchmarks) never share counters. Hot-path counters (events, tokens)
are incremented once per flushed batch, not per token.

``serve --workers N`` runs N processes behind one port, and a scrape reaches
whichever worker the kernel picks. So the supervisor gives its workers
prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set
before the library is imported): every worker's values live in files in that
directory, and any worker answers a scrape with the sum over all of them.
Gauges that count live things (connections, sessions) sum over live workers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = ["MULTIPROC_ENV", "Metrics"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class StoreMetrics:
    """What the session store keeps or cannot keep of its durability promise."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.holding = Gauge(
            "rtgw_store_holding_sessions",
            "Sessions holding their events because the store has not confirmed them "
            "(unreachable, or under durability replicated no replica confirms)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.unreplicated = Counter(
            "rtgw_store_unreplicated",
            "Appends no replica confirmed in time under durability replicated (held, not sent)",
            registry=r,
        )
        self.unconfirmed = Gauge(
            "rtgw_store_unconfirmed_masters",
            "Redis masters whose replicas did not confirm the last write asked of them "
            "(durability replicated or replicated-or-local; 0 under local)",
            registry=r,
            multiprocess_mode="max",
        )
        self._unconfirmed: Callable[[], Sequence[str]] = list

    def watch(self, unconfirmed: Callable[[], Sequence[str]]) -> None:
        """Read ``rtgw_store_unconfirmed_masters`` from the store (``Health.unconfirmed``)."""
        self._unconfirmed = unconfirmed

    def update(self) -> None:
        """At each scrape: the values only the store knows."""
        self.unconfirmed.set(len(self._unconfirmed()))


class GuardrailMetrics:
    """What guardrail rules do: their trips, and their HTTP checkers' failures."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.trips = Counter(
            "rtgw_guardrail_trips",
            "Guardrail rules tripped, by rule, action and side (input, output)",
            ["rule", "action", "on"],
            registry=r,
        )
        # The checker erred, timed out or answered off the contract: its rule's
        # on_check_error decided. reason: timeout, unreachable, status, too_large,
        # bad_answer, too_long.
        self.check_errors = Counter(
            "rtgw_guardrail_check_errors",
            "HTTP checker rules whose checker failed (on_check_error decided), by rule and reason",
            ["rule", "reason"],
            registry=r,
        )


class ToolMetrics:
    """What tool calls do: outcomes per tool, approval waits, background calls."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.calls = Counter("rtgw_tool_calls", "Tool calls executed", registry=r)
        self.failures = Counter("rtgw_tool_failures", "Tool calls that failed", registry=r)
        # By server tool ("other" for a session's client tools: tenants name them) and
        # outcome (success, failure, cancelled).
        self.outcomes = Counter(
            "rtgw_tool_call_outcomes",
            "Tool calls that finished, by tool and outcome",
            ["tool", "outcome"],
            registry=r,
        )
        self.approval_wait = Histogram(
            "rtgw_approval_wait_seconds",
            "Time a call waited for a user's approval, by decision",
            ["decision"],
            buckets=(0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
            registry=r,
        )
        self.background = Gauge(
            "rtgw_background_calls",
            "Background tool calls running on this node",
            registry=r,
            multiprocess_mode="livesum",
        )


class ClientMetrics:
    """What the edge does with clients: connections, refusals, and a slow reader's fate."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.connections = Gauge(
            "rtgw_connections",
            "Open client WebSocket connections",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.connections_total = Counter(
            "rtgw_connections_accepted", "Client connections accepted", registry=r
        )
        self.refused = Counter(
            "rtgw_connections_refused",
            "Connections refused at the handshake, by reason",
            ["reason"],
            registry=r,
        )
        # Backpressure (gateway.edge.backpressure, gateway.edge.reaper) and the frame-rate limit.
        self.client_lagging = Counter(
            "rtgw_client_catchups",
            "Times a slow client was switched to catch-up from the log",
            registry=r,
        )
        self.coalesced = Counter(
            "rtgw_coalesced_chunks",
            "think/respond chunks merged into coalesced frames for clients that fell behind",
            registry=r,
        )
        self.slow_client_closes = Counter(
            "rtgw_slow_client_closes",
            "Connections closed with 4008 because the client stopped reading",
            registry=r,
        )
        self.frames_dropped = Counter(
            "rtgw_client_frames_dropped",
            "Client frames dropped unread: the connection was over its frame-rate limit",
            registry=r,
        )
        self.replies_dropped = Counter(
            "rtgw_replies_dropped",
            "Unlogged replies dropped because the client was not reading them",
            registry=r,
        )


class UsageMetrics:
    """What the model was asked for: tokens in all, and tokens and dollars per API key."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.tokens = Counter(
            "rtgw_tokens", "Tokens reported by upstream usage", ["direction"], registry=r
        )
        # Per API key (the session's owner; "-" without auth): what each key costs.
        self.key_tokens = Counter(
            "rtgw_key_tokens",
            "Model tokens charged to each API key, by direction (input, output)",
            ["key", "direction"],
            registry=r,
        )
        self.key_cost = Counter(
            "rtgw_cost_usd",
            "US dollars of model usage charged to each API key (gateway/pricing.py prices)",
            ["key"],
            registry=r,
        )
        # Labelled children of the per-step counters, looked up once: labels()
        # takes a lock and builds a key each call (1% of the CPU at 50
        # streaming sessions of short turns, py-spy).
        self.tokens_input = self.tokens.labels("input")
        self.tokens_output = self.tokens.labels("output")
        self._per_key: dict[str, tuple[Counter, Counter, Counter]] = {}

    def for_key(self, key: str) -> tuple[Counter, Counter, Counter]:
        """``key``'s input tokens, output tokens and dollars counters (children, cached)."""
        counters = self._per_key.get(key)
        if counters is None:
            counters = self._per_key[key] = (
                self.key_tokens.labels(key, "input"),
                self.key_tokens.labels(key, "output"),
                self.key_cost.labels(key),
            )
        return counters


class Metrics:
    """The node's registry and its metrics, grouped by who counts them."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.clients = ClientMetrics(r)
        self.sessions = Gauge(
            "rtgw_sessions_driven",
            "Sessions this node drives",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.turns = Counter("rtgw_turns", "Turns started", registry=r)
        self.guardrails = GuardrailMetrics(r)
        self.events = Counter("rtgw_events", "Events logged and sent to clients", registry=r)
        self.tools = ToolMetrics(r)
        self.upstream_errors = Counter(
            "rtgw_upstream_errors", "Upstream connections lost or refused", registry=r
        )
        self.first_delta = Histogram(
            "rtgw_upstream_first_delta_seconds",
            "Time from response request to the model's first text delta",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.usage = UsageMetrics(r)
        self.store_errors = Counter(
            "rtgw_store_errors", "Times the session store was unreachable", registry=r
        )
        self.store = StoreMetrics(r)
        # Per-key limits (gateway.sessions.limits).
        self.turns_refused = Counter(
            "rtgw_turns_refused",
            "Turns refused by a per-key limit, by reason (rate_limited, quota_exceeded)",
            ["reason"],
            registry=r,
        )

    def render(self) -> bytes:
        """The exposition text: this node's, or every worker's summed (``--workers``)."""
        self.store.update()
        directory = os.environ.get(MULTIPROC_ENV)
        if directory:
            merged = CollectorRegistry()
            MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]
            return generate_latest(merged)
        return generate_latest(self.registry)
