"""Client events an app or an attacker gets wrong, through the door on a node started as
the README says: each is answered with OpenAI's ``error`` (the client's ``event_id``
where it can be read) and the session goes on; none is dropped unanswered, none ends
the connection."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import AsyncOpenAI, BadRequestError
from websockets.exceptions import InvalidStatus

from gateway.edge.door_refusals import REFUSALS_LOGGED
from tests.openai_door.conftest import RawClient
from tests.openai_door.test_clear import MANUAL, RATE, _append
from tests.support.procs import NodeProcess
from tests.voice.conftest import utterance

pytestmark = pytest.mark.timeout(60)

MODEL = "gpt-realtime-2.1"


async def _open(node: NodeProcess, model: str = MODEL) -> RawClient:
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={model}")
    assert (await client.next())["type"] == "session.created"
    return client


async def _answer(client: RawClient, event_id: str) -> dict[str, Any]:
    """The error that answers ``event_id`` (anything else before it is kept in ``events``)."""
    while True:
        event = await client.next()
        if event["type"] == "error" and event["error"]["event_id"] == event_id:
            return event


async def _still_serves(client: RawClient) -> None:
    await client.send(type="conversation.item.retrieve", event_id="c_alive", item_id="item_nope")
    refused = (await _answer(client, "c_alive"))["error"]
    assert refused["code"] == "item_retrieve_invalid_item_id"


@pytest.mark.parametrize("kind", ["bogus.event", "session.update"])
async def test_deep_nesting_after_a_wrong_field_is_refused(node: NodeProcess, kind: str) -> None:
    # The event's type (unknown, or a known one with a wrong field) fails it before the
    # nesting is read; reading the rest for the event_id must not end the connection.
    deep = "[" * 100_000 + "]" * 100_000
    client = await _open(node)
    try:
        await client.ws.send(f'{{"type": "{kind}", "session": {deep}}}')
        refused = await client.next()
        assert refused["type"] == "error", refused
        assert "nests too deeply" in refused["error"]["message"]
        await _still_serves(client)
    finally:
        await client.close()


def _say(text: str, event_id: str) -> dict[str, Any]:
    return {
        "type": "conversation.item.create",
        "event_id": event_id,
        "item": {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        },
    }


async def _done(client: RawClient) -> dict[str, Any]:
    while True:
        event = await client.next()
        assert event["type"] != "error", event
        if event["type"] == "response.done":
            return event


async def _answer_text(client: RawClient) -> str:
    """The text of the next response, once it is done (completed)."""
    text: list[str] = []
    while True:
        event = await client.next()
        assert event["type"] != "error", event
        if event["type"] in (
            "response.output_text.delta",
            "response.output_audio_transcript.delta",
        ):
            text.append(event["delta"])
        if event["type"] == "response.done":
            assert event["response"]["status"] == "completed"
            return "".join(text)


@pytest.mark.parametrize(
    ("wait", "busy_id"),
    [(True, "c_busy"), (False, "c_busy"), (False, None)],
    ids=["seen_running", "sent_together", "sent_together_unnamed"],
)
async def test_a_message_sent_while_a_response_runs_waits_for_the_next(
    paced_node: NodeProcess, wait: bool, busy_id: str | None
) -> None:
    # OpenAI's service: response.create during a response is refused
    # (conversation_already_has_active_response), and the item created stays in the
    # conversation for the next response.create. It was lost: the refused create had
    # taken it, and the next create was told there was no user message. The SDKs name
    # no event unless asked to: the refusal is known as the message's all the same.
    client = await _open(paced_node)
    try:
        await client.text_session()
        await client.send(**_say("/long 4", "c_long"))
        await client.send(type="response.create", event_id="c_first")
        if wait:  # the answer is seen streaming; else both go at once (the door sends both)
            while (await client.next())["type"] != "response.output_text.delta":
                pass
        await client.send(**_say("the second message", "c_second"))
        await client.send(type="response.create", **({"event_id": busy_id} if busy_id else {}))
        while (refused := await client.next())["type"] != "error":
            pass
        assert refused["error"]["code"] == "conversation_already_has_active_response"
        assert refused["error"]["event_id"] == busy_id
        assert (await _done(client))["response"]["status"] == "completed"

        await client.send(type="response.create", event_id="c_next")
        assert "the second message" in await _answer_text(client)
    finally:
        await client.close()


async def test_a_field_the_api_does_not_define_is_refused_by_name(node: NodeProcess) -> None:
    # A Realtime beta field (GA renamed it) was ignored without a word: the voice or the
    # modalities the app asked for silently did not apply. OpenAI's service refuses it.
    client = await _open(node)
    try:
        await client.send(
            type="session.update",
            event_id="c_beta",
            session={"type": "realtime", "instructions": "Be brief.", "voice": "alloy"},
        )
        refused = (await _answer(client, "c_beta"))["error"]
        assert (refused["code"], refused["param"]) == ("unknown_parameter", "session.voice")
        await client.send(type="response.create", event_id="c_temp", response={"temperature": 1})
        refused = (await _answer(client, "c_temp"))["error"]
        assert (refused["code"], refused["param"]) == ("unknown_parameter", "response.temperature")
        assert not any(e["type"] == "session.updated" for e in client.events)
        await _still_serves(client)
    finally:
        await client.close()


@pytest.mark.parametrize("model", ["gpt-realtime-2.1", "gemini-3.8-live"])
async def test_a_commit_of_too_little_audio_is_refused(node: NodeProcess, model: str) -> None:
    # OpenAI's service refuses a commit of less than 100 ms (input_audio_buffer_commit_empty,
    # the client's event_id). The door sent it on: OpenAI's flavour showed a committed
    # user item, then an 'upstream' error naming no event; Gemini's answered an empty turn.
    client = await _open(node, model)
    try:
        await client.send(type="session.update", session=MANUAL)
        await client.until("session.updated")
        await client.send(type="input_audio_buffer.commit", event_id="c_empty")
        refused = (await _answer(client, "c_empty"))["error"]
        assert refused["code"] == "input_audio_buffer_commit_empty"
        await _append(client, bytes(RATE // 20 * 2))  # 50 ms
        await client.send(type="input_audio_buffer.commit", event_id="c_short")
        refused = (await _answer(client, "c_short"))["error"]
        assert refused["code"] == "input_audio_buffer_commit_empty"
        assert "50.00ms" in refused["message"]
        await _append(client, utterance(0.4, RATE))
        await client.send(type="input_audio_buffer.commit", event_id="c_spoken")
        events = await client.until("response.done")
        # Only the commit of enough audio was a turn.
        assert [e["type"] for e in client.events].count("input_audio_buffer.committed") == 1
        assert not any(e["type"] == "error" for e in events), events
        assert events[-1]["response"]["status"] == "completed"
    finally:
        await client.close()


async def test_a_cancel_of_no_response_is_openais_refusal(node: NodeProcess) -> None:
    client = await _open(node)
    try:
        await client.send(type="response.cancel", event_id="c_cancel")
        refused = (await _answer(client, "c_cancel"))["error"]
        assert refused["code"] == "response_cancel_not_active"
        await _still_serves(client)
    finally:
        await client.close()


async def test_a_resume_after_an_event_past_the_log_is_refused(node: NodeProcess) -> None:
    # The gateway's own door refuses an `after` past the log's end; this door took any
    # after_event and then sent nothing of the next turns (their events looked seen).
    client = await _open(node)
    try:
        sid = client.events[0]["session"]["id"]
        await client.send(**_say("hello", "c_hello"))
        await client.send(type="response.create")
        last = (await _done(client))["event_id"]
    finally:
        await client.close()
    seq = int(last.split("_")[1])
    base = f"{node.base}/openai/v1/realtime?model={MODEL}&session_id={sid}"
    with pytest.raises(InvalidStatus) as refused:
        await RawClient.open(f"{base}&after_event=evt_{seq + 1000}_1")
    assert refused.value.response.status_code == 400
    assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_after_event"

    # A resume given twice, differently: which one won was the query's order.
    with pytest.raises(InvalidStatus) as refused:
        await RawClient.open(f"{base}&after_event={last}&after_event=evt_1_1")
    assert refused.value.response.status_code == 400
    error = json.loads(refused.value.response.body)["error"]
    assert error["code"] == "duplicate_parameter" and "after_event" in error["message"]

    resumed = await RawClient.open(f"{base}&after_event={last}&after_event={last}")
    try:
        await resumed.send(**_say("again", "c_again"))
        await resumed.send(type="response.create")
        assert "again" in await _answer_text(resumed)
    finally:
        await resumed.close()


async def test_a_client_at_the_head_or_naming_no_event_is_answered_and_sent_nothing_old(
    node: NodeProcess,
) -> None:
    client = await _open(node)
    try:
        sid = client.events[0]["session"]["id"]
        await client.send(**_say("hello", "c_hello"))
        await client.send(type="response.create")
        last = (await _done(client))["event_id"]
    finally:
        await client.close()
    base = f"{node.base}/openai/v1/realtime?model={MODEL}&session_id={sid}"
    # At the head: a reply to its first event is sent, not taken for a replayed one (it
    # named the last event seen, and was held back until a new logged event came).
    at_head = await RawClient.open(f"{base}&after_event={last}")
    try:
        await at_head.send(type="conversation.item.retrieve", item_id="no", event_id="p")
        answer = await at_head.next(timeout=10)
        assert (answer["type"], answer["error"]["event_id"]) == ("error", "p"), answer
    finally:
        await at_head.close()
    # With no after_event: the session as it is now, once, and nothing before again.
    joined = await RawClient.open(base)
    try:
        created = await joined.next()
        assert created["type"] == "session.created" and created["session"]["id"] == sid
        await joined.send(type="conversation.item.retrieve", item_id="no", event_id="q")
        answer = await joined.next(timeout=10)
        assert (answer["type"], answer["error"]["event_id"]) == ("error", "q"), answer
    finally:
        await joined.close()


async def test_a_required_field_left_out_is_refused_by_name(node: NodeProcess) -> None:
    # Left out, each was taken as empty: a message of no content became an empty user
    # message (refused only by a later response.create, in the gateway's words), an
    # append of no audio was taken silently, a session.update of nothing was applied.
    client = await _open(node)
    try:
        no_content = {"type": "message", "role": "user"}
        cases: list[tuple[dict[str, Any], str]] = [
            ({"type": "conversation.item.create", "item": no_content}, "item.content"),
            ({"type": "input_audio_buffer.append"}, "audio"),
            ({"type": "session.update"}, "session"),
            (
                {"type": "conversation.item.truncate", "item_id": "x", "content_index": 0},
                "audio_end_ms",
            ),
        ]
        for n, (event, param) in enumerate(cases):
            await client.send(**event, event_id=f"c_{n}")
            refused = (await _answer(client, f"c_{n}"))["error"]
            assert (refused["code"], refused["param"]) == ("missing_required_parameter", param)
        # The empty message was not kept: the create is a turn with no new message.
        await client.send(type="response.create", event_id="c_create")
        assert (await _done(client))["response"]["status"] == "completed"
        assert not [e for e in client.events if e.get("item", {}).get("role") == "user"]
        assert not any(e["type"] == "session.updated" for e in client.events)
    finally:
        await client.close()


async def test_a_cancel_naming_another_response_leaves_the_running_one(
    paced_node: NodeProcess,
) -> None:
    # response.cancel names the response it means; one that ended (a client racing its
    # end) cancelled whichever response was running instead.
    client = await _open(paced_node)  # the answer still runs when the cancels come
    try:
        await client.text_session()
        await client.send(**_say("hello", "c_hello"))
        await client.send(type="response.create")
        old = (await _done(client))["response"]["id"]
        await client.send(**_say("/long 4", "c_long"))
        await client.send(type="response.create")
        while (event := await client.next())["type"] != "response.created":
            pass
        running = event["response"]["id"]
        await client.send(type="response.cancel", event_id="c_old", response_id=old)
        refused = (await _answer(client, "c_old"))["error"]
        assert (refused["code"], refused["param"]) == ("response_cancel_not_active", "response_id")
        await client.send(type="response.cancel", event_id="c_now", response_id=running)
        done = await _done(client)
        assert (done["response"]["id"], done["response"]["status"]) == (running, "cancelled")
    finally:
        await client.close()


async def test_a_response_whose_tools_the_session_would_refuse_never_starts(
    node: NodeProcess,
) -> None:
    # The tools were checked only by the session, after the door had sent the response's
    # message on: the override was refused (in the gateway's words, code bad_frame) and
    # the response ran anyway, with the session's tools.
    client = await _open(node)
    try:
        await client.send(**_say("hello", "c_hello"))
        bad_tools = [
            [{"type": "function", "name": "bad name!"}],
            [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}],
            [{"type": "function", "name": "f", "parameters": {"type": "string"}}],
        ]
        for n, tools in enumerate(bad_tools):
            await client.send(type="response.create", event_id=f"c_{n}", response={"tools": tools})
            refused = (await _answer(client, f"c_{n}"))["error"]
            assert (refused["code"], refused["param"]) == ("invalid_request_error", "response")
        await client.send(
            type="session.update",
            event_id="c_session",
            session={"type": "realtime", "tools": bad_tools[1]},
        )
        refused = (await _answer(client, "c_session"))["error"]
        assert (refused["code"], refused["param"]) == ("invalid_request_error", "session")
        assert not [e for e in client.events if e["type"].startswith("response.")]
        await client.send(type="response.create")  # the message waited for a response
        assert "hello" in await _answer_text(client)
    finally:
        await client.close()


async def test_more_tools_than_a_session_takes_are_refused_before_any_work(
    node: NodeProcess,
) -> None:
    """Found from outside (2026-12-07): the door checked the 64-tool limit only after
    converting every tool, and a name's duplicates by counting it among all names:
    14,000 tools in a response.create held the node 2 s, ten of them ~20 s."""
    tools = [{"type": "function", "name": f"f{n}"} for n in range(14_000)]
    client = await _open(node)
    try:
        for n, event in enumerate(
            [
                {"type": "response.create", "response": {"tools": tools}},
                {"type": "session.update", "session": {"type": "realtime", "tools": tools}},
            ]
        ):
            await client.send(**event, event_id=f"c_{n}")
            refused = (await _answer(client, f"c_{n}"))["error"]
            # Counted before a tool is read (the door's own 64 answers a smaller list).
            assert "tools holds 14,000 values" in refused["message"], refused
        await _still_serves(client)
    finally:
        await client.close()


async def test_a_client_secret_for_tools_the_session_would_refuse_is_not_minted(
    node: NodeProcess,
) -> None:
    # The tools were built without the checks a configure gets, so a session was made
    # with a tool named 'bad name' (a name the gateway's own door refuses).
    client = AsyncOpenAI(
        api_key="unused", base_url=f"{node.http}/openai/v1", websocket_base_url=node.base
    )
    with pytest.raises(BadRequestError) as refused:
        await client.realtime.client_secrets.create(
            session={
                "type": "realtime",
                "model": MODEL,
                "tools": [{"type": "function", "name": "bad name"}],
            }
        )
    assert "session.tools[0].name" in str(refused.value)


async def test_a_response_create_after_the_output_of_a_cancelled_call_is_answered(
    node: NodeProcess,
) -> None:
    # The response ended at the call, the client cancelled the turn, then sent the call's
    # output (refused: its turn is over) and response.create, which was swallowed as the
    # turn's going on: no response and no error, the client waited for nothing. It is a
    # turn of its own now (the model answers the conversation as it is, as OpenAI's).
    client = await _open(node)
    try:
        tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
        await client.send(type="session.update", session={"type": "realtime", "tools": [tool]})
        await client.until("session.updated")
        await client.send(**_say('/tool get_weather {"city": "Oslo"}', "c_ask"))
        await client.send(type="response.create")
        done = await _done(client)
        call = next(o for o in done["response"]["output"] if o["type"] == "function_call")
        await client.send(type="response.cancel", event_id="c_cancel")
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "{}"}
        await client.send(type="conversation.item.create", event_id="c_output", item=output)
        assert (await _answer(client, "c_output"))["error"]["code"] == "unknown_call"
        await client.send(type="response.create", event_id="c_create")
        again = (await _done(client))["response"]
        assert again["status"] == "completed"
        for out in again["output"]:  # the simulator answers its last user message again
            if out["type"] == "function_call":
                answer = {"type": "function_call_output", "call_id": out["call_id"], "output": "{}"}
                await client.send(type="conversation.item.create", item=answer)
                await _done(client)
        # The session goes on: a new message is answered.
        await client.send(**_say("hello", "c_hello"))
        await client.send(type="response.create")
        assert (await _done(client))["response"]["status"] == "completed"
    finally:
        await client.close()


async def test_refusals_are_logged_for_the_operator_and_a_flood_of_them_is_not(
    node: NodeProcess,
) -> None:
    """The door told only the client what it refused: an operator saw nothing in the
    node's log. Each refusal is logged with its event, code and field, up to
    ``REFUSALS_LOGGED`` a connection, then one line saying the rest are not."""
    client = await _open(node)
    try:
        sid = client.events[0]["session"]["id"]
        for n in range(REFUSALS_LOGGED + 5):
            await client.send(type="conversation.item.retrieve", event_id=f"c_r{n}", item_id="nope")
            await client.until("error")
    finally:
        await client.close()
    node.wait_for_lines(f"session {sid}: OpenAI door: further refusals")
    lines = [line for line in node.output if f"session {sid}: OpenAI door" in line]
    refused = [line for line in lines if "refused event" in line]
    assert len(refused) == REFUSALS_LOGGED and len(lines) == REFUSALS_LOGGED + 1
    assert "c_r0" in refused[0] and "item_retrieve_invalid_item_id" in refused[0]


async def test_an_event_past_the_frame_limit_that_is_no_append_is_refused_unread(
    node: NodeProcess,
) -> None:
    """The door takes 21 MiB frames for OpenAI's 15 MiB appends; any other event that
    large was decoded whole on the event loop (20 MiB: ~25 ms a frame, for an event
    nothing needs that large). It is refused unread, naming its event, and the
    session goes on."""
    client = await _open(node)
    try:
        huge = {"type": "realtime", "instructions": "x" * (3 << 20)}
        await client.send(event_id="c_huge", type="session.update", session=huge)
        refused = (await _answer(client, "c_huge"))["error"]
        assert "at most" in refused["message"] and "bytes" in refused["message"]
        await client.send(**_say("hello", "c_hello"))
        await client.send(type="response.create")
        assert "hello" in await _answer_text(client)
    finally:
        await client.close()
