"""The Python client library against a real gateway, through connections that die."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.client import ApprovalRefused, Client, Refused, Unreachable
from gateway.client.loadtest import sized_message
from protocol.events import (
    Approval,
    ApprovalRequired,
    Cancelled,
    End,
    Event,
    Metric,
    Respond,
    Result,
    User,
)
from tests.client.proxy import TcpProxy
from tests.client.scripted import tool_server
from tests.gateway.conftest import GatewayFactory
from tests.support.redis_server import free_port


def assert_contiguous(events: list[Event], first: int) -> None:
    """Each event starts right after the one before (a merged frame covers seq_from..seq)."""
    expected = first
    for event in events:
        start = getattr(event, "seq_from", None)
        start = event.seq if not isinstance(start, int) else start
        assert start == expected, f"{type(event).__name__} seq {start}, expected {expected}"
        expected = event.seq + 1


async def test_a_turn_completes_through_two_cuts_mid_stream(
    gateway_factory: GatewayFactory,
) -> None:
    message = sized_message("resume me", 400)  # ~100 respond chunks at 4 characters each
    async with (
        gateway_factory(sim_tokens_per_second=150.0) as gw,
        TcpProxy(gw.port) as proxy,
        Client(proxy.url(), backoff_initial=0.01) as client,
    ):
        before = client.last_seq
        events: list[Event] = []
        responds = 0
        cuts_at = {5, 40}
        async for event in client.send(message):
            events.append(event)
            if isinstance(event, Respond):
                responds += 1
                if responds in cuts_at:
                    assert proxy.cut() == 1
        assert client.reconnects == 2
        assert proxy.accepted == 3

    assert isinstance(events[0], User)
    assert_contiguous(events, before + 1)
    answer = "".join(e.content for e in events if isinstance(e, Respond))
    assert answer == f"Echo: {message}"
    assert [type(e) for e in events[-2:]] == [End, Metric]
    assert client.last_seq == events[-1].seq


async def test_consecutive_turns_and_cancel(gateway_factory: GatewayFactory) -> None:
    async with (
        gateway_factory(sim_tokens_per_second=50.0) as gw,
        Client(gw.url) as client,
    ):
        first = [e async for e in client.send("hello")]
        assert "".join(e.content for e in first if isinstance(e, Respond)) == "Echo: hello"
        events: list[Event] = []
        async for event in client.send(sized_message("long", 2000)):
            events.append(event)
            if isinstance(event, Respond):
                await client.cancel()
        # A cancelled turn closes with `cancelled`, then the metric of what it used.
        assert isinstance(events[-2], Cancelled) and isinstance(events[-1], Metric)
        assert events[-1].step.output > 0
        assert_contiguous(first + events, first[0].seq)
        third = [e async for e in client.send("again")]
        assert isinstance(third[0], User) and third[0].content == "again"
        assert isinstance(third[-1], Metric)


async def test_nothing_listening_fails_at_once() -> None:
    with pytest.raises(Unreachable, match="nothing is listening"):
        async with Client(f"ws://127.0.0.1:{free_port()}/v1/realtime"):
            pass


async def test_an_unknown_session_is_a_final_refusal(gateway_factory: GatewayFactory) -> None:
    async with gateway_factory() as gw:
        with pytest.raises(Refused) as info:
            async with Client(gw.url, session_id="nope", after=0):
                pass
    assert info.value.status == 404
    assert info.value.message


async def test_a_resumed_client_gets_the_rest_of_the_session(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        async with Client(gw.url) as one:
            events = [e async for e in one.send("hello")]
            sid, middle = one.session_id, events[2].seq
        async with Client(gw.url, session_id=sid, after=middle) as two:
            await asyncio.sleep(0)  # the replay is queued before the next turn's echo
            assert two.session is not None and two.session.resumed
            nxt = [e async for e in two.send("next")]
            assert isinstance(nxt[0], User)
            assert two.last_seq == nxt[-1].seq


async def test_client_tools_answer_calls_that_run_on_the_client() -> None:
    async with tool_server() as url, Client(url) as client:

        @client.tool
        async def shout(args: dict[str, Any]) -> str:
            return str(args["text"]).upper()

        events = [e async for e in client.send("use the tool")]
    answer = "".join(e.content for e in events if isinstance(e, Respond))
    # The scripted server answers with the exact frame the client sent it.
    assert orjson.loads(answer) == {
        "type": "tool_result",
        "id": "c1",
        "status": "success",
        "content": "HI",
    }


async def test_a_failing_or_unknown_client_tool_answers_failure() -> None:
    async with tool_server() as url, Client(url) as client:

        @client.tool(name="shout")
        def broken(args: dict[str, Any]) -> str:
            raise ValueError("no shouting here")

        events = [e async for e in client.send("use the tool")]
    answer = orjson.loads("".join(e.content for e in events if isinstance(e, Respond)))
    assert answer["status"] == "failure"
    assert answer["content"] == "ValueError: no shouting here"


async def test_client_tools_answer_a_real_gateway(gateway_factory: GatewayFactory) -> None:
    confirm = {
        "name": "confirm",
        "description": "yes or no",
        "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
    }
    async with gateway_factory() as gw, Client(gw.url) as client:

        @client.tool(name="confirm")
        async def ask(args: dict[str, Any]) -> str:
            return f"yes to {args['question']}"

        await client.configure(tools=[confirm])
        events = [e async for e in client.send('/tool confirm {"question": "tea"}')]
    [result] = [e for e in events if isinstance(e, Result)]
    assert orjson.loads(result.content) == [
        {"tool": "confirm", "status": "success", "content": "yes to tea"}
    ]


async def test_approve_runs_a_waiting_call_once_and_says_why_a_decision_is_refused(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw, Client(gw.url) as client:
        await client.configure(require_approval=["list"])
        events: list[Event] = []
        async for event in client.send('/tool list {"path": "."}'):
            events.append(event)
            if isinstance(event, ApprovalRequired):
                assert (event.name, event.args) == ("list", {"path": "."})
                with pytest.raises(ApprovalRefused) as wrong:
                    await client.approve(event.id, "0" * 64, "allow")
                assert wrong.value.code == "wrong_digest"  # and the call still waits
                approval = await client.approve(event.id, event.digest, "allow")
                assert (approval.id, approval.decision) == (event.id, "allow")
                with pytest.raises(ApprovalRefused) as twice:
                    await client.approve(event.id, event.digest, "allow")
                assert twice.value.code == "unknown_call"
    [pending] = [e for e in events if isinstance(e, ApprovalRequired)]
    [result] = [e for e in events if isinstance(e, Result)]
    assert result.id == pending.id
    assert orjson.loads(result.content)[0]["status"] == "success"


async def test_the_approval_hook_decides_as_each_call_asks(
    gateway_factory: GatewayFactory,
) -> None:
    asked: list[ApprovalRequired] = []

    async def deny_deletes(event: ApprovalRequired) -> str:
        asked.append(event)
        return "deny" if event.args.get("path") == "secret" else "allow"

    async with gateway_factory() as gw, Client(gw.url, on_approval=deny_deletes) as client:
        await client.configure(require_approval=["list"])
        denied = [e async for e in client.send('/tool list {"path": "secret"}')]
        allowed = [e async for e in client.send('/tool list {"path": "."}')]
    assert [e.args["path"] for e in asked] == ["secret", "."]
    [no] = [e for e in denied if isinstance(e, Approval)]
    [yes] = [e for e in allowed if isinstance(e, Approval)]
    assert (no.decision, yes.decision) == ("deny", "allow")
    [refused] = [e for e in denied if isinstance(e, Result)]
    assert "denied" in orjson.loads(refused.content)[0]["content"]
