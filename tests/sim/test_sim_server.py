"""The simulator's wire behaviour, seen by a raw WebSocket client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from gateway.sim.model import Sim, SimConfig
from gateway.sim.server import serve_sim
from tests.upstream.helpers import STEP_TIMEOUT


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    async with serve_sim(SimConfig(chunk_size=8)) as running:
        yield running


@pytest.fixture
async def ws(sim: Sim) -> AsyncIterator[ClientConnection]:
    async with connect(f"{sim.url}/realtime?model=m1", compression=None) as client:
        first = await receive(client)
        assert first["type"] == "session.created"
        assert first["session"]["model"] == "m1"
        yield client


async def receive(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(STEP_TIMEOUT):
        event: dict[str, Any] = json.loads(await ws.recv())
    return event


async def send(ws: ClientConnection, event: dict[str, Any]) -> None:
    await ws.send(json.dumps(event))


async def until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    """Every event up to and including the first of type ``kind``."""
    events = []
    while True:
        event = await receive(ws)
        events.append(event)
        if event["type"] == kind:
            return events


def user(text: str, **extra: Any) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item, **extra}


async def test_bad_frames_get_errors_and_the_connection_stays(ws: ClientConnection) -> None:
    await ws.send("{not json")
    error = await receive(ws)
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["code"] == "invalid_json"

    await send(ws, {"type": "output_audio_buffer.clear", "event_id": "c1"})
    error = await receive(ws)
    assert error["error"]["param"] == "type"
    assert error["error"]["event_id"] == "c1"

    await send(ws, {"type": "conversation.item.create", "event_id": "c2"})
    error = await receive(ws)
    assert error["error"]["event_id"] == "c2"
    assert "item" in error["error"]["message"]

    await ws.send(b"[1, 2]")  # a binary frame, and not an object
    assert (await receive(ws))["type"] == "error"

    assistant_with_input_text = {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "input_text", "text": "x"}],
        },
    }
    await send(ws, assistant_with_input_text)
    error = await receive(ws)
    assert error["error"]["param"] == "item.content[0].type"

    await send(ws, {"type": "session.update", "session": {"type": "realtime", "instructions": "i"}})
    updated = await receive(ws)
    assert updated["type"] == "session.updated"
    assert updated["session"]["instructions"] == "i"


async def test_response_event_sequence(sim: Sim, ws: ClientConnection) -> None:
    await send(ws, user("hello"))
    added = await receive(ws)
    done = await receive(ws)
    assert [added["type"], done["type"]] == ["conversation.item.added", "conversation.item.done"]
    assert added["item"]["role"] == "user"
    await send(ws, {"type": "response.create"})
    events = await until(ws, "response.done")
    types = [e["type"] for e in events]
    deltas = types.count("response.output_text.delta")
    assert types == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    text = "<think>The user said something.</think>Echo: hello<end>"
    assert "".join(e["delta"] for e in events if "delta" in e) == text
    assert deltas == -(-len(text) // 8)
    response = events[-1]["response"]
    assert response["status"] == "completed"
    assert response["output"][0]["content"] == [{"type": "output_text", "text": text}]
    assert response["usage"]["output_tokens"] == deltas
    assert response["usage"]["total_tokens"] == deltas + response["usage"]["input_tokens"]
    assert (await receive(ws))["type"] == "rate_limits.updated"
    [conversation] = sim.conversations()
    assert conversation.messages() == [("user", "hello"), ("assistant", text)]


async def test_items_insert_delete_and_errors(sim: Sim, ws: ClientConnection) -> None:
    await send(ws, user("b", event_id="c1"))
    b = (await until(ws, "conversation.item.done"))[0]["item"]["id"]
    await send(ws, user("a", previous_item_id="root"))
    assert (await until(ws, "conversation.item.done"))[0]["previous_item_id"] is None
    await send(ws, {**user("c"), "item": {**user("c")["item"], "id": "mine"}})
    assert (await until(ws, "conversation.item.done"))[0]["previous_item_id"] == b
    await send(ws, {**user("dup"), "item": {**user("dup")["item"], "id": "mine"}})
    assert (await receive(ws))["error"]["code"] == "item_already_exists"
    await send(ws, user("x", previous_item_id="nope"))
    assert (await receive(ws))["error"]["code"] == "item_not_found"
    [conversation] = sim.conversations()
    assert conversation.messages() == [("user", "a"), ("user", "b"), ("user", "c")]

    await send(ws, {"type": "conversation.item.delete", "item_id": b})
    deleted = await receive(ws)
    assert deleted["type"] == "conversation.item.deleted"
    assert deleted["item_id"] == b
    assert deleted["event_id"]
    await send(ws, {"type": "conversation.item.delete", "item_id": b, "event_id": "c9"})
    error = await receive(ws)
    assert error["error"]["code"] == "item_delete_invalid_item_id"
    assert (
        error["error"]["message"] == f"Error deleting item: the item with id {b!r} does not exist."
    )
    assert error["error"]["event_id"] == "c9"
    [conversation] = sim.conversations()
    assert conversation.messages() == [("user", "a"), ("user", "c")]


async def test_cancel_and_active_response_errors() -> None:
    async with (
        serve_sim(SimConfig(tokens_per_second=50, chunk_size=1)) as sim,
        connect(f"{sim.url}/realtime", compression=None) as ws,
    ):
        await until(ws, "session.created")
        await send(ws, {"type": "response.cancel", "event_id": "c0"})
        error = await receive(ws)
        assert error["error"]["code"] == "response_cancel_not_active"
        assert error["error"]["event_id"] == "c0"

        await send(ws, user("/raw " + "y" * 1000))
        await until(ws, "conversation.item.done")
        await send(ws, {"type": "response.create"})
        events = await until(ws, "response.output_text.delta")
        await send(ws, {"type": "response.create", "event_id": "c1"})
        events += await until(ws, "error")
        assert events[-1]["error"]["code"] == "conversation_already_has_active_response"
        assert events[-1]["error"]["event_id"] == "c1"

        await send(ws, {"type": "response.cancel"})
        events += await until(ws, "response.done")
        response = events[-1]["response"]
        assert response["status"] == "cancelled"
        assert response["status_details"]["reason"] == "client_cancelled"
        sent = "".join(e.get("delta", "") for e in events)
        assert 0 < len(sent) < 1000
        text_done = next(e for e in events if e["type"] == "response.output_text.done")
        assert text_done["text"] == sent
        assert response["output"][0]["content"][0]["text"] == sent
        assert response["output"][0]["status"] == "incomplete"


async def test_cancel_during_first_token_delay() -> None:
    async with (
        serve_sim(SimConfig(first_token_delay=30)) as sim,
        connect(f"{sim.url}/realtime", compression=None) as ws,
    ):
        await until(ws, "session.created")
        await send(ws, user("hi"))
        await send(ws, {"type": "response.create"})
        await until(ws, "response.content_part.added")
        await send(ws, {"type": "response.cancel"})
        events = await until(ws, "response.done")
    assert not any(e["type"] == "response.output_text.delta" for e in events)
    assert events[-1]["response"]["status"] == "cancelled"
    assert events[-1]["response"]["usage"]["output_tokens"] == 0


async def test_only_the_realtime_path_is_served(sim: Sim) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with connect(f"ws://127.0.0.1:{sim.port}/other"):
            pass
    assert info.value.response.status_code == 404


async def test_api_key_rejection_is_http_401() -> None:
    async with serve_sim(SimConfig(api_key="k")) as sim:
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"{sim.url}/realtime"):
                pass
        assert info.value.response.status_code == 401
        assert b"invalid_api_key" in info.value.response.body
        headers = {"Authorization": "Bearer k"}
        async with connect(f"{sim.url}/realtime", additional_headers=headers) as ws:
            assert (await receive(ws))["type"] == "session.created"


async def test_conversations_are_per_connection(sim: Sim) -> None:
    async with (
        connect(f"{sim.url}/realtime") as one,
        connect(f"{sim.url}/realtime") as two,
    ):
        await send(one, user("one"))
        await send(two, user("two"))
        await until(one, "conversation.item.done")
        await until(two, "conversation.item.done")
        assert sorted(c.messages()[0][1] for c in sim.conversations()) == ["one", "two"]
        assert sim.stats.connections == 2
