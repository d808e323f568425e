"""``conversation.item.retrieve`` through the door, with the real ``openai`` SDK: the
items a client was sent can be read back (the Agents SDK asks for them after a
transcription), and an unknown id is refused naming the client's event."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.openai_door.conftest import MODELS, SERVER_EVENT, RawClient
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("model", MODELS)
async def test_the_sdk_retrieves_the_items_of_a_turn(node: NodeProcess, model: str) -> None:
    client = AsyncOpenAI(
        api_key="unused",
        base_url=f"{node.http}/openai/v1",
        websocket_base_url=f"{node.base}/openai/v1",
    )
    async with client.realtime.connect(model=model) as conn:

        async def next_event() -> dict[str, Any]:
            event: dict[str, Any] = json.loads(await conn.recv_bytes())
            SERVER_EVENT.validate_python(event)  # the SDK's contract, or the test fails
            return event

        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hello"}],
            }
        )
        await conn.response.create()
        done: dict[str, dict[str, Any]] = {}
        while True:
            event = await next_event()
            assert event["type"] != "error", event
            if event["type"] in ("conversation.item.done", "response.output_item.done"):
                done[event["item"]["id"]] = event["item"]
            if event["type"] == "response.done":
                break
        user = next(i for i in done.values() if i.get("role") == "user")
        answer = next(i for i in done.values() if i.get("role") == "assistant")

        for item in (user, answer):
            await conn.conversation.item.retrieve(item_id=item["id"], event_id="c_get")
            got = await next_event()
            assert got["type"] == "conversation.item.retrieved", got
            assert got["item"] == item
        assert user["content"][0]["text"] == "hello"
        assert "hello" in answer["content"][0]["text"].lower()

        await conn.conversation.item.retrieve(item_id="item_nope", event_id="c_bad")
        refused = await next_event()
        assert refused["type"] == "error"
        assert refused["error"]["event_id"] == "c_bad"
        # OpenAI's words, which pipecat's retrieve waits for (param null, as the service's).
        assert refused["error"]["code"] == "item_retrieve_invalid_item_id"
        assert refused["error"]["message"].startswith(
            "Error retrieving item: the item with id 'item_nope' does not exist."
        )
        assert refused["error"]["param"] is None


@pytest.mark.parametrize("model", MODELS)
async def test_a_function_call_output_is_echoed_as_an_item(node: NodeProcess, model: str) -> None:
    """OpenAI's service answers a created item with ``conversation.item.added`` and
    ``done``; the door showed nothing for a ``function_call_output`` (LiveKit's plugin
    waits for ``added`` of every item it creates). Now it is shown once the session
    logs it, before the answer that reads it, and can be retrieved."""
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        await client.until("session.created")
        await client.send(
            type="session.update",
            session={"type": "realtime", "output_modalities": ["text"], "tools": [tool]},
        )
        await client.until("session.updated")
        await client.say('/tool lookup {"word": "door"}')
        called = await client.until("response.done")
        call = called[-1]["response"]["output"][-1]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ajar"}
        await client.send(type="conversation.item.create", item=output)
        answer = await client.until("response.done")
        kinds = [e["type"] for e in answer]
        added = next(e for e in answer if e["type"] == "conversation.item.added")
        item = added["item"]
        assert (item["type"], item["call_id"], item["output"]) == (
            "function_call_output",
            call["call_id"],
            "ajar",
        )
        assert added["previous_item_id"] == call["id"]
        assert kinds.index("conversation.item.done") < kinds.index("response.created")
        await client.send(type="conversation.item.retrieve", item_id=item["id"])
        retrieved = (await client.until("conversation.item.retrieved"))[-1]
        assert retrieved["item"]["output"] == "ajar"
    finally:
        await client.close()
