"""``gateway.tracing`` against a real OTLP/HTTP receiver on loopback."""

from __future__ import annotations

import os

import pytest

from gateway.tracing import Tracing, TracingError, fail
from tests.support.otlp import otlp_receiver


def _setenv(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_off_unless_the_environment_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    _setenv(monkeypatch, {})
    assert not Tracing.from_env().enabled
    _setenv(
        monkeypatch, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}
    )
    assert not Tracing.from_env().enabled
    off = Tracing.off()
    span = off.start_turn({"rtgw.session_id": "s"})
    assert not span.is_recording()
    assert off.traceparent(span) == ""


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "http/protobuf",
        ),
    ],
)
def test_settings_it_cannot_honour_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    _setenv(monkeypatch, env)
    with pytest.raises(TracingError, match=says):
        Tracing.from_env()


@pytest.mark.timeout(30)
def test_spans_reach_the_collector_with_parents_links_and_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with otlp_receiver() as receiver:
        _setenv(
            monkeypatch,
            {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "gw-test"},
        )
        tracing = Tracing.from_env(node_id="n1")
        assert tracing.enabled
        turn = tracing.start_turn({"rtgw.session_id": "s1", "rtgw.provider": "sim"})
        with tracing.child(turn, "tool read", {"rtgw.tool": "read"}):
            pass
        step = tracing.start_child(turn, "model step")
        fail(step, "the model's API reported overloaded")
        step.end()
        cut = tracing.traceparent(turn)
        turn.end()
        rerun = tracing.start_turn({"rtgw.session_id": "s1"}, follows=cut)
        rerun.end()
        tracing.close()  # flushes the batch
        spans = receiver.wait_for(lambda s: len(s) >= 4)
    by_name: dict[str, list] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    first, second = by_name["turn"]
    assert first.service == "gw-test"
    assert first.attributes["rtgw.session_id"] == "s1"
    tool = by_name["tool read"][0]
    assert tool.parent_span_id == first.span_id and tool.trace_id == first.trace_id
    assert by_name["model step"][0].status_code == 2  # STATUS_CODE_ERROR
    assert second.trace_id != first.trace_id and second.links == [first.span_id]
