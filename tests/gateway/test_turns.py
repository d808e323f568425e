"""Turns through a running gateway, on both stores: what a client sees."""

from __future__ import annotations

import asyncio
import contextlib

import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from gateway.edge.server import Gateway
from protocol.events import (
    Call,
    Cancelled,
    End,
    Error,
    Execute,
    Metric,
    Replying,
    Respond,
    Result,
    Think,
    User,
    decode_event,
)
from tests.conftest import LoggedTracebacks
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient, text_of


def assert_contiguous(client: GatewayClient, start: int = 1) -> None:
    seqs = [e.seq for e in client.events if not isinstance(e, Error) or e.code not in _REPLIES]
    assert seqs == list(range(start, start + len(seqs))), seqs


_REPLIES = {"bad_frame", "unknown_type", "turn_active", "no_turn"}


async def test_a_plain_turn_streams_think_then_response(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    assert client.session.seq == 0 and not client.session.resumed
    events = await client.turn("hello there")
    assert isinstance(events[0], User) and events[0].content == "hello there"
    assert text_of(events, "think") == "The user said something."
    assert text_of(events, "respond") == "Echo: hello there"
    # Token mode: the response arrives in several chunks, not one.
    assert sum(isinstance(e, Respond) for e in events) > 1
    kinds = [type(e) for e in events]
    assert kinds.index(End) < kinds.index(Metric)
    metric = events[-1]
    assert isinstance(metric, Metric) and metric.step.output > 0 and metric.total == metric.step
    assert all(e.timestamp > 0 for e in events)
    assert_contiguous(client)
    await client.close()


async def test_a_reply_is_a_turn_the_model_starts_on_the_conversation_as_it_is(
    gateway: Gateway,
) -> None:
    """``{"type": "reply"}``: no new user message (a greeting, a follow-up); the model
    answers what it has. Logged as ``reply``, naming the command; a turn like any."""
    client = await GatewayClient.connect(gateway.url)
    await client.turn("hello there")
    await client.send({"type": "reply", "id": "r-1"})
    events = await client.until_type("metric")
    assert isinstance(events[0], Replying) and events[0].reply_to == "r-1"
    assert not [e for e in events if isinstance(e, User)]  # no new message
    assert text_of(events, "respond")  # the model answered the conversation
    assert isinstance(events[-2], End)
    assert_contiguous(client)
    await client.close()


async def test_a_tool_call_runs_and_the_model_continues(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    args = {"path": "notes/a.txt", "content": "written by a tool"}
    events = await client.turn("/tool write " + orjson.dumps(args).decode())
    calls = [e for e in events if isinstance(e, Call)]
    assert [orjson.loads(c.content) for c in calls] == [{"name": "write", "args": args}]
    kinds = [type(e) for e in events]
    # call → execute → (step metric) → result → the model's answer → end
    assert kinds.index(Call) < kinds.index(Execute) < kinds.index(Result) < kinds.index(End)
    result = next(e for e in events if isinstance(e, Result))
    assert result.payload.success_count == 1 and result.payload.failure_count == 0
    assert orjson.loads(result.content)[0]["status"] == "success"
    # The overrun the simulator writes after </execute> never reaches the client.
    assert "hallucinated" not in text_of(events, "respond")
    assert text_of(events, "respond") == "The tool returned success."
    written = gateway.node.workspaces.workspace(client.sid) / "notes" / "a.txt"
    assert written.read_text() == "written by a tool"
    # Two model steps, two metrics; totals add up.
    metrics = [e for e in events if isinstance(e, Metric)]
    assert len(metrics) == 2
    assert metrics[1].total.output == metrics[0].step.output + metrics[1].step.output
    assert_contiguous(client)
    await client.close()


async def test_a_failing_tool_is_reported_and_the_turn_finishes(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    events = await client.turn('/tool read {"path": "missing.txt"}')
    result = next(e for e in events if isinstance(e, Result))
    item = orjson.loads(result.content)[0]
    assert item["status"] == "failure" and "missing.txt" in item["content"]
    assert text_of(events, "respond") == "The tool returned failure."
    await client.close()


async def test_malformed_execute_from_the_model_gives_an_error_and_the_session_continues(
    gateway: Gateway,
) -> None:
    client = await GatewayClient.connect(gateway.url)
    events = await client.turn("/raw <execute>[{not json</execute> ignored overrun")
    errors = [e for e in events if isinstance(e, Error)]
    assert [e.code for e in errors] == ["malformed_execute"]
    assert not any(isinstance(e, Call) for e in events)
    # The model is told through a failure result and answers; the turn ends normally.
    result = next(e for e in events if isinstance(e, Result))
    assert orjson.loads(result.content)[0]["status"] == "failure"
    assert text_of(events, "respond") == "The tool returned failure."
    after = await client.turn("still there?")
    assert text_of(after, "respond") == "Echo: still there?"
    assert_contiguous(client)
    await client.close()


async def test_bad_client_frames_get_errors_and_the_connection_stays(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    bad: list[tuple[str | bytes, str]] = [
        (b"\x00\x01binary", "bad_frame"),
        ("{not json", "bad_frame"),
        ('{"type": "launch"}', "unknown_type"),
        ('{"type": "user"}', "bad_frame"),
        ('{"type": "user", "content": ["x"]}', "bad_frame"),
        ('{"type": "cancel"}', "no_turn"),
    ]
    for frame, code in bad:
        await client.send(frame)
        reply = await client.next()
        assert isinstance(reply, Error) and reply.code == code, reply
        # Replies are not logged: they carry the last logged seq, not a new one.
        assert reply.seq == 0
    events = await client.turn("works")
    assert text_of(events, "respond") == "Echo: works"
    assert events[0].seq == 1
    await client.close()


async def test_an_oversize_frame_closes_with_1009(gateway_factory: GatewayFactory) -> None:
    async with gateway_factory(max_frame=4096) as gw:
        client = await GatewayClient.connect(gw.url)
        await client.send({"type": "user", "content": "x" * 10_000})
        with contextlib.suppress(ConnectionClosed):
            await client.next()
        assert client.ws.close_code == 1009


async def test_a_second_message_during_a_turn_is_refused(gateway_factory: GatewayFactory) -> None:
    async with gateway_factory(sim_tokens_per_second=50.0) as gw:
        client = await GatewayClient.connect(gw.url)
        await client.user("first")
        await client.until(lambda e: isinstance(e, Think))
        await client.user("second")
        events = await client.until(lambda e: isinstance(e, Error) and e.code == "turn_active")
        assert "cancel" in events[-1].content
        events = await client.until_type("end")
        assert text_of(client.events, "respond") == "Echo: first"
        await client.close()


async def test_cancel_mid_stream_then_a_new_turn(gateway_factory: GatewayFactory) -> None:
    async with gateway_factory(sim_tokens_per_second=40.0) as gw:
        client = await GatewayClient.connect(gw.url)
        await client.user("a long message that takes a while to echo back")
        await client.until(lambda e: isinstance(e, Respond))
        await client.send({"type": "cancel"})
        events = await client.until(lambda e: isinstance(e, Cancelled))
        assert not any(isinstance(e, End) for e in events)
        partial = text_of(client.events, "respond")
        assert partial and len(partial) < len(
            "Echo: a long message that takes a while to echo back"
        )
        # The next turn works, and the model's context holds the cancellation.
        events = await client.turn("again")
        assert text_of(events, "respond") == "Echo: again"
        assert_contiguous(client)
        await client.close()


async def test_resume_replays_after_seq_then_goes_live(gateway: Gateway) -> None:
    first = await GatewayClient.connect(gateway.url)
    await first.turn("one")
    seen = first.events[:5]
    cut = seen[-1].seq
    await first.close()

    again = await GatewayClient.connect(gateway.url, session_id=first.sid, after=cut)
    assert again.session.resumed and again.session.session_id == first.sid
    assert again.session.seq == first.last_seq
    replay = await again.until_type("metric")
    assert [e.seq for e in replay] == list(range(cut + 1, first.last_seq + 1))
    assert [decode_event(_enc(e)) for e in replay] == first.events[5:]
    live = await again.turn("two")
    assert live[0].seq == first.last_seq + 1
    assert text_of(live, "respond") == "Echo: two"
    await again.close()


def _enc(event: object) -> bytes:
    from protocol.events import encode

    return encode(event)  # type: ignore[arg-type]


async def test_the_log_holds_exactly_what_the_client_received(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    await client.turn('/tool list {"path": "."}')
    entries = await gateway.node.store.read_log(client.sid, 0, 10_000)
    assert [e.seq for e in entries] == [e.seq for e in client.events]
    assert [decode_event(e.data) for e in entries] == client.events
    await client.close()


async def test_without_end_marker_the_turn_still_ends_before_its_metric(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    events = await client.turn("/raw <think>short</think>An answer with no end marker")
    assert text_of(events, "respond") == "An answer with no end marker"
    assert [type(e) for e in events[-2:]] == [End, Metric]
    await client.close()


async def test_a_message_sent_on_end_is_queued_not_refused(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(sim_tokens_per_second=50.0) as gw:
        client = await GatewayClient.connect(gw.url)
        # The model keeps writing after <end> (discarded), so its response, and
        # the turn's usage report, come ~0.5 s after the end event.
        await client.user("/raw Done.<end>" + " trailing text the parser discards" * 2)
        await client.until(lambda e: isinstance(e, End))
        await client.user("second")
        events = await client.until(lambda e: isinstance(e, End))
        assert not any(isinstance(e, Error) for e in events)
        users = [e.content for e in client.events if isinstance(e, User)]
        assert users[1] == "second"
        # The first turn's metric comes before the second turn's user event.
        kinds = [type(e) for e in client.events]
        assert kinds.index(Metric) < kinds.index(User, 1)
        assert text_of(events, "respond") == "Echo: second"
        assert_contiguous(client)
        await client.close()


@pytest.mark.logs_traceback
async def test_a_writer_that_breaks_closes_with_1011_and_the_session_resumes(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, logged_tracebacks: LoggedTracebacks
) -> None:
    """A bug in sending to a client is not a normal close: the client is told to
    reconnect (1011 with its ``after``), the node logs the traceback, and the
    session goes on for the client that comes back."""
    from gateway.edge.connection import ClientConnection

    first = await GatewayClient.connect(gateway.url)
    await first.turn("hello there")
    working = ClientConnection._catch_up

    async def catch_up(self: ClientConnection) -> None:
        raise RuntimeError("a bug in the writer")

    monkeypatch.setattr(ClientConnection, "_catch_up", catch_up)  # a resume replays first
    second = await GatewayClient.connect(gateway.url, session_id=first.sid, after=1)
    with contextlib.suppress(ConnectionClosed):
        async with asyncio.timeout(10):
            while True:
                await second.next()
    assert second.ws.close_code == 1011
    assert "reconnect" in (second.ws.close_reason or "")
    assert any("a bug in the writer" in str(r.exc_info) for r in logged_tracebacks.records)
    monkeypatch.setattr(ClientConnection, "_catch_up", working)
    seen = first.events[-1].seq
    third = await GatewayClient.connect(gateway.url, session_id=first.sid, after=seen)
    events = await third.turn("again")
    assert text_of(events, "respond") == "Echo: again"
    await first.close()
    await third.close()
