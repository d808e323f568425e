"""Client-side tools through a running gateway (issue 14): what a client sees.

A real WebSocket client declares tools with ``configure``, the simulator
calls them (``/tool NAME {args}``), and the client answers with
``tool_result``; on both stores.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import orjson

from gateway.edge.server import Gateway
from protocol.configuration import ClientToolSpec, decode_config
from protocol.events import Call, Configured, End, Error, Event, Result, User
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient

CONFIRM = {
    "name": "confirm",
    "description": "Ask the user a yes/no question; answers true or false.",
    "parameters": {
        "type": "object",
        "properties": {"question": {"type": "string"}},
        "required": ["question"],
    },
}


async def configure(client: GatewayClient, *tools: dict[str, Any]) -> Configured:
    await client.send({"type": "configure", "tools": list(tools)})
    got = await client.until(lambda e: isinstance(e, Configured | Error))
    configured = got[-1]
    assert isinstance(configured, Configured), configured
    return configured


async def next_call(client: GatewayClient) -> Call:
    got = await client.until(lambda e: isinstance(e, Call))
    call = got[-1]
    assert isinstance(call, Call)
    return call


async def answer(client: GatewayClient, call: Call, content: Any, status: str = "success") -> None:
    frame = {"type": "tool_result", "id": call.id, "status": status, "content": content}
    await client.send(frame)


def results_of(events: list[Event]) -> list[dict[str, Any]]:
    result = [e for e in events if isinstance(e, Result)][-1]
    return list(orjson.loads(result.content))


async def test_a_declared_client_tool_gets_the_clients_answer_in_the_result(
    gateway: Gateway,
) -> None:
    client = await GatewayClient.connect(gateway.url)
    configured = await configure(client, CONFIRM)
    assert [t.name for t in configured.config.tools] == ["confirm"]
    await client.user('/tool confirm {"question": "Delete it?"}')
    call = await next_call(client)
    assert call.runs_on == "client" and call.id.startswith("call_")
    assert orjson.loads(call.content) == {"name": "confirm", "args": {"question": "Delete it?"}}
    await answer(client, call, True)
    events = await client.until_type("end")
    assert results_of(events) == [{"tool": "confirm", "status": "success", "content": True}]
    await client.until_type("metric")
    await client.close()


async def test_the_prompt_lists_client_tools_with_their_schema(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    await configure(client, CONFIRM)
    prompt = gateway.node.runtimes[client.sid].setup.system_prompt
    assert "- confirm: Ask the user a yes/no question" in prompt
    assert '"required":["question"]' in prompt
    assert "- read:" in prompt  # next to the server tools
    await client.close()


async def test_client_tools_are_stored_with_the_session(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    await configure(client, CONFIRM)
    # Recorded at the configure, then the new configuration written in the background:
    # polled, within a deadline, until the store holds the tools.
    async with asyncio.timeout(25):
        while True:
            meta = await gateway.node.store.get_meta(client.sid)
            if meta is not None and decode_config(meta["config"]).tools:
                break
            await asyncio.sleep(0.02)
    stored = decode_config(meta["config"])
    assert stored.tools == (msgspec.convert(CONFIRM, ClientToolSpec),), stored
    await client.close()


async def test_a_bad_configure_is_refused_and_changes_nothing(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    await client.send(
        {"type": "configure", "tools": [{"name": "x", "parameters": {"type": "nonsense"}}]}
    )
    [error] = await client.until(lambda e: isinstance(e, Error))
    assert isinstance(error, Error) and error.code == "bad_frame" and "'x'" in error.content
    events = await client.turn('/tool x {"a": 1}')
    [call] = [e for e in events if isinstance(e, Call)]
    assert call.runs_on == "gateway"  # never declared: a server call (unknown tool)
    assert results_of(events)[0]["status"] == "failure"
    await client.close()


async def test_an_unanswered_call_fails_after_the_timeout_and_the_turn_goes_on(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(client_tool_timeout=0.5) as gw:
        client = await GatewayClient.connect(gw.url)
        await configure(client, CONFIRM)
        events = await client.turn('/tool confirm {"question": "anyone?"}')
        [result] = results_of(events)
        assert result["status"] == "failure" and "did not answer" in result["content"]
        assert [e for e in events if isinstance(e, End)]
        # A late answer is refused, saying why; the session goes on.
        [call] = [e for e in events if isinstance(e, Call)]
        await answer(client, call, True)
        [error] = await client.until(lambda e: isinstance(e, Error))
        assert isinstance(error, Error) and error.code == "unknown_call"
        assert "timed out" in error.content
        await client.turn("still there?")
        await client.close()


async def test_a_second_answer_or_an_unknown_id_is_refused_with_unknown_call(
    gateway: Gateway,
) -> None:
    client = await GatewayClient.connect(gateway.url)
    await configure(client, CONFIRM)
    await client.send({"type": "tool_result", "id": "call_999", "status": "success"})
    [error] = await client.until(lambda e: isinstance(e, Error))
    assert isinstance(error, Error) and error.code == "unknown_call"
    await client.user('/tool confirm {"question": "twice?"}')
    call = await next_call(client)
    await answer(client, call, "yes")
    await answer(client, call, "no")
    events = await client.until(lambda e: isinstance(e, Error) and e.code == "unknown_call")
    assert "already answered" in events[-1].content  # type: ignore[union-attr]
    if not any(isinstance(e, End) for e in events):  # the reply may come before or after end
        events += await client.until_type("end")
    assert results_of(events) == [{"tool": "confirm", "status": "success", "content": "yes"}]
    await client.close()


async def test_args_that_break_the_schema_fail_without_asking_the_client(
    gateway: Gateway,
) -> None:
    client = await GatewayClient.connect(gateway.url)
    await configure(client, CONFIRM)
    events = await client.turn('/tool confirm {"question": 42}')
    [call] = [e for e in events if isinstance(e, Call)]
    assert call.runs_on == "gateway"
    [result] = results_of(events)
    assert result["status"] == "failure" and "args.question" in result["content"]
    await client.close()


async def test_a_mixed_batch_keeps_call_order(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    await configure(client, CONFIRM)
    batch = (
        '<execute>[{"name": "write", "args": {"path": "a.txt", "content": "x"}}, '
        '{"name": "confirm", "args": {"question": "ok?"}}, '
        '{"name": "list", "args": {"path": "."}}]</execute>'
    )
    await client.user("/raw " + batch)
    got = await client.until(lambda e: isinstance(e, Call) and e.runs_on == "client")
    call = got[-1]
    assert isinstance(call, Call)
    await client.until_type("execute")
    await answer(client, call, "sure")
    # One result per call (each logged as its call finished), in whatever order they end.
    await client.until(lambda e: sum(isinstance(x, Result) for x in client.events) == 3)
    ids = [e.id for e in client.events if isinstance(e, Call)]
    by_id = {e.id: results_of([e]) for e in client.events if isinstance(e, Result)}
    assert [(r[0]["tool"], r[0]["status"]) for r in (by_id[i] for i in ids)] == [
        ("write", "success"),
        ("confirm", "success"),
        ("list", "success"),
    ]
    assert by_id[call.id][0]["content"] == "sure"
    await client.close()


async def test_cancel_while_waiting_cancels_the_turn_cleanly(gateway: Gateway) -> None:
    client = await GatewayClient.connect(gateway.url)
    await configure(client, CONFIRM)
    await client.user('/tool confirm {"question": "wait"}')
    call = await next_call(client)
    await client.until_type("execute")
    await client.send({"type": "cancel"})
    events = await client.until_type("cancelled")
    events += await client.until_type("metric")
    assert not [e for e in events if isinstance(e, Result)]
    await answer(client, call, True)
    [error] = await client.until(lambda e: isinstance(e, Error))
    assert (
        isinstance(error, Error) and error.code == "unknown_call" and "cancelled" in error.content
    )
    events = await client.turn("next")
    assert isinstance(events[0], User)
    await client.close()


async def test_a_client_that_reconnects_mid_wait_sees_the_call_and_answers_it(
    gateway: Gateway,
) -> None:
    client = await GatewayClient.connect(gateway.url)
    await configure(client, CONFIRM)
    await client.user('/tool confirm {"question": "still?"}')
    await next_call(client)
    await client.close()
    again = await GatewayClient.connect(gateway.url, session_id=client.sid, after=0)
    call = await next_call(again)  # in the replay
    assert call.runs_on == "client"
    await answer(again, call, "yes")
    events = await again.until_type("end")
    assert results_of(events) == [{"tool": "confirm", "status": "success", "content": "yes"}]
    await again.close()


async def test_two_connections_of_a_session_any_may_answer(gateway: Gateway) -> None:
    one = await GatewayClient.connect(gateway.url)
    await configure(one, CONFIRM)
    two = await GatewayClient.connect(gateway.url, session_id=one.sid, after=one.last_seq)
    await one.user('/tool confirm {"question": "who?"}')
    call = await next_call(two)
    await answer(two, call, "two")
    events = await one.until_type("end")
    assert results_of(events)[0]["content"] == "two"
    await asyncio.gather(one.close(), two.close())
