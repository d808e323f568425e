"""A ``kill -9`` of the node mid-answer: a client of the OpenAI door that reconnects to
another node with the session extension (``session_id`` + ``after_event``) gets the rest,
each event once: the broken response fails, the rerun answers in full."""

from __future__ import annotations

import contextlib

import pytest
from websockets.exceptions import ConnectionClosed

from protocol.events import Metric
from tests.multinode.conftest import (
    NodeFactory,
    SimFactory,
    durable_redis,
    start_node,
    start_sim,
)
from tests.openai_door.conftest import RawClient
from tests.support.client import GatewayClient

__all__ = ["durable_redis", "start_node", "start_sim"]

pytestmark = pytest.mark.timeout(90)
MESSAGE = "please echo this whole sentence back to me, slowly and carefully"
MODEL = "gpt-realtime-2.1"


async def test_kill_9_mid_answer_then_resume_on_another_node(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await RawClient.open(f"{a.base}/openai/v1/realtime?model={MODEL}")
    sid = (await first.next())["session"]["id"]
    await first.text_session()
    await first.say(MESSAGE)
    await first.until("response.output_text.delta")
    a.kill()
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        while True:
            await first.next(timeout=10)
    last = first.events[-1]["event_id"]

    second = await RawClient.open(
        f"{b.base}/openai/v1/realtime?model={MODEL}&session_id={sid}&after_event={last}"
    )
    try:
        rest: list[dict[str, object]] = []
        while True:  # the broken response's end (failed), then the rerun's, completed
            rest += await second.until("response.done", timeout=30)
            done = rest[-1]["response"]
            assert isinstance(done, dict)
            if done["status"] == "completed":
                break
        await second.say("and once more")
        again = await second.until("response.done")
    finally:
        await second.close()
    events = first.events + rest
    ids = [e["event_id"] for e in events]
    assert len(ids) == len(set(ids))  # nothing twice
    rerun = [e for e in rest if e["type"] == "response.output_text.done"]
    assert rerun and rerun[-1]["text"] == f"Echo: {MESSAGE}"
    statuses = [e["response"]["status"] for e in events if e["type"] == "response.done"]  # type: ignore[index]
    assert statuses[-2:] == ["failed", "completed"]  # the broken one, then the rerun
    assert again[-1]["response"]["status"] == "completed"


async def test_a_response_whose_node_died_after_its_end_is_done_before_the_next(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    """The model writes on past ``<end>``: the answer is whole (its end logged) but its
    usage is seconds away when node A dies. The client reconnects to node B: that
    response is done (with its estimated usage), and the next is a response of its own."""
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    door = await RawClient.open(f"{a.base}/openai/v1/realtime?model={MODEL}")
    sid = (await door.next())["session"]["id"]
    await door.text_session()
    await door.say("/raw Done.<end>" + " and the model writes on" * 10)
    await door.until("response.output_text.delta")
    # The door finishes a response with its usage; the gateway's own client sees its end.
    watch = await GatewayClient.connect(a.url, session_id=sid, after=0)
    await watch.until_type("end")
    a.kill()
    for client in (door, watch):
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            while True:
                await client.next(timeout=10)
    assert not any(e["type"] == "response.done" for e in door.events)
    last = door.events[-1]["event_id"]

    second = await RawClient.open(
        f"{b.base}/openai/v1/realtime?model={MODEL}&session_id={sid}&after_event={last}"
    )
    try:
        await second.say("and once more")  # node B takes the session over for it
        got = await second.until("response.done", timeout=30)  # the first, closed by B
        got += await second.until("response.done", timeout=30)
    finally:
        await second.close()
    events = door.events + got
    created = [e["response"]["id"] for e in events if e["type"] == "response.created"]
    done = [e["response"] for e in events if e["type"] == "response.done"]
    assert len(created) == 2 and [r["id"] for r in done] == created, (created, done)
    texts = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    assert texts == ["Done.", "Echo: and once more"], texts


async def test_a_system_item_created_after_an_answers_end_survives_a_kill_9(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    """The door shows a created system item at once. Made after the answer's end and
    before its usage, it is logged then too (not held for the usage), so the node that
    takes the session over has it in the conversation."""
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    door = await RawClient.open(f"{a.base}/openai/v1/realtime?model={MODEL}")
    sid = (await door.next())["session"]["id"]
    await door.text_session()
    await door.say("/raw Done.<end>" + " and the model writes on" * 10)
    await door.until("response.output_text.delta")
    watch = await GatewayClient.connect(a.url, session_id=sid, after=0)
    await watch.until_type("end")  # the answer is written; its usage is seconds away
    system = {"type": "message", "role": "system", "content": [{"type": "input_text"}]}
    system["content"][0]["text"] = "Remember: blue."  # type: ignore[index]
    await door.send(type="conversation.item.create", item={**system, "id": "item_sys1"})
    assert (await door.until("conversation.item.done"))[-1]["item"]["id"] == "item_sys1"
    # Logged at once: before the response's usage (its metric) comes, which is when the
    # node dies here.
    logged = await watch.until_type("context")
    assert not any(isinstance(e, Metric) for e in logged), [type(e).__name__ for e in logged]
    a.kill()
    for client in (door, watch):
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            while True:
                await client.next(timeout=10)
    last = door.events[-1]["event_id"]

    second = await RawClient.open(
        f"{b.base}/openai/v1/realtime?model={MODEL}&session_id={sid}&after_event={last}"
    )
    try:
        await second.say("/context")  # node B takes the session over for it
        await second.until("response.done", timeout=30)
        await second.send(type="conversation.item.retrieve", item_id="item_sys1")
        got = await second.until("conversation.item.retrieved", timeout=30)
    finally:
        await second.close()
    assert got[-1]["item"]["content"][0]["text"] == "Remember: blue."
    assert not [e for e in got if e["type"] == "error"], got
