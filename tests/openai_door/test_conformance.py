"""Every server event the OpenAI door emits validates against the ``openai`` SDK's
``RealtimeServerEvent`` union (pydantic), and the door's refusals, auth and resume
behave as a client of OpenAI's service expects."""

from __future__ import annotations

import contextlib
import datetime
import json
from collections import Counter

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.edge.closes import CloseCode
from gateway.upstream import providers
from tests.openai_door.conftest import MODELS, RawClient
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(60)

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


@pytest.mark.parametrize("model", MODELS)
async def test_every_server_event_validates_and_ids_are_unique(
    node: NodeProcess, model: str
) -> None:
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        await client.send(
            type="session.update",
            event_id="c_1",
            session={
                "type": "realtime",
                "instructions": "Be brief.",
                "tools": [TOOL],
                "output_modalities": ["text"],  # OpenAI's default is audio
            },
        )
        created = await client.until("session.updated")
        assert created[0]["type"] == "session.created"
        assert created[-1]["session"]["tools"][0]["name"] == "lookup"

        await client.say("hello there")
        await client.until("response.done")

        await client.say('/tool lookup {"word": "gateway"}')
        got = await client.until("response.function_call_arguments.done")
        call = got[-1]
        assert json.loads(call["arguments"]) == {"word": "gateway"}
        done = await client.until("response.done")
        assert done[-1]["response"]["output"][-1]["type"] == "function_call"
        await client.send(
            type="conversation.item.create",
            item={"type": "function_call_output", "call_id": call["call_id"], "output": "a door"},
        )
        await client.send(type="response.create")
        after = await client.until("response.done")
        assert any(e["type"] == "response.output_text.delta" for e in after)
        assert after[-1]["response"]["usage"]["total_tokens"] > 0

        # Refusals are OpenAI's error events, naming the client's event_id.
        await client.send(type="conversation.item.delete", event_id="c_2", item_id="x")
        error = (await client.until("error"))[-1]
        assert error["error"]["event_id"] == "c_2"
        assert error["error"]["code"] == "item_delete_invalid_item_id"
        # A command the session refuses names the client's event too.
        await client.send(type="input_audio_buffer.commit", event_id="c_5")
        error = (await client.until("error"))[-1]
        assert error["error"]["event_id"] == "c_5"
        await client.send(type="no.such.event", event_id="c_3")
        error = (await client.until("error"))[-1]
        assert error["error"]["event_id"] == "c_3" and error["error"]["param"] == "type"
        await client.send(type="response.create", event_id="c_4", response={"conversation": "none"})
        error = (await client.until("error"))[-1]
        assert error["error"]["event_id"] == "c_4" and "conversation" in error["error"]["message"]
    finally:
        await client.close()
    kinds = Counter(e["type"] for e in client.events)
    assert kinds["response.created"] == kinds["response.done"] == 3
    ids = [e["event_id"] for e in client.events]
    assert len(ids) == len(set(ids))


async def test_an_unknown_model_is_refused_before_the_socket_opens(node: NodeProcess) -> None:
    with pytest.raises(InvalidStatus) as info:
        await RawClient.open(f"{node.base}/openai/v1/realtime?model=gpt-nope")
    response = info.value.response
    assert response.status_code == 400
    body = json.loads(response.body)
    assert body["error"]["code"] == "model_not_found"
    assert "gpt-realtime-2.1" in body["error"]["message"]


async def test_a_reconnect_with_the_last_event_id_gets_the_rest_once(node: NodeProcess) -> None:
    model = MODELS[0]
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        created = await client.next()
        sid = created["session"]["id"]
        await client.text_session()
        await client.say("remember this")
        events = await client.until("response.done")
    finally:
        await client.close()
    # Cut in the middle of the answer: the rest comes, in order, and nothing twice.
    middle = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    last_seen = events[middle]["event_id"]
    resumed = await RawClient.open(
        f"{node.base}/openai/v1/realtime?model={model}&session_id={sid}&after_event={last_seen}"
    )
    try:
        rest = await resumed.until("response.done")
        assert [e["event_id"] for e in rest] == [e["event_id"] for e in events[middle + 1 :]]
        assert rest == events[middle + 1 :]
        await resumed.say("and now?")
        again = await resumed.until("response.done")
        assert again[-1]["response"]["status"] == "completed"
    finally:
        await resumed.close()


async def test_a_gateway_tool_runs_in_the_gateway_unseen_by_the_client(node: NodeProcess) -> None:
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={MODELS[0]}")
    try:
        await client.next()  # session.created
        await client.text_session()
        await client.say('/tool list {"path": "."}')  # a built-in tool of the gateway's
        events = await client.until("response.done")
    finally:
        await client.close()
    kinds = {e["type"] for e in events}
    assert not any("function_call" in kind for kind in kinds)  # never the client's to answer
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert "success" in text  # the model answered with the tool's result
    assert events[-1]["response"]["status"] == "completed"


async def test_a_flood_of_events_is_refused_then_closed(node: NodeProcess) -> None:
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={MODELS[0]}")
    for n in range(2000):
        await client.send(type="no.such.event", event_id=f"f{n}")
    codes: list[str] = []
    with pytest.raises(ConnectionClosed):
        while True:
            event = await client.next(timeout=20)
            if event["type"] == "error":
                codes.append(event["error"]["code"])
    assert "rate_limit_exceeded" in codes
    assert client.ws.close_code == CloseCode.RATE_LIMITED
    assert len(codes) < 1000  # events over the limit are dropped unread, not answered


async def test_a_flood_of_appends_is_refused_then_closed(node: NodeProcess) -> None:
    """Found from outside on the native door, and the same here: appends were not counted
    at all, so tens of thousands a second (each decoded) took a core. They count against
    an audio limit of their own (500 a second, bursts of 1,000; a microphone sends 50)."""
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={MODELS[0]}")
    frame = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"})
    with contextlib.suppress(ConnectionClosed):
        for _ in range(6000):
            await client.ws.send(frame)
    codes: list[str] = []
    with pytest.raises(ConnectionClosed):
        while True:
            event = await client.next(timeout=20)
            if event["type"] == "error":
                codes.append(event["error"]["code"])
                assert "input_audio_buffer.append" in event["error"]["message"]
    assert codes == ["rate_limit_exceeded"]
    assert client.ws.close_code == CloseCode.RATE_LIMITED


def test_a_model_is_served_until_its_shutdown_day() -> None:
    """A deprecated model (its shutdown announced, still ahead) is served, as its provider
    still serves it; from its shutdown day on it is not."""
    row = providers.by_name("openai")
    dated = next(m for m in row.models if m.shutdown)
    day = datetime.date.fromisoformat(dated.shutdown)
    assert dated.name in row.served(day - datetime.timedelta(days=1))
    assert dated.name not in row.served(day)


async def test_a_deprecated_model_opens_through_the_door(node: NodeProcess) -> None:
    """LiveKit's plugin and pipecat default to ``gpt-realtime`` (shutdown announced for
    2027-01-20): the door served none of them, and the plugin saw only an HTTP 400."""
    today = datetime.date.today()
    deprecated = [
        m.name
        for row in providers.PROVIDERS
        for m in row.models
        if m.shutdown and not m.shut_down_by(today)
    ]
    if not deprecated:
        pytest.skip("no model of the table is deprecated and still served today")
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={deprecated[0]}")
    try:
        created = await client.until("session.created")
        assert created[-1]["session"]["model"] == deprecated[0]
        await client.say("hello")
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "completed"
    finally:
        await client.close()
