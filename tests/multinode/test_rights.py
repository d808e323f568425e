"""A revoked key opens nothing, on every node, within a second (issue 29).

Two real node processes share one Redis, which holds the API keys (the
operator's ``--api-keys-redis``). A backend mints a client token on node A;
the page connects with it through node B, and the backend's own connection
(its API key) sits on A. Revoking the key — with ``gateway keys revoke``, which
announces it on the control bus, or with a bare ``HDEL``, which nobody
announces — closes both with 4401, and the token is refused on A and B.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from typing import Any

import aiohttp
import pytest
import redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.edge.auth import hash_key
from gateway.edge.closes import CloseCode
from protocol.events import Pong
from tests.multinode.conftest import NodeFactory, SimFactory
from tests.support.client import GatewayClient
from tests.support.procs import NodeProcess
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

# Deadlines for the waits, on a loaded 2-core machine; the figures are printed.
CLOSE_WITHIN = 3.0


def api_url(node: NodeProcess) -> str:
    match = re.search(r"HTTP API:\s+(http://\S+)/v1/sessions", node.log)
    assert match, node.log
    return match.group(1)


async def mint(http: aiohttp.ClientSession, node: NodeProcess, key: str) -> str:
    async with http.post(
        api_url(node) + "/v1/sessions", headers={"Authorization": f"Bearer {key}"}
    ) as r:
        body = await r.json()
        assert r.status == 201, body
        return str(body["client_token"])


async def closed(client: GatewayClient) -> tuple[int | None, float]:
    """Read until the server closes the connection: its close code and when (monotonic)."""
    try:
        async with asyncio.timeout(CLOSE_WITHIN):
            while True:
                await client.ws.recv()
    except ConnectionClosed as exc:
        return (exc.rcvd.code if exc.rcvd is not None else None), time.monotonic()


async def refused(url: str, **kwargs: Any) -> int:
    """The HTTP status a handshake is refused with (0: it was accepted)."""
    try:
        async with connect(url, **kwargs):
            return 0
    except InvalidStatus as exc:
        return exc.response.status_code


async def test_a_revoked_key_is_refused_and_its_connections_closed_on_every_node(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    keys = {"alice": "rtgw_test_alice_key", "bob": "rtgw_test_bob_key"}
    store = redis.Redis.from_url(durable_redis.url)
    for key_id, key in keys.items():  # as `gateway keys add --redis` stores them
        store.hset("rtgw:keys", hash_key(key), key_id)
    sim = start_sim("--tokens-per-second", "200")
    a = start_node(sim, "node-a", "--api-keys-redis", "--api-port", "0")
    b = start_node(sim, "node-b", "--api-keys-redis", "--api-port", "0")
    alice = {"Authorization": f"Bearer {keys['alice']}"}
    async with aiohttp.ClientSession() as http:
        token = await mint(http, a, keys["alice"])
        bob_token = await mint(http, b, keys["bob"])
    page = await GatewayClient.connect(f"{b.url}?token={token}")
    backend = await GatewayClient.connect(a.url, headers=alice)
    bob = await GatewayClient.connect(f"{a.url}?token={bob_token}")
    await page.turn("hello")  # the token works through B

    # The operator's command: HDEL, then an announcement on the control bus.
    started = time.monotonic()
    cli = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "keys",
        "revoke",
        "alice",
        "--redis",
        durable_redis.url,
        stderr=subprocess.PIPE,
    )
    (page_code, page_at), (backend_code, backend_at), (status, err) = await asyncio.gather(
        closed(page), closed(backend), _exit(cli)
    )
    assert status == 0, err
    print(
        f"gateway keys revoke (its start included) → 4401: token on B {page_at - started:.3f}s, "
        f"key on A {backend_at - started:.3f}s"
    )
    assert page_code == backend_code == CloseCode.KEY_REVOKED
    for node in (a, b):
        assert await refused(f"{node.url}?token={token}") == 401
        assert await refused(node.url, additional_headers=alice) == 401
    await bob.send({"type": "ping"})  # another key's connection is not touched
    assert isinstance(await bob.next(), Pong)

    # A bare HDEL, announced to nobody: each node's own look finds it.
    started = time.monotonic()
    store.hdel("rtgw:keys", hash_key(keys["bob"]))
    code, at = await closed(bob)
    print(f"HDEL (unannounced) → 4401: token on A {at - started:.3f}s")
    assert code == CloseCode.KEY_REVOKED
    for node in (a, b):
        assert await refused(f"{node.url}?token={bob_token}") == 401
    store.close()


async def _exit(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    _, err = await proc.communicate()
    return await proc.wait(), err.decode()
