"""One conformance suite for every provider adapter, run through a real gateway.

For each provider the matching simulator flavour runs in-process with the
same model behaviour, a gateway is configured exactly as for the real API
(``provider``, ``*_base_url`` pointing at the simulator, an API key the
simulator enforces), and a client drives scripted turns over the client
protocol. What the client sees must not depend on the provider: the same
events, in the same order, with the same merged think/respond/call/result
contents (seq, timestamps and chunking aside) — checked against the expected
sequences and against each other.

Every turn ends with one closing event (``end`` or ``cancelled``) and then
one ``metric``, on every provider, and every model step is counted: Gemini
Live has no cancel, so a step stopped at ``</execute>`` while the model keeps
writing (or a cancelled one) gets a ``metric`` whose usage is estimated from
characters (``estimated: true``). The metric *count* is the same on both
flavours; exact token counts differ, so sequences compare metrics by place.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.app import running_gateway
from gateway.config import ConfigError, load_config
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from gateway.upstream import providers
from protocol.events import Event, Metric, Usage
from tests.support.client import GatewayClient

# Every row of the provider table, each against its simulator flavour.
PROVIDERS = [row.name for row in providers.PROVIDERS]
KEY = "conformance-key"


def text_model(name: str) -> str:
    """The model the text protocol runs on: the row's default where it writes text, else
    the simulator's own (today's Live models only speak: see
    tests/gateway/test_spoken_models.py; Azure names no default deployment)."""
    row = providers.by_name(name)
    default = row.default_model
    return default if default and row.facts(default).answers == "text" else "sim"


Shape = list[tuple[str, str]]

HI: Shape = [
    ("user", "hi"),
    ("think", "The user said something."),
    ("respond", "Echo: hi"),
    ("end", ""),
    ("metric", ""),
]
TOOL = '/tool list {"path": "."}'
TOOL_TURN: Shape = [
    ("user", TOOL),
    ("think", "I should call list."),
    ("call", '{"name":"list","args":{"path":"."}}'),
    ("execute", ""),
    ("metric", ""),
    ("result", '[{"tool":"list","status":"success","content":{"path":".","entries":[]}}]'),
    ("think", "The tool answered."),
    ("respond", "The tool returned success."),
    ("end", ""),
    ("metric", ""),
]
MALFORMED = "/raw <think>Calling.</think><execute>[{bad</execute>"
MALFORMED_ERROR = (
    "the <execute> block is not valid JSON (unexpected character, expected a string key: "
    "line 1 column 3 (char 2)); no tool was run. Send the calls again: write the block as a "
    'JSON array of calls, each {"name": "<tool>", "args": {...}}, e.g. <execute>[{"name": '
    '"tool_name", "args": {"arg": "value"}}]</execute>'
)


def msgspec_quote(text: str) -> str:
    """``text`` as a JSON string (how a result's content quotes an error)."""
    return msgspec.json.encode(text).decode()


def kind(event: Event) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def shape(events: list[Event]) -> Shape:
    """Event types with merged think/respond contents; no seq, timestamps or chunking.

    Metrics keep only their place (their token counts are checked by
    ``check_usage``); an interrupt's text names the provider's error, so it is
    dropped; an error keeps its code with its content.
    """
    out: Shape = []
    for event in events:
        name = kind(event)
        content = getattr(event, "content", "")
        if name in ("think", "respond") and out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + content)
        elif name in ("metric", "interrupt", "execute", "end"):
            out.append((name, ""))
        elif name == "error":
            out.append((f"error:{event.code}", content))  # type: ignore[union-attr]
        else:
            out.append((name, content))
    return out


def check_usage(events: list[Event]) -> None:
    """Every metric has positive step counts, and totals add the steps up."""
    metrics = [e for e in events if isinstance(e, Metric)]
    assert metrics, "no metric event"
    total_in = metrics[0].total.input - metrics[0].step.input
    total_out = metrics[0].total.output - metrics[0].step.output
    for metric in metrics:
        assert metric.step.input > 0
        assert metric.step.output > 0
        total_in += metric.step.input
        total_out += metric.step.output
        assert (metric.total.input, metric.total.output) == (total_in, total_out)


def check_seqs(client: GatewayClient) -> None:
    """The client saw every event once, in order: seqs follow the session frame's."""
    seqs = [e.seq for e in client.events]
    start = client.session.seq + 1
    assert seqs == list(range(start, start + len(seqs)))


@contextlib.asynccontextmanager
async def gateway_client(
    provider: str, workspace: Path, **knobs: Any
) -> AsyncIterator[GatewayClient]:
    """A client of a gateway whose ``provider`` upstream is a simulator of that flavour."""
    sim_config = SimConfig(flavor=provider, api_key=KEY, **knobs)  # type: ignore[arg-type]
    async with serve_sim(sim_config) as sim:
        settings = {
            "provider": provider,
            f"{provider}_base_url": sim.url,
            f"{provider}_api_key": KEY,
            "model": text_model(provider),
            "port": 0,
            "workspace_root": str(workspace / provider),
            "upstream_retries": 3,
        }
        async with running_gateway(load_config(settings, env={})) as gateway:
            client = await GatewayClient.connect(gateway.url)
            try:
                yield client
            finally:
                await client.close()


async def script(provider: str, workspace: Path, texts: list[str], **knobs: Any) -> list[Shape]:
    """Each text's turn as a shape, after the checks every run must pass."""
    shapes = []
    async with gateway_client(provider, workspace, **knobs) as client:
        for text in texts:
            shapes.append(shape(await client.turn(text)))
        check_usage(client.events)
        check_seqs(client)
    return shapes


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_plain_tool_and_malformed_turns(provider: str, tmp_path: Path) -> None:
    shapes = await script(provider, tmp_path, ["hi", TOOL, MALFORMED, "hi"], overrun=False)
    assert shapes[0] == HI
    assert shapes[1] == TOOL_TURN
    assert shapes[2] == [
        ("user", MALFORMED),
        ("think", "Calling."),
        ("error:malformed_execute", MALFORMED_ERROR),
        ("metric", ""),
        (
            "result",
            '[{"tool":"execute","status":"failure","content":'
            + msgspec_quote(MALFORMED_ERROR)
            + "}]",
        ),
        ("think", "The tool answered."),
        ("respond", "The tool returned failure."),
        ("end", ""),
        ("metric", ""),
    ]
    assert shapes[3] == HI  # the session goes on after the malformed block


async def test_providers_produce_identical_sequences(tmp_path: Path) -> None:
    texts = ["hi", TOOL, MALFORMED, '/tool read {"path": "missing.txt"}', "bye"]
    first, *others = [
        await script(provider, tmp_path, texts, overrun=False, chunk_size=3)
        for provider in PROVIDERS
    ]
    assert all(other == first for other in others)
    assert [turn[-1] for turn in first] == [("metric", "")] * len(texts)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_overrun_is_discarded(provider: str, tmp_path: Path) -> None:
    async with gateway_client(provider, tmp_path, overrun=True) as client:
        events = await client.turn(TOOL)
        answer = await client.turn("hi")
        check_seqs(client)
    without_metrics = [item for item in shape(events) if item[0] != "metric"]
    assert without_metrics == [item for item in TOOL_TURN if item[0] != "metric"]
    assert not any("hallucinated" in getattr(e, "content", "") for e in events)
    assert kind(events[-1]) == "metric"
    check_usage(events + answer)
    assert shape(answer) == HI


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_cancel_mid_stream_then_the_next_turn_works(provider: str, tmp_path: Path) -> None:
    async with gateway_client(provider, tmp_path, tokens_per_second=50, chunk_size=1) as client:
        await client.user("/raw " + "y" * 1000)
        await client.until_type("respond")
        await client.send({"type": "cancel"})
        cancelled = await client.until_type("cancelled")
        closing = await client.until_type("metric")
        after = await client.turn("/raw done<end>")
        check_seqs(client)
    seen = shape(client.events[: len(client.events) - len(after)])
    assert [name for name, _ in seen] == ["user", "respond", "cancelled", "metric"]
    assert set(seen[1][1]) == {"y"}
    assert seen[2] == ("cancelled", "cancelled by the user")
    assert kind(cancelled[-1]) == "cancelled"
    # The cancelled step's usage is counted: one metric, right after cancelled.
    assert closing == [closing[-1]]
    metric = closing[-1]
    assert isinstance(metric, Metric) and metric.step.output > 0
    assert metric.total == metric.step
    assert shape(after) == [
        ("user", "/raw done<end>"),
        ("respond", "done"),
        ("end", ""),
        ("metric", ""),
    ]
    check_usage(after)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_upstream_drop_mid_turn_is_interrupted_and_rerun(
    provider: str, tmp_path: Path
) -> None:
    # 13 chunks of 4 for "hi"; the second turn's 14 chunks cross 20 on the same
    # connection: the sim aborts it after 7 of them; the rerun's connection is fresh.
    shapes = await script(provider, tmp_path, ["hi", "hi again"], drop_after=20, chunk_size=4)
    assert shapes[0] == HI
    assert shapes[1] == [
        ("user", "hi again"),
        ("think", "The user said somethi"),
        ("interrupt", ""),
        ("think", "The user said something."),
        ("respond", "Echo: hi again"),
        ("end", ""),
        ("metric", ""),
    ]


@pytest.mark.parametrize("flavor", PROVIDERS)
async def test_the_builtin_simulator_speaks_either_wire(flavor: str, tmp_path: Path) -> None:
    """``provider = "sim"`` runs the simulator in-process; ``sim_flavor`` picks its wire,
    and with it the real adapter that drives it."""
    settings = {
        "provider": "sim",
        "sim_flavor": flavor,
        "port": 0,
        "workspace_root": str(tmp_path),
    }
    async with running_gateway(load_config(settings, env={})) as gateway:
        client = await GatewayClient.connect(gateway.url)
        try:
            assert shape(await client.turn("hi")) == HI
        finally:
            await client.close()


async def test_the_gemini_provider_needs_a_key(tmp_path: Path) -> None:
    settings = {"provider": "gemini", "port": 0, "workspace_root": str(tmp_path)}
    with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
        async with running_gateway(load_config(settings, env={})):
            pass


@pytest.mark.parametrize("overrun", [False, True])
async def test_a_tool_turn_gives_the_same_metrics_on_both_flavours(
    overrun: bool, tmp_path: Path
) -> None:
    counts = []
    for provider in PROVIDERS:
        async with gateway_client(provider, tmp_path, overrun=overrun) as client:
            events = await client.turn(TOOL)
            check_seqs(client)
        assert shape(events) == TOOL_TURN
        metrics = [e for e in events if isinstance(e, Metric)]
        check_usage(events)
        assert metrics[-1].total == Usage(
            input=sum(m.step.input for m in metrics), output=sum(m.step.output for m in metrics)
        )
        counts.append(len(metrics))
    assert counts == [2] * len(PROVIDERS)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_failed_turn_ends_with_error_end_and_metric(provider: str, tmp_path: Path) -> None:
    # Every connection is dropped after 3 deltas: the step is retried, then given up.
    async with gateway_client(provider, tmp_path, drop_after=3, chunk_size=1) as client:
        events = await client.turn("hi")
        check_seqs(client)
    names = [name for name, _ in shape(events)]
    assert names[-3:] == ["error:upstream", "end", "metric"]
    assert names.count("end") == 1 and names.count("metric") == 1
    metric = events[-1]
    assert isinstance(metric, Metric)
    # What the lost attempts wrote was billed: it is counted, as an estimate.
    assert metric.step.output > 0 and metric.estimated is True
