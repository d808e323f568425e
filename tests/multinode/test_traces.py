"""OpenTelemetry traces from real `gateway serve` processes to a real OTLP/HTTP receiver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config import load_config
from gateway.store import open_store
from protocol.events import Call, Respond
from protocol.journal import idempotency_key
from tests.multinode.conftest import NodeFactory, SimFactory
from tests.multinode.test_failover import MESSAGE, drain_connection, final_answer
from tests.support.client import GatewayClient, text_of
from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.procs import NodeProcess
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as r:
        yield r


def _otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "rtgw-test",
    }


def _named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


async def test_a_tool_turn_is_one_trace_with_step_and_tool_spans(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    node = NodeProcess(
        [
            "serve",
            "--port",
            "0",
            "--provider",
            "sim",
            "--workspace-root",
            str(tmp_path / "workspaces"),
        ],
        env=_otel_env(receiver),
    ).start()
    try:
        client = await GatewayClient.connect(node.url)
        events = await client.turn("/tool list {}")
        assert text_of(events, "respond") == "The tool returned success."
        spans = receiver.wait_for(
            lambda got: _named(got, "turn") and _named(got, "tool list") and len(got) >= 4
        )
        await client.close()
    finally:
        node.kill()
    (turn,) = _named(spans, "turn")
    assert turn.service == "rtgw-test"
    assert turn.attributes["rtgw.session_id"] == client.sid
    assert turn.attributes["rtgw.provider"] == "sim"
    assert turn.attributes["rtgw.model"] == "sim"
    assert turn.attributes["gen_ai.usage.output_tokens"] > 0
    (tool,) = _named(spans, "tool list")
    assert (tool.trace_id, tool.parent_span_id) == (turn.trace_id, turn.span_id)
    assert tool.attributes["rtgw.tool.status"] == "success"
    # The call's id as clients see it, and its idempotency key (the same on every run).
    (call,) = [e for e in events if isinstance(e, Call)]
    assert tool.attributes["rtgw.tool.call_id"] == call.id
    assert tool.attributes["rtgw.tool.idempotency_key"] == idempotency_key(client.sid, call.id)
    steps = _named(spans, "model step")
    assert len(steps) == 2  # the step that called the tool and the one that answered
    for step in steps:
        assert step.parent_span_id == turn.span_id
        assert step.attributes["rtgw.time_to_first_token_s"] >= 0
        assert step.attributes["gen_ai.usage.output_tokens"] > 0
    connects = _named(spans, "upstream connect")
    assert connects and all(c.parent_span_id == turn.span_id for c in connects)


async def test_a_rerun_after_kill_9_links_to_the_cut_turn(
    receiver: OtlpReceiver,
    start_sim: SimFactory,
    start_node: NodeFactory,
    durable_redis: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in _otel_env(receiver).items():
        monkeypatch.setenv(name, value)  # NodeProcess passes os.environ on
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await GatewayClient.connect(a.url)
    await first.user(MESSAGE)
    await first.until(lambda e: isinstance(e, Respond))
    # The cut turn's span never ends (its node dies): its id is in the session meta.
    store = open_store(durable_redis.url, prefix=load_config({}, env={}).key_prefix)
    try:
        meta = await store.get_meta(first.sid)
    finally:
        await store.close()
    assert meta is not None and meta.get("traceparent")
    cut_trace, cut_span = meta["traceparent"].split("-")[1:3]
    a.kill()
    await drain_connection(first)

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    await second.until_type("metric")
    assert final_answer(first.events + second.events) == f"Echo: {MESSAGE}"
    spans = receiver.wait_for(lambda got: _named(got, "turn"))
    await second.close()
    (rerun,) = _named(spans, "turn")
    assert rerun.links == [cut_span]
    assert rerun.trace_id != cut_trace
    assert rerun.attributes["rtgw.rerun"] is True
    assert rerun.attributes["rtgw.session_id"] == first.sid
