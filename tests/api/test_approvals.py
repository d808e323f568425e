"""Calls that wait for a user's approval (issue 28), through real nodes and the API.

The tool counts its executions per ``Idempotency-Key`` (``tests.support.counting_tool``),
marked ``require_approval`` in the tools file, or asked for by the session's own
configuration. A call runs only after an ``approve`` with its digest, from a
connection allowed to approve, once; a wrong digest is refused; nobody deciding is a deny.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from protocol.events import Approval, ApprovalRequired, End, Error, Result
from protocol.journal import approval_digest
from tests.api.conftest import Api, Keys, NodesFactory
from tests.support.client import GatewayClient, text_of
from tests.support.counting_tool import CountingTool, counting_tool

PAY = '/tool count {"label": "pay"}'


@pytest.fixture
def tool() -> Iterator[CountingTool]:
    with counting_tool() as server:
        yield server


def tools_file(tool: CountingTool, tmp_path: Path, *, approval: bool) -> str:
    path = tmp_path / "tools.toml"
    text = tool.tools_file()
    if approval:
        text += "require_approval = true\n"
    path.write_text(text)
    return str(path)


async def asked(client: GatewayClient) -> ApprovalRequired:
    got = await client.until(lambda e: isinstance(e, ApprovalRequired))
    event = got[-1]
    assert isinstance(event, ApprovalRequired)
    return event


async def refusal(client: GatewayClient) -> Error:
    got = await client.until(lambda e: isinstance(e, Error))
    error = got[-1]
    assert isinstance(error, Error)
    return error


async def test_a_call_runs_only_after_approve_with_its_digest_once(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession, tool: CountingTool, tmp_path: Path
) -> None:
    async with nodes(2, tools_file=tools_file(tool, tmp_path, approval=True)) as (a, b):
        _, minted = await Api(a, http).call("POST", "/v1/sessions", key=keys.keys["alice"], json={})
        sid, token = minted["session_id"], minted["client_token"]
        page = await GatewayClient.connect(f"{a.url}?token={token}")
        await page.user(PAY)
        pending = await asked(page)
        assert (pending.name, pending.args) == ("count", {"label": "pay"})
        assert pending.digest == approval_digest(pending.id, "count", {"label": "pay"})
        # A token minted without the right may not approve.
        approve = {"type": "approve", "id": pending.id, "digest": pending.digest}
        await page.send({**approve, "decision": "allow"})
        assert (await refusal(page)).code == "forbidden"
        # The backend's key may, from another node (forwarded); a wrong digest first.
        backend = await GatewayClient.connect(b.url, session_id=sid, headers=keys.bearer("alice"))
        wrong = approval_digest(pending.id, "count", {"label": "pay twice"})
        await backend.send(
            {"type": "approve", "id": pending.id, "digest": wrong, "decision": "allow"}
        )
        refused = await refusal(backend)
        assert refused.code == "wrong_digest" and pending.id in refused.content
        assert tool.requests == []  # nothing ran
        await backend.send({**approve, "decision": "allow"})
        events = await page.until(lambda e: isinstance(e, End))
        [approval] = [e for e in events if isinstance(e, Approval)]
        assert (approval.id, approval.decision) == (pending.id, "allow")
        [result] = [e for e in events if isinstance(e, Result)]
        assert result.id == pending.id
        assert "The tool returned success." in text_of(events, "respond")
        # Used once: the same approve again runs nothing.
        await backend.send({**approve, "decision": "allow"})
        again = await refusal(backend)
        assert again.code == "unknown_call" and "already decided" in again.content
        assert len(tool.requests) == 1 and set(tool.executions.values()) == {1}
        await asyncio.gather(page.close(), backend.close())


async def test_a_token_with_the_approve_right_approves_and_deny_tells_the_model(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession, tool: CountingTool, tmp_path: Path
) -> None:
    async with nodes(1, tools_file=tools_file(tool, tmp_path, approval=False)) as (gw,):
        # Approval asked by the session's own configuration.
        _, minted = await Api(gw, http).call(
            "POST",
            "/v1/sessions",
            key=keys.keys["alice"],
            json={"require_approval": ["count"], "rights": ["approve"]},
        )
        page = await GatewayClient.connect(f"{gw.url}?token={minted['client_token']}")
        await page.user(PAY)
        pending = await asked(page)
        await page.send(
            {"type": "approve", "id": pending.id, "digest": pending.digest, "decision": "deny"}
        )
        events = await page.until(lambda e: isinstance(e, End))
        [result] = [e for e in events if isinstance(e, Result)]
        [outcome] = orjson.loads(result.content)
        assert outcome["status"] == "failure" and "denied" in outcome["content"]
        assert "The tool returned failure." in text_of(events, "respond")
        assert tool.requests == []
        await page.close()


async def test_nobody_deciding_within_the_timeout_is_a_deny(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession, tool: CountingTool, tmp_path: Path
) -> None:
    settings = {"tools_file": tools_file(tool, tmp_path, approval=True), "approval_timeout": 0.5}
    async with nodes(1, **settings) as (gw,):
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        await client.user(PAY)
        pending = await asked(client)
        events = await client.until(lambda e: isinstance(e, End))
        [approval] = [e for e in events if isinstance(e, Approval)]
        assert (approval.id, approval.decision, approval.reason) == (pending.id, "deny", "timeout")
        assert tool.requests == []
        await client.close()


async def test_an_unknown_approval_tool_is_refused_at_configure(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession, tool: CountingTool, tmp_path: Path
) -> None:
    async with nodes(1, tools_file=tools_file(tool, tmp_path, approval=False)) as (gw,):
        status, body = await Api(gw, http).call(
            "POST", "/v1/sessions", key=keys.keys["alice"], json={"require_approval": ["nope"]}
        )
        assert status == 400 and "require_approval" in body["error"]["message"]


MALFORMED_APPROVES = [
    ({"type": "approve"}, "bad_frame"),
    ({"type": "approve", "id": "ID", "digest": "DIGEST"}, "bad_frame"),  # no decision
    ({"type": "approve", "id": "ID", "digest": "DIGEST", "decision": "maybe"}, "bad_frame"),
    ({"type": "approve", "id": 7, "digest": "DIGEST", "decision": "allow"}, "bad_frame"),
    ({"type": "approve", "id": "ID", "digest": None, "decision": "allow"}, "bad_frame"),
    ({"type": "approve", "id": ["ID"], "digest": "DIGEST", "decision": "deny"}, "bad_frame"),
    (
        {"type": "approve", "id": "call_999", "digest": "DIGEST", "decision": "allow"},
        "unknown_call",
    ),
    ({"type": "approve", "id": "ID", "digest": "0" * 64, "decision": "allow"}, "wrong_digest"),
]


@pytest.mark.parametrize("store_kind", ["memory"], indirect=True)
async def test_malformed_approves_are_refused_and_the_call_still_waits_for_a_real_one(
    nodes: NodesFactory, keys: Keys, tool: CountingTool, tmp_path: Path
) -> None:
    async with nodes(1, tools_file=tools_file(tool, tmp_path, approval=True)) as (gw,):
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        await client.user(PAY)
        pending = await asked(client)
        for frame, code in MALFORMED_APPROVES:
            sent = {k: pending.id if v == "ID" else pending.digest if v == "DIGEST" else v
                    for k, v in frame.items()}  # fmt: skip
            await client.send(sent)
            error = await refusal(client)
            assert error.code == code, (frame, error)
            assert error.content  # says what to do
        # Bytes that are not JSON, and an approve inside an array: refused the same way.
        await client.send('{"type": "approve", "id": ')
        assert (await refusal(client)).code == "bad_frame"
        await client.send(orjson.dumps([{"type": "approve"}]).decode())
        assert (await refusal(client)).code == "bad_frame"
        assert tool.requests == []  # nothing ran, nothing was denied
        approve = {"type": "approve", "id": pending.id, "digest": pending.digest}
        await client.send({**approve, "decision": "allow"})
        events = await client.until(lambda e: isinstance(e, End))
        assert [e.decision for e in events if isinstance(e, Approval)] == ["allow"]
        assert len(tool.requests) == 1
        await client.close()
