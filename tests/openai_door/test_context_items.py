"""System and assistant messages through the door: what pipecat appends (its system
messages, pipecat-flows' node instructions) and what LiveKit's plugin replays after a
reconnect (assistant lines). The door refused both ("takes user messages and
function_call_output items"); OpenAI's service keeps them in the conversation, and the
door now gives them to the session as ``context``.

The simulator's ``/context`` probe answers with the number of items its provider
connection holds, so the tests see what the model was given."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.openai_door.conftest import MODELS, RawClient, sdk_client, sdk_until
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(60)


def _message(role: str, text: str, iid: str | None = None) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    item: dict[str, Any] = {
        "type": "message",
        "role": role,
        "content": [{"type": kind, "text": text}],
    }
    return item | ({"id": iid} if iid else {})


def _items(events: list[dict[str, Any]]) -> int:
    output = events[-1]["response"]["output"]
    m = re.search(r"Context: (\d+) items", json.dumps(output))
    assert m, output
    return int(m.group(1))


@pytest.mark.parametrize("model", MODELS)
async def test_the_sdk_adds_system_and_assistant_messages_the_model_is_given(
    node: NodeProcess, model: str
) -> None:
    client = sdk_client(node)
    async with client.realtime.connect(model=model) as conn:

        async def until(kind: str) -> list[dict[str, Any]]:
            return await sdk_until(conn, kind)

        async def probe() -> int:
            await conn.conversation.item.create(item=_message("user", "/context"))  # type: ignore[arg-type]
            await conn.response.create()
            return _items(await until("response.done"))

        await until("session.created")
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await until("session.updated")
        before = await probe()
        await conn.conversation.item.create(item=_message("system", "Speak French.", "sys_1"))  # type: ignore[arg-type]
        shown = await until("conversation.item.done")
        assert shown[-1]["item"]["role"] == "system" and shown[-1]["item"]["id"] == "sys_1"
        await conn.conversation.item.create(item=_message("assistant", "Bonjour."))  # type: ignore[arg-type]
        assert (await until("conversation.item.done"))[-1]["item"]["role"] == "assistant"
        after = await probe()
        # The answer before, the two messages, the probe: nothing was refused or lost.
        assert after == before + 4
        await conn.conversation.item.retrieve(item_id="sys_1")
        got = (await until("conversation.item.retrieved"))[-1]["item"]
        assert got["content"] == [{"type": "input_text", "text": "Speak French."}]
        await conn.conversation.item.delete(item_id="sys_1")
        assert (await until("conversation.item.deleted"))[-1]["item_id"] == "sys_1"
        assert await probe() == after + 1  # its answer and the probe, less the system message


async def test_messages_created_around_a_turn_keep_their_order_and_wait_for_its_end(
    node: NodeProcess,
) -> None:
    """A system message created while an answer streams is shown at once and given to
    the model when the turn is over; one created after a held user message goes with
    the next ``response.create``, in order, and a resumed client sees both by name."""
    model = MODELS[0]
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        created = (await client.until("session.created"))[-1]
        await client.text_session()
        await client.say("/context")
        before = _items(await client.until("response.done"))
        await client.say("/long 3")
        await client.until("response.output_text.delta")
        await client.send(type="conversation.item.create", item=_message("system", "Mid.", "mid"))
        await client.until("response.done")
        await client.user("hello")
        await client.send(type="conversation.item.create", item=_message("system", "Late.", "late"))
        await client.send(type="response.create")
        answer = await client.until("response.done")
        await client.say("/context")
        after = _items(await client.until("response.done"))
    finally:
        await client.close()
    assert not [e for e in client.events if e["type"] == "error"]
    # The reply to [hello, Late.] answers hello (a turn with no new message after it).
    assert "hello" in json.dumps(answer[-1]["response"]["output"])
    # /long's turn (2), Mid., hello, Late., its answer, the probe.
    assert after == before + 2 + 2 + 1 + 2 + 1
    resumed = await RawClient.open(
        f"{node.base}/openai/v1/realtime?model={model}&session_id={created['session']['id']}"
        f"&after_event={created['event_id']}"
    )
    try:
        replayed = []
        while len([e for e in replayed if e["type"] == "response.done"]) < 4:
            replayed.append(await resumed.next())
    finally:
        await resumed.close()
    systems = [
        e["item"]["id"]
        for e in replayed
        if e["type"] == "conversation.item.done" and e["item"]["role"] == "system"
    ]
    assert systems == ["mid", "late"]


async def test_a_client_resumes_after_a_message_shown_when_created(node: NodeProcess) -> None:
    """A message created is shown at once, by an event no logged one is: a client that
    tracks the last event it saw resumes after it. Its id names the place it was sent
    at (``evt_SEQ_NxK``); it was refused (``invalid_after_event``)."""
    model = MODELS[0]
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        sid = (await client.until("session.created"))[-1]["session"]["id"]
        await client.text_session()
        await client.say("/long 3")
        await client.until("response.output_text.delta")
        await client.send(type="conversation.item.create", item=_message("system", "Mid.", "mid"))
        shown = (await client.until("conversation.item.done"))[-1]
    finally:
        client.ws.transport.abort()  # the connection drops with the answer unread
    resumed = await RawClient.open(
        f"{node.base}/openai/v1/realtime?model={model}&session_id={sid}"
        f"&after_event={shown['event_id']}"
    )
    rest: list[dict[str, Any]] = []
    try:  # through the message's logged place (after the answer's end, or before)
        while not (rest and rest[-1].get("item", {}).get("id") == "mid"):
            rest.append(await resumed.next())
    finally:
        await resumed.close()
    seen = {e["event_id"] for e in client.events}
    assert not [e for e in rest if e["event_id"] in seen]  # nothing sent twice
    events = client.events + rest
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    [done] = [e for e in events if e["type"] == "response.done" and "long" in json.dumps(e)]
    assert text == done["response"]["output"][0]["content"][0]["text"]  # nothing lost
