"""``conversation.item.delete`` through the door, with the real ``openai`` SDK: the
deleted message leaves the model's context (the simulator counts what its connection
holds: ``/context``), on either provider's simulator flavour; an unknown id is
refused as OpenAI's service refuses it; a resumed client is sent the deletion again;
the Agents SDK takes the deletion out of its session's history."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model_inputs import RealtimeModelSendRawMessage
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from tests.openai_door.conftest import MODELS, SERVER_EVENT, RawClient, sdk_client
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(90)


def _client(node: NodeProcess) -> AsyncOpenAI:
    return sdk_client(node)


async def _next(conn: AsyncRealtimeConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(await conn.recv_bytes())
    SERVER_EVENT.validate_python(event)  # the SDK's contract, or the test fails
    return event


async def _turn(conn: AsyncRealtimeConnection, text: str) -> tuple[list[dict[str, Any]], str]:
    """A typed turn: its events (to ``response.done``) and the answer's text."""
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create()
    events: list[dict[str, Any]] = []
    while True:
        event = await _next(conn)
        assert event["type"] != "error", event
        events.append(event)
        if event["type"] == "response.done":
            text_done = [e["text"] for e in events if e["type"] == "response.output_text.done"]
            return events, "".join(text_done)


def _held(answer: str) -> int:
    found = re.search(r"Context: (\d+) items", answer)
    assert found, answer
    return int(found.group(1))


async def _context_after(node: NodeProcess, model: str, delete: str | None) -> int:
    """What the model holds at a ``/context`` probe after a turn, its ``delete`` item
    (``user``/``assistant``) deleted first, or none."""
    async with _client(node).realtime.connect(model=model) as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        events, _ = await _turn(conn, "remember the apples")
        items = {
            e["item"]["role"]: e["item"]["id"]
            for e in events
            if e["type"] == "conversation.item.done" and e["item"]["type"] == "message"
        }
        if delete is not None:
            await conn.conversation.item.delete(item_id=items[delete], event_id="c_del")
            deleted = await _next(conn)
            while deleted["type"] == "session.updated":
                deleted = await _next(conn)
            assert deleted["type"] == "conversation.item.deleted", deleted
            assert deleted["item_id"] == items[delete]
            # The deleted item is gone from the conversation the client can read.
            await conn.conversation.item.retrieve(item_id=items[delete], event_id="c_get")
            gone = await _next(conn)
            assert gone["type"] == "error" and gone["error"]["event_id"] == "c_get"
        _, answer = await _turn(conn, "/context")
        return _held(answer)


@pytest.mark.parametrize("model", MODELS)
async def test_a_deleted_message_leaves_the_models_context(node: NodeProcess, model: str) -> None:
    kept = await _context_after(node, model, None)
    assert await _context_after(node, model, "user") == kept - 1
    assert await _context_after(node, model, "assistant") == kept - 1


async def test_a_system_item_deleted_as_soon_as_created_leaves_the_models_context(
    node: NodeProcess,
) -> None:
    """A system item goes to the session at once; deleted in the same breath, it may not
    be logged yet. Either way the client is told it is deleted, and the model loses it."""
    model = MODELS[0]
    kept = await _context_after(node, model, None)
    async with _client(node).realtime.connect(model=model) as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await _turn(conn, "remember the apples")
        system = [{"type": "input_text", "text": "Speak like a pirate."}]
        item = {"type": "message", "role": "system", "content": system, "id": "sys_1"}
        await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
        await conn.conversation.item.delete(item_id="sys_1", event_id="c_del")
        while (event := await _next(conn))["type"] != "conversation.item.deleted":
            assert event["type"] != "error", event
        assert event["item_id"] == "sys_1"
        _, answer = await _turn(conn, "/context")
        assert _held(answer) == kept


@pytest.mark.parametrize("model", MODELS)
async def test_an_unknown_item_is_refused_naming_the_clients_event(
    node: NodeProcess, model: str
) -> None:
    async with _client(node).realtime.connect(model=model) as conn:
        await conn.conversation.item.delete(item_id="item_nope", event_id="c_bad")
        refused = await _next(conn)
        while refused["type"] != "error":
            refused = await _next(conn)
        error = refused["error"]
        assert error["type"] == "invalid_request_error"
        assert error["event_id"] == "c_bad" and error["code"] == "item_delete_invalid_item_id"
        assert "item_nope" in error["message"]


async def test_a_resumed_client_is_sent_the_deletion(node: NodeProcess) -> None:
    model = MODELS[0]
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        await client.say("hello")
        events = await client.until("response.done")
        sid = next(e for e in client.events if e["type"] == "session.created")["session"]["id"]
        user = next(e["item"]["id"] for e in events if e["type"] == "conversation.item.done")
        await client.send(type="conversation.item.delete", item_id=user)
        deleted = (await client.until("conversation.item.deleted"))[-1]
        last_seen = events[-1]["event_id"]
    finally:
        await client.close()
    resumed = await RawClient.open(
        f"{node.base}/openai/v1/realtime?model={model}&session_id={sid}&after_event={last_seen}"
    )
    try:
        assert await resumed.next() == deleted
        await resumed.send(type="conversation.item.delete", item_id=user, event_id="c_again")
        error = (await resumed.until("error"))[-1]["error"]
        assert error["event_id"] == "c_again"
        assert error["code"] == "item_delete_invalid_item_id"
    finally:
        await resumed.close()


@pytest.mark.parametrize("model", MODELS)
async def test_the_agents_sdk_history_loses_a_deleted_item(
    node: NodeProcess, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings: Any = {
        "model_name": model,
        "output_modalities": ["text"],
        "turn_detection": {"type": "server_vad"},
    }
    runner = RealtimeRunner(RealtimeAgent(name="a"), config={"model_settings": settings})
    session = await runner.run(
        model_config={"url": f"{node.base}/openai/v1/realtime?model={model}", "api_key": "unused"}
    )

    history: list[Any] = []  # as the session's newest history_updated showed it

    async def until(done: Any) -> Any:
        async for event in session:
            assert event.type != "error", event
            if event.type == "history_updated":
                history[:] = event.history
            if done(event):
                return event
        raise AssertionError("the session ended")

    async with session:
        await session.send_message("remember the apples")
        await asyncio.wait_for(until(lambda e: e.type == "agent_end"), 30)
        user = next(i for i in history if getattr(i, "role", "") == "user")
        delete = {"type": "conversation.item.delete", "other_data": {"item_id": user.item_id}}
        await session.model.send_event(RealtimeModelSendRawMessage(message=delete))  # type: ignore[arg-type]
        updated = await asyncio.wait_for(
            until(
                lambda e: (
                    e.type == "history_updated"
                    and all(i.item_id != user.item_id for i in e.history)
                )
            ),
            30,
        )
    assert any(getattr(i, "role", "") == "assistant" for i in updated.history)
    refused = [r.getMessage() for r in caplog.records if "validate" in r.getMessage()]
    assert refused == []
