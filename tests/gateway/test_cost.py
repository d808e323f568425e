"""What turns cost: metric.cost from the price table, per-key counters, the daily budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.pricing import load_prices
from protocol.events import Error, Metric
from tests.edge.conftest import Keys, http_get, keys, metric_value
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient, text_of

__all__ = ["keys"]

# Dear prices, so a few simulated tokens cost a visible amount.
PRICES = '[sim."*"]\ninput = 100.0\noutput = 1000.0\n'
NOW = 1_700_000_000.0


def prices_file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.toml"
    path.write_text(PRICES)
    return path


async def test_metrics_carry_the_cost_the_price_table_computes(
    gateway_factory: GatewayFactory, tmp_path: Path, keys: Keys
) -> None:
    path = prices_file(tmp_path)
    table = load_prices(path)
    settings = {"prices_file": str(path), "api_keys_file": str(keys.path)}
    async with gateway_factory(**settings) as gw:
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        events = await client.turn("/tool list {}")
        metrics = [e for e in events if isinstance(e, Metric)]
        assert len(metrics) == 2  # the tool step's and the closing one
        for metric in metrics:
            assert metric.cost.step > 0
            assert metric.cost.step == pytest.approx(table.cost("sim", "sim", metric.step))
        assert metrics[-1].cost.total == pytest.approx(sum(m.cost.step for m in metrics))
        again = await client.turn("and now?")
        last = again[-1]
        assert isinstance(last, Metric)
        assert last.cost.total == pytest.approx(metrics[-1].cost.total + last.cost.step)
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_cost_usd_total", 'key="alice"') == pytest.approx(
            last.cost.total
        )
        assert (
            metric_value(text, "rtgw_key_tokens_total", 'direction="output",key="alice"')
            == last.total.output
        )
        await client.close()


async def test_the_session_cost_total_survives_a_reconnect(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    async with gateway_factory(prices_file=str(prices_file(tmp_path))) as gw:
        client = await GatewayClient.connect(gw.url)
        first = (await client.turn("hello"))[-1]
        assert isinstance(first, Metric) and first.cost.total > 0
        sid = client.sid
        await client.close()
        # The runtime is let go once idle; the total waits in the session meta.
        again = await GatewayClient.connect(gw.url, session_id=sid, after=client.last_seq)
        second = (await again.turn("hello again"))[-1]
        assert isinstance(second, Metric)
        assert second.cost.total == pytest.approx(first.cost.total + second.cost.step)
        await again.close()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_key_over_its_daily_budget_is_refused_on_every_node(
    gateway_factory: GatewayFactory, tmp_path: Path, keys: Keys
) -> None:
    settings = {
        "prices_file": str(prices_file(tmp_path)),
        "api_keys_file": str(keys.path),
        "usd_per_day": 0.01,  # one simulated turn costs more
    }
    async with gateway_factory(**settings) as one, gateway_factory(**settings) as two:
        one.node.limits.clock = two.node.limits.clock = lambda: NOW
        client = await GatewayClient.connect(one.url, headers=keys.bearer("alice"))
        events = await client.turn("this turn goes over the budget; it finishes")
        assert text_of(events, "respond").startswith("Echo:")
        spent = events[-1]
        assert isinstance(spent, Metric) and spent.cost.total > 0.01
        await client.user("one more")
        refused = await client.next()
        assert isinstance(refused, Error) and refused.code == "quota_exceeded"
        assert "budget" in refused.content and "00:00 UTC" in refused.content
        # The other node counts the same dollars (the store holds them).
        other = await GatewayClient.connect(two.url, headers=keys.bearer("alice"))
        await other.user("from another node")
        refused = await other.next()
        assert isinstance(refused, Error) and refused.code == "quota_exceeded"
        # Another key still has its budget.
        bob = await GatewayClient.connect(two.url, headers=keys.bearer("bob"))
        assert text_of(await bob.turn("hi"), "respond") == "Echo: hi"
        for c in (client, other, bob):
            await c.close()
