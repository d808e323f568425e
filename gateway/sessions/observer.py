"""What a session's turns cost and how they are traced: the runtime's two observers.

The turn machine decides *when* usage is charged (its ``Account`` action) and
when a ``metric`` goes out; this module decides *what that costs* and *what
an operator sees*:

- **Cost.** Every ``Account`` is priced with the node's ``PriceTable`` for the
  session's provider and model; the step's dollars go to the next ``metric``
  (``cost.step``, ``cost.total``), to the per-key counters
  (``rtgw_cost_usd_total{key}``, ``rtgw_key_tokens_total{key,direction}``)
  and to the key's daily budget. ``total`` starts from the session meta's
  ``cost_usd``, so it survives reconnects and takeovers like the token total.
- **Traces.** A ``turn`` span per turn, with children per model step (time to
  first token as an attribute), per tool call (``tool NAME``) and per upstream
  connect; session id, key id, provider, model and token usage as attributes.
  A rerun after a takeover links to the cut turn's span (its ``traceparent``,
  kept in the session meta). With tracing off every call returns after one
  attribute test: no span, no dict, no store write.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Final

from opentelemetry.trace import Span

from gateway.metrics import Metrics
from gateway.pricing import PriceTable
from gateway.tracing import AttributeValue, Tracing, fail
from protocol.calls import ToolCall, ToolResult
from protocol.events import Cost, Metric, Usage
from tools.base import ToolContext

__all__ = ["TurnObserver"]

_NO_KEY: Final = "-"  # the key label of sessions opened without an API key


def _ignore(result: ToolResult) -> None:
    pass


class TurnObserver:
    """Cost and spans of one session's turns (see the module docstring)."""

    __slots__ = (
        "_attributes",
        "_prices",
        "_requests",
        "_step",
        "_step_cost",
        "_tracing",
        "_turn",
        "_turn_usage",
        "cost_total",
        "follows",
        "metrics",
        "model",
        "owner",
        "provider",
        "sid",
    )

    def __init__(
        self,
        tracing: Tracing,
        prices: PriceTable,
        metrics: Metrics,
        *,
        sid: str,
        provider: str,
        model: str,
        owner: str = "",
        cost_total: float = 0.0,
    ) -> None:
        self._tracing = tracing
        self._prices = prices
        self.metrics = metrics
        self.sid = sid
        self.provider = provider
        self.model = model
        self.owner = owner
        self.cost_total = cost_total
        self._step_cost = 0.0  # dollars since the last metric
        # The traceparent of a turn another node cut; the next turn links to it.
        self.follows = ""
        self._turn: Span | None = None
        self._step: Span | None = None
        self._requests = 0  # model requests of the turn (steps and their retries)
        self._turn_usage = Usage(input=0, output=0)
        self._attributes: dict[str, AttributeValue] = {}

    # ------------------------------------------------------------------ cost

    def charge(self, usage: Usage) -> float:
        """Price a step's ``usage`` (an ``Account``); returns its US dollars."""
        cost = self._prices.cost(self.provider, self.model, usage)
        self.cost_total += cost
        self._step_cost += cost
        tokens_in, tokens_out, dollars = self.metrics.usage.for_key(self.owner or _NO_KEY)
        tokens_in.inc(usage.input)
        tokens_out.inc(usage.output)
        if cost > 0:
            dollars.inc(cost)
        self._turn_usage = self._turn_usage + usage
        return cost

    def fill(self, metric: Metric) -> None:
        """Put the dollars charged since the previous metric (and the session's) on ``metric``."""
        metric.cost = Cost(step=self._step_cost, total=self.cost_total)
        self._step_cost = 0.0

    # ------------------------------------------------------------------ traces

    @property
    def tracing(self) -> bool:
        return self._tracing.enabled

    def turn_started(self) -> str:
        """A new turn: its span (linked to ``follows``); returns its traceparent ("" when off)."""
        if not self._tracing.enabled:
            return ""
        self.turn_ended()
        self._attributes = {
            "rtgw.session_id": self.sid,
            "rtgw.key_id": self.owner,
            "rtgw.provider": self.provider,
            "rtgw.model": self.model,
        }
        self._requests = 0
        follows, self.follows = self.follows, ""
        attributes: dict[str, AttributeValue] = dict(self._attributes)
        if follows:
            attributes["rtgw.rerun"] = True
        self._turn = self._tracing.start_turn(attributes, follows=follows)
        return self._tracing.traceparent(self._turn)

    def turn_failed(self, code: str) -> None:
        """An ``error`` of the turn (the turn span is marked failed)."""
        turn = self._turn
        if turn is not None:
            fail(turn, f"turn error {code}")
            turn.set_attribute("rtgw.error_code", code)

    def turn_ended(self) -> None:
        """The turn is over (or superseded): end its open spans with its usage."""
        turn = self._turn
        if turn is None:
            return
        self.step_done(None)
        usage, self._turn_usage = self._turn_usage, Usage(input=0, output=0)
        turn.set_attribute("gen_ai.usage.input_tokens", usage.input)
        turn.set_attribute("gen_ai.usage.output_tokens", usage.output)
        turn.set_attribute("rtgw.cost_usd", self.cost_total)
        turn.end()
        self._turn = None

    def step_started(self) -> None:
        """A model step (or a retry of one) was requested."""
        turn = self._turn
        if turn is None:
            return
        self.step_done(None)
        self._requests += 1
        self._step = self._tracing.start_child(
            turn, "model step", {**self._attributes, "rtgw.request": self._requests}
        )

    def first_token(self, seconds: float) -> None:
        step = self._step
        if step is not None:
            step.set_attribute("rtgw.time_to_first_token_s", seconds)

    def step_done(self, usage: Usage | None, error: str = "") -> None:
        """The step's response ended (``usage`` as reported) or failed (``error``)."""
        step = self._step
        if step is None:
            return
        self._step = None
        if usage is not None:
            step.set_attribute("gen_ai.usage.input_tokens", usage.input)
            step.set_attribute("gen_ai.usage.output_tokens", usage.output)
        if error:
            fail(step, error)
        step.end()

    @contextlib.contextmanager
    def connect(self) -> Iterator[None]:
        """Around an upstream connect (a span under the turn; failures marked)."""
        turn = self._turn
        if turn is None:
            yield
            return
        with self._tracing.child(turn, "upstream connect", self._attributes):
            yield

    @contextlib.contextmanager
    def tool(self, call: ToolCall, ctx: ToolContext) -> Iterator[Callable[[ToolResult], None]]:
        """Around one tool call (``tools.executor.CallObserver``): a ``tool NAME`` span
        carrying the call's id and idempotency key (the same for every run of the call)."""
        turn = self._turn
        if turn is None:
            yield _ignore
            return
        attributes: dict[str, AttributeValue] = {
            "rtgw.session_id": self.sid,
            "rtgw.key_id": self.owner,
            "rtgw.tool": call.name,
            "rtgw.tool.call_id": ctx.call_id,
            "rtgw.tool.idempotency_key": ctx.idempotency_key,
        }
        with self._tracing.child(turn, f"tool {call.name}", attributes) as span:

            def seen(result: ToolResult) -> None:
                span.set_attribute("rtgw.tool.status", result.status)
                if result.status != "success":
                    fail(span, f"tool {call.name} failed")

            yield seen
