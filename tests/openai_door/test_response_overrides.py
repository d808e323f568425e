"""``response.create`` with per-response overrides, with the real ``openai`` SDK: the
one response runs with its ``instructions``, ``tools``, ``tool_choice: "none"`` or
``output_modalities`` (the simulator quotes what reached the model), the next one
with the session's again; ``metadata`` is echoed; what the gateway cannot honour
is refused naming the field and the client's event."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from tests.openai_door.conftest import MODELS, SERVER_EVENT, RawClient, sdk_client
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(90)

LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


def _client(node: NodeProcess) -> AsyncOpenAI:
    return sdk_client(node)


async def _next(conn: AsyncRealtimeConnection, seen: list[dict[str, Any]]) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(await conn.recv_bytes())
    SERVER_EVENT.validate_python(event)  # the SDK's contract, or the test fails
    seen.append(event)
    return event


async def _response(
    conn: AsyncRealtimeConnection, seen: list[dict[str, Any]], text: str, **response: Any
) -> list[dict[str, Any]]:
    """A user message and ``response.create`` (with ``response`` overrides): its events."""
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create(response=response or None)  # type: ignore[arg-type]
    events: list[dict[str, Any]] = []
    while True:
        event = await _next(conn, seen)
        assert event["type"] != "error", event
        events.append(event)
        if event["type"] == "response.done":
            return events


def _said(events: list[dict[str, Any]]) -> str:
    kinds = ("response.output_text.done", "response.output_audio_transcript.done")
    return "".join(e.get("text") or e.get("transcript", "") for e in events if e["type"] in kinds)


@pytest.mark.parametrize("model", MODELS)
async def test_instructions_and_metadata_for_one_response(node: NodeProcess, model: str) -> None:
    seen: list[dict[str, Any]] = []
    async with _client(node).realtime.connect(model=model) as conn:
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "Session rules.",
                "output_modalities": ["text"],
            }
        )
        once = await _response(
            conn, seen, "/instructions", instructions="Pirate talk.", metadata={"topic": "sea"}
        )
        assert "Pirate talk." in _said(once) and "Session rules." not in _said(once)
        created = next(e for e in once if e["type"] == "response.created")
        assert created["response"]["metadata"] == {"topic": "sea"}
        assert once[-1]["response"]["metadata"] == {"topic": "sea"}
        after = await _response(conn, seen, "/instructions")
        assert "Session rules." in _said(after) and "Pirate talk." not in _said(after)
        assert "metadata" not in after[-1]["response"]
    # The client changed its session once: the overrides were not shown as its changes.
    assert [e["type"] for e in seen].count("session.updated") == 1


@pytest.mark.parametrize("model", MODELS)
async def test_tools_for_one_response_and_tool_choice_none(node: NodeProcess, model: str) -> None:
    seen: list[dict[str, Any]] = []
    async with _client(node).realtime.connect(model=model) as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        call = '/tool lookup {"word": "door"}'
        asked = await _response(conn, seen, call, tools=[LOOKUP])
        item = asked[-1]["response"]["output"][-1]
        assert (item["type"], item["name"]) == ("function_call", "lookup")
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": item["call_id"], "output": "a way in"}
        )
        await conn.response.create()
        answered: list[dict[str, Any]] = []
        while (event := await _next(conn, seen))["type"] != "response.done":
            answered.append(event)
        assert "a way in" in _said(answered) or "success" in _said(answered)

        await conn.session.update(session={"type": "realtime", "tools": [LOOKUP]})
        barred = await _response(conn, seen, call, tool_choice="none")
        assert all(i["type"] != "function_call" for i in barred[-1]["response"]["output"])
        again = await _response(conn, seen, call)  # the session's tools are back
        assert again[-1]["response"]["output"][-1]["type"] == "function_call"


async def test_output_modalities_for_one_response(node: NodeProcess) -> None:
    seen: list[dict[str, Any]] = []
    async with _client(node).realtime.connect(model=MODELS[0]) as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        spoken = await _response(conn, seen, "hello", output_modalities=["audio"])
        assert spoken[-1]["response"]["output_modalities"] == ["audio"]
        assert any(e["type"] == "response.output_audio.delta" for e in spoken)
        written = await _response(conn, seen, "hello")
        assert written[-1]["response"]["output_modalities"] == ["text"]
        assert any(e["type"] == "response.output_text.delta" for e in written)


@pytest.mark.parametrize(
    ("response", "param"),
    [
        ({"conversation": "none"}, "response.conversation"),
        ({"input": []}, "response.input"),
        ({"max_output_tokens": 50}, "response.max_output_tokens"),
        ({"tool_choice": "required"}, "response.tool_choice"),
    ],
)
async def test_what_one_response_cannot_have_is_refused(
    node: NodeProcess, response: dict[str, Any], param: str
) -> None:
    seen: list[dict[str, Any]] = []
    async with _client(node).realtime.connect(model=MODELS[0]) as conn:
        await conn.response.create(response=response, event_id="c_resp")  # type: ignore[arg-type]
        while (event := await _next(conn, seen))["type"] != "error":
            pass
        error = event["error"]
        assert (error["type"], error["event_id"], error["param"]) == (
            "invalid_request_error",
            "c_resp",
            param,
        )


async def test_a_resumed_client_does_not_see_the_overrides_as_session_changes(
    node: NodeProcess,
) -> None:
    model = MODELS[0]
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        created = (await client.until("session.created"))[-1]
        await client.say("hello")  # a plain response first
        await client.until("response.done")
        await client.send(
            type="conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "/instructions"}],
            },
        )
        await client.send(type="response.create", response={"instructions": "Pirate talk."})
        await client.until("response.done")
    finally:
        await client.close()
    sid, first = created["session"]["id"], created["event_id"]
    resumed = await RawClient.open(
        f"{node.base}/openai/v1/realtime?model={model}&session_id={sid}&after_event={first}"
    )
    try:
        await resumed.until("response.done")
        replay = await resumed.until("response.done")
    finally:
        await resumed.close()
    assert "Pirate talk." in "".join(e.get("delta", "") for e in replay)
    kinds = [e["type"] for e in resumed.events]
    assert "session.updated" not in kinds  # the door's own configures stay its own


async def _raw(node: NodeProcess, model: str) -> RawClient:
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    await client.until("session.created")
    await client.text_session()
    return client


@pytest.mark.parametrize("model", MODELS)
async def test_a_create_cancelled_at_once_gets_its_response_and_keeps_its_metadata(
    node: NodeProcess, model: str
) -> None:
    """LiveKit's plugin cancels a ``generate_reply`` it gave up on, often before the first
    word: the create is still answered (created, then done as cancelled, as OpenAI's
    service answers), and its metadata is not echoed by the next response, which the
    plugin would otherwise discard as the one it gave up on."""
    client = await _raw(node, model)
    try:
        await client.user("/long 3")
        tag = {"client_event_id": "given_up"}
        await client.send(type="response.create", event_id="given_up", response={"metadata": tag})
        await client.send(type="response.cancel")
        events = await client.until("response.done")
        created = next(e for e in events if e["type"] == "response.created")
        assert created["response"]["metadata"] == tag
        assert events[-1]["response"]["status"] == "cancelled"
        assert events[-1]["response"]["metadata"] == tag
        await client.user("hello")
        await client.send(type="response.create", event_id="next")
        after = await client.until("response.done")
        assert all("metadata" not in e.get("response", {}) for e in after), after
        assert after[-1]["response"]["status"] == "completed"
    finally:
        await client.close()


@pytest.mark.parametrize("model", MODELS)
async def test_a_create_after_a_tool_answer_was_shown_echoes_its_metadata_nowhere(
    node: NodeProcess, model: str
) -> None:
    """The gateway answers a function_call_output by itself; a response.create that comes
    once that answer is under way or done opens nothing, and its metadata must not
    ride on the user's next response."""
    client = await _raw(node, model)
    try:
        await client.send(type="session.update", session={"type": "realtime", "tools": [LOOKUP]})
        await client.until("session.updated")
        await client.user('/tool lookup {"word": "door"}')
        await client.send(type="response.create")
        called = await client.until("response.done")
        call = called[-1]["response"]["output"][-1]
        assert call["type"] == "function_call"
        await client.send(
            type="conversation.item.create",
            item={"type": "function_call_output", "call_id": call["call_id"], "output": "ajar"},
        )
        answer = await client.until("response.done")
        assert "metadata" not in answer[-1]["response"]
        late = {"client_event_id": "late"}
        await client.send(type="response.create", event_id="late", response={"metadata": late})
        await client.user("hello")
        await client.send(type="response.create", event_id="next")
        after = await client.until("response.done")
        assert all("metadata" not in e.get("response", {}) for e in after), after
    finally:
        await client.close()


@pytest.mark.parametrize("model", MODELS)
async def test_a_create_that_asks_for_what_the_session_has_is_no_override(
    node: NodeProcess, model: str
) -> None:
    """pipecat sends its session's ``output_modalities`` with every response.create,
    the one after a function_call_output too: asking for what the session already has
    overrides nothing, so it is not refused there (it was, and pipecat ended the
    session on the error)."""
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    try:
        await client.until("session.created")
        session = {"type": "realtime", "output_modalities": ["audio"], "tools": [LOOKUP]}
        await client.send(type="session.update", session=session)
        await client.until("session.updated")
        audio = {"output_modalities": ["audio"]}
        await client.user('/tool lookup {"word": "door"}')
        await client.send(type="response.create")
        called = await client.until("response.done")
        call = called[-1]["response"]["output"][-1]
        assert call["type"] == "function_call"
        await client.send(
            type="conversation.item.create",
            item={"type": "function_call_output", "call_id": call["call_id"], "output": "ajar"},
        )
        await client.send(type="response.create", event_id="same", response=audio)
        answer = await client.until("response.done")
        assert not [e for e in answer if e["type"] == "error"], answer
        assert answer[-1]["response"]["status"] == "completed"
        assert answer[-1]["response"]["output_modalities"] == ["audio"]
        # Asking for something else there is still refused, naming the field.
        await client.user('/tool lookup {"word": "key"}')
        await client.send(type="response.create")
        called = await client.until("response.done")
        call = called[-1]["response"]["output"][-1]
        await client.send(
            type="conversation.item.create",
            item={"type": "function_call_output", "call_id": call["call_id"], "output": "lost"},
        )
        text = {"output_modalities": ["text"]}
        await client.send(type="response.create", event_id="other", response=text)
        seen: list[dict[str, Any]] = []
        # The refusal, and the gateway's own answer to the output, in either order.
        while not ({"error", "response.done"} <= {e["type"] for e in seen}):
            seen.append(await client.next())
        refused = next(e for e in seen if e["type"] == "error")
        assert refused["error"]["event_id"] == "other"
    finally:
        await client.close()


def _upstream_errors(node: NodeProcess) -> float:
    with urllib.request.urlopen(f"{node.http}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rtgw_upstream_errors_total")
    )


async def test_overrides_reopen_without_counting_upstream_errors(node: NodeProcess) -> None:
    """Each override reopens the upstream, and once its response is done the session's own
    values reopen it again, between turns. A read still pending on the connection let go
    was counted as an upstream error and logged as "upstream lost" (pipecat's
    per-response output_modalities made it so on most turns)."""
    before = await asyncio.to_thread(_upstream_errors, node)
    seen: list[dict[str, Any]] = []
    async with _client(node).realtime.connect(model=MODELS[0]) as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        for turn in range(4):
            done = await _response(conn, seen, f"turn {turn}", output_modalities=["audio"])
            assert done[-1]["response"]["status"] == "completed"
    assert await asyncio.to_thread(_upstream_errors, node) == before
