"""Per-key allow-lists of tools (issue 14): what a tenant's sessions may call.

A key's line in the keys file (or its value in the Redis keys hash) may end
with ``tools=read,confirm``: other tools are left out of its sessions' prompt,
and a call to one is a failure result saying it is not available.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from gateway.edge.auth import hash_key, parse_key_line, parse_key_options
from protocol.events import Call, Configured, Result
from tests.edge.conftest import GatewayFactory, Keys
from tests.support.client import GatewayClient

REDIS_ONLY = pytest.mark.parametrize("store_kind", ["redis"])

TOOLS = [
    {"name": "confirm", "parameters": {"type": "object"}},
    {"name": "pick", "parameters": {"type": "object"}},
]


async def run_tool(client: GatewayClient, line: str) -> tuple[Call, dict[str, Any]]:
    events = await client.turn(line)
    [call] = [e for e in events if isinstance(e, Call)]
    [result] = [e for e in events if isinstance(e, Result)]
    return call, orjson.loads(result.content)[0]


async def check_limited(client: GatewayClient, gw: Any) -> None:
    await client.send({"type": "configure", "tools": TOOLS})
    await client.until(lambda e: isinstance(e, Configured))
    prompt = gw.node.runtimes[client.sid].setup.system_prompt
    assert "- read:" in prompt and "- confirm:" in prompt
    assert "- list:" not in prompt and "- pick:" not in prompt
    call, result = await run_tool(client, '/tool list {"path": "."}')
    assert result["status"] == "failure" and "not available" in result["content"]
    call, result = await run_tool(client, "/tool pick {}")
    assert call.runs_on == "gateway" and "not available" in result["content"]
    call, result = await run_tool(client, '/tool read {"path": "nothing.txt"}')
    assert "not available" not in str(result["content"])
    await client.user("/tool confirm {}")
    got = await client.until(lambda e: isinstance(e, Call))
    assert isinstance(got[-1], Call) and got[-1].runs_on == "client"


@REDIS_ONLY
async def test_a_keys_file_line_limits_the_tools_of_its_sessions(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    digest = hash_key(keys.keys["alice"])
    keys.path.write_text(f"alice:{digest} tools=read,conf*\nbob:{hash_key(keys.keys['bob'])}\n")
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        alice = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        await check_limited(alice, gw)
        meta = await gw.node.store.get_meta(alice.sid)
        assert meta is not None and meta["tools_allowed"] == "read,conf*"
        await alice.close()
        bob = await GatewayClient.connect(gw.url, headers=keys.bearer("bob"))
        _, result = await run_tool(bob, '/tool list {"path": "."}')
        assert result["status"] == "success"  # no list: every tool
        await bob.close()


@REDIS_ONLY
async def test_the_redis_keys_hash_carries_the_list_too(
    gateway_factory: GatewayFactory, redis_url: str
) -> None:
    key = "rtgw_test_carol_secret"
    r = aioredis.from_url(redis_url)
    await r.hset("rtgw:keys", hash_key(key), "carol tools=read,confirm")
    await r.aclose()
    async with gateway_factory(api_keys_redis=True) as gw:
        carol = await GatewayClient.connect(gw.url, headers={"Authorization": f"Bearer {key}"})
        await check_limited(carol, gw)
        await carol.close()


def test_old_key_lines_stay_valid_and_options_are_checked() -> None:
    digest = "a" * 64
    assert parse_key_line(f"alice:{digest}") == ("alice", digest)
    assert parse_key_line(f"alice:{digest} tools=read") == ("alice", digest)
    allowed = parse_key_options("tools=read,calc.*")
    assert allowed is not None and allowed.allows("calc.add") and not allowed.allows("shell")
    with pytest.raises(ValueError, match="tools="):
        parse_key_line(f"alice:{digest} color=blue")
    with pytest.raises(ValueError, match="not a tool name pattern"):
        parse_key_options("tools=re(ad")
