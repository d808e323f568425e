"""What an operator watches: the /metrics series and JSON logs that name the session."""

from __future__ import annotations

import asyncio
import io
import logging

import orjson
import pytest

from gateway.log_context import SessionFilter, sid_of_current_task
from gateway.logs import JsonFormatter
from tests.edge.conftest import GatewayFactory, http_get, metric_value, refusal
from tests.support.client import GatewayClient

memory_only = pytest.mark.parametrize("store_kind", ["memory"])

SERIES = [
    # connections and refusals
    "rtgw_connections",
    "rtgw_connections_accepted_total",
    'rtgw_connections_refused_total{reason="unknown_session"}',
    # sessions, turns, events (rate(rtgw_events_total[1m]) = events/s)
    "rtgw_sessions_driven",
    "rtgw_turns_total",
    "rtgw_events_total",
    # tools
    "rtgw_tool_calls_total",
    "rtgw_tool_failures_total",
    # upstream
    "rtgw_upstream_first_delta_seconds_bucket",
    "rtgw_upstream_first_delta_seconds_count",
    "rtgw_upstream_errors_total",
    'rtgw_tokens_total{direction="input"}',
    'rtgw_tokens_total{direction="output"}',
    # the store
    "rtgw_store_errors_total",
    "rtgw_store_holding_sessions",
    "rtgw_store_unreplicated_total",
    "rtgw_store_unconfirmed_masters",
    # limits and backpressure
    'rtgw_turns_refused_total{reason="rate_limited"}',
    "rtgw_client_catchups_total",
    "rtgw_coalesced_chunks_total",
    "rtgw_slow_client_closes_total",
    "rtgw_replies_dropped_total",
]


@memory_only
async def test_metrics_expose_every_series_an_operator_needs(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(turns_per_minute=1) as gw:
        client = await GatewayClient.connect(gw.url)
        await client.turn('/tool read {"path": "missing.txt"}')  # a failing tool call
        await client.user("over the limit")
        await client.next()  # rate_limited
        await refusal(f"{gw.url}?session_id=nope")
        status, text = await http_get(gw, "/metrics")
        assert status == 200
        names = {line.rpartition(" ")[0].split("{")[0] for line in text.splitlines()}
        labelled = {line.rpartition(" ")[0] for line in text.splitlines()}
        for series in SERIES:
            assert series in labelled or series in names, f"{series} missing from /metrics"
        assert metric_value(text, "rtgw_tool_calls_total") == 1
        assert metric_value(text, "rtgw_tool_failures_total") == 1
        assert metric_value(text, "rtgw_turns_total") == 1
        assert metric_value(text, "rtgw_events_total") > 5
        assert metric_value(text, "rtgw_tokens_total", 'direction="output"') > 0
        assert metric_value(text, "rtgw_connections") == 1
        await client.close()


# --------------------------------------------------------------------- logs


def test_the_filter_takes_sid_from_the_task_name_and_adds_the_node() -> None:
    flt = SessionFilter("node-7")

    async def in_task() -> logging.LogRecord:
        record = logging.makeLogRecord({"msg": "x"})
        flt.filter(record)
        return record

    async def main() -> None:
        named = await asyncio.create_task(in_task(), name="turn:AbCdEfGh12345678_-xyz")
        assert named.sid == "AbCdEfGh12345678_-xyz"  # type: ignore[attr-defined]
        assert named.node == "node-7"  # type: ignore[attr-defined]
        other = await asyncio.create_task(in_task(), name="lease-keeper")
        assert not hasattr(other, "sid")
        explicit = logging.makeLogRecord({"msg": "x", "sid": "given"})
        flt.filter(explicit)
        assert explicit.sid == "given"  # type: ignore[attr-defined]

    asyncio.run(main())
    assert sid_of_current_task() is None  # no loop: no sid, no error


@memory_only
async def test_json_logs_of_a_session_carry_its_sid_and_the_node(
    gateway_factory: GatewayFactory,
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gateway")
    async with gateway_factory(sim_drop_after=3, upstream_retries=1) as gw:
        handler.addFilter(SessionFilter(gw.node.node_id))
        logger.addHandler(handler)
        old_level = logger.level
        logger.setLevel(logging.INFO)
        try:
            client = await GatewayClient.connect(gw.url)
            await client.user("the upstream drops mid-answer")  # logs upstream warnings
            await client.until_type("end")
            await client.close()
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old_level)
    records = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    session_records = [r for r in records if r["logger"] == "gateway.sessions.runtime"]
    assert session_records, records
    for record in session_records:
        assert record["sid"] == client.sid, record
        assert record["node"] == gw.node.node_id
