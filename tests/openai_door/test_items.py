"""``conversation.item.retrieve`` through the door, with the real ``openai`` SDK: the
items a client was sent can be read back (the Agents SDK asks for them after a
transcription), and an unknown id is refused naming the client's event."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.edge.openai_door import OUTPUT_GRACE
from gateway.sim.model import GREETING
from tests.openai_door.conftest import MODELS, SERVER_EVENT, RawClient, sdk_client, sdk_until
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("model", MODELS)
async def test_the_sdk_retrieves_the_items_of_a_turn(node: NodeProcess, model: str) -> None:
    client = sdk_client(node)
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


@pytest.mark.parametrize("named", [None, "out_7"], ids=["unnamed", "named"])
@pytest.mark.parametrize("model", MODELS)
async def test_a_function_call_output_is_echoed_as_an_item(
    node: NodeProcess, model: str, named: str | None
) -> None:
    """OpenAI's service answers a created item with ``conversation.item.added`` and
    ``done``; the door showed nothing for a ``function_call_output`` (LiveKit's plugin
    waits for ``added`` of every item it creates, by the id it gave). Now it is shown,
    under the client's id if it gave one, when created, and can be retrieved. Its answer
    waits for the client's response.create (OpenAI answers an output only when asked), so
    that create's response is the answer, with its metadata: LiveKit's generate_reply
    waits for the response.created naming its create, and the door had started the
    answer by itself before the create came (generate_reply timed out after 10 s and
    the plugin discarded the answer)."""
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
        await client.send(
            type="conversation.item.create", item=output | ({"id": named} if named else {})
        )
        shown = await client.until("conversation.item.done")
        added = next(e for e in shown if e["type"] == "conversation.item.added")
        item = added["item"]
        assert (item["type"], item["call_id"], item["output"]) == (
            "function_call_output",
            call["call_id"],
            "ajar",
        )
        assert added["previous_item_id"] == call["id"]
        assert named is None or item["id"] == named
        await client.send(type="conversation.item.retrieve", item_id=item["id"])
        retrieved = await client.until("conversation.item.retrieved")
        assert retrieved[-1]["item"]["output"] == "ajar"
        assert not [e for e in retrieved if e["type"].startswith("response.")]  # not asked yet
        await client.send(type="response.create", response={"metadata": {"asked": "1"}})
        answer = await client.until("response.done")
        started = next(e for e in answer if e["type"] == "response.created")
        assert started["response"]["metadata"] == {"asked": "1"}
        assert "returned" in json.dumps(answer[-1]["response"]["output"])  # the output's answer
    finally:
        await client.close()


async def test_a_function_call_output_no_create_asks_for_is_answered_after_the_grace(
    node: NodeProcess,
) -> None:
    """A client that never sends response.create after its output (pipecat's
    run_llm=False) still gets the turn's answer, as before, once the door's grace
    (``OUTPUT_GRACE``) is over, with no error."""
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={MODELS[0]}")
    try:
        await client.until("session.created")
        await client.send(
            type="session.update",
            session={"type": "realtime", "output_modalities": ["text"], "tools": [tool]},
        )
        await client.until("session.updated")
        await client.say('/tool lookup {"word": "door"}')
        call = (await client.until("response.done"))[-1]["response"]["output"][-1]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ajar"}
        await client.send(type="conversation.item.create", item=output)
        answer = await client.until("response.done", timeout=OUTPUT_GRACE + 20)
        assert answer[-1]["response"]["status"] == "completed"
        assert not [e for e in answer if e["type"] == "error"]
    finally:
        await client.close()


async def test_items_named_by_the_client_keep_their_names_through_a_resume(
    node: NodeProcess,
) -> None:
    """pipecat names every item it creates (a uuid hex), LiveKit's plugin too, with
    ``previous_item_id`` "root" for the first, and waits for ``added`` by that name: the
    door refused both. OpenAI's service keeps a client's id; the door now does, shows
    the item at once, and logs the name with the message, so a resumed client sees it."""
    client = sdk_client(node)
    name = "2e8f6383ce4242c7a740f1a522777d2c"
    async with client.realtime.connect(model=MODELS[0]) as conn:

        async def until(kind: str) -> list[dict[str, Any]]:
            return await sdk_until(conn, kind)

        created = (await until("session.created"))[-1]
        sid = created["session"]["id"]
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await until("session.updated")
        hello = [{"type": "input_text", "text": "hello"}]
        await conn.conversation.item.create(
            item={"id": name, "type": "message", "role": "user", "content": hello},
            previous_item_id="root",
        )
        shown = await until("conversation.item.done")  # before any response.create
        assert [(e["type"], e["item"]["id"]) for e in shown[-2:]] == [
            ("conversation.item.added", name),
            ("conversation.item.done", name),
        ]
        await conn.conversation.item.create(
            item={"id": "item_32e413d46271", "type": "message", "role": "user", "content": hello},
            previous_item_id=name,
        )
        assert (await until("conversation.item.done"))[-1]["previous_item_id"] == name
        await conn.response.create()
        answer = await until("response.done")
        again = [e for e in answer if e.get("item", {}).get("role") == "user"]
        assert not again  # shown once, when created
        await conn.conversation.item.retrieve(item_id=name)
        assert (await until("conversation.item.retrieved"))[-1]["item"]["id"] == name

    resumed = await RawClient.open(
        f"{node.base}/openai/v1/realtime?model={MODELS[0]}&session_id={sid}"
        f"&after_event={created['event_id']}"
    )
    try:
        replayed = await resumed.until("response.done")
        done = [e["item"] for e in replayed if e["type"] == "conversation.item.done"]
        users = [item for item in done if item["role"] == "user"]
        # The two messages were one turn's: one item, under the first one's name.
        assert [(u["id"], u["content"][0]["text"]) for u in users] == [(name, "hello\nhello")]
        await resumed.send(type="conversation.item.delete", item_id=name)
        assert (await resumed.until("conversation.item.deleted"))[-1]["item_id"] == name
    finally:
        await resumed.close()


@pytest.mark.parametrize("model", MODELS)
async def test_a_response_create_with_nothing_new_is_a_greeting_from_the_instructions(
    node: NodeProcess, model: str
) -> None:
    """LiveKit's ``generate_reply(instructions="Greet the user.")`` and pipecat's run of a
    context with no user message send ``response.create`` with no new item: OpenAI's
    service answers the conversation as it is; the door refused it ("needs a user
    message first"), so neither framework's agent could speak first."""
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        await client.until("session.created")
        await client.text_session()
        await client.send(
            type="response.create",
            event_id="c_greet",
            response={"instructions": "Greet the user.", "metadata": {"why": "greeting"}},
        )
        await client.send(type="response.create", event_id="c_again")  # while it runs
        answer = await client.until("response.done")
        # Then the conversation goes on with a typed turn, as after any answer.
        await client.user("hello")
        await client.send(type="response.create")
        second = await client.until("response.done")
    finally:
        await client.close()
    busy = [e["error"] for e in answer if e["type"] == "error"]
    assert [(b["code"], b["event_id"]) for b in busy] == [
        ("conversation_already_has_active_response", "c_again")
    ]
    done = answer[-1]["response"]
    assert done["status"] == "completed" and done["metadata"] == {"why": "greeting"}
    assert done["output"] and done["output"][0]["role"] == "assistant"
    assert GREETING in json.dumps(done["output"])  # the model spoke first
    assert not [e for e in answer if e.get("item", {}).get("role") == "user"]  # no user item
    assert second[-1]["response"]["status"] == "completed"
    assert "hello" in json.dumps(second[-1]["response"]["output"])
