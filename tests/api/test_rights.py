"""Rights take effect at once (issue 29), in-process: a revoked key's connections and
tokens, and a tightened key policy reaching live sessions.

A keys file on one node with the memory store (no Redis: the file is all
there is), and a key policy file shared by two nodes on a real Redis. The
same checks across real node processes with the keys in Redis are in
tests/multinode/test_rights.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from gateway.cli import main
from gateway.edge.closes import CloseCode
from gateway.sessions.node import POLICY_REOPENS_PER_SECOND
from protocol.events import Configured, Pong, Result
from tests.api.conftest import Api, Keys, NodesFactory
from tests.edge.conftest import refusal
from tests.support.client import GatewayClient

pytestmark = pytest.mark.timeout(60)

CLOSE_WITHIN = 5.0  # a deadline for the wait, not the figure: that is printed (~0.5 s)


async def closed(client: GatewayClient, timeout: float = CLOSE_WITHIN) -> tuple[int | None, float]:
    """Read until the server closes the connection: its close code and when (monotonic)."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                await client.ws.recv()
    except ConnectionClosed as exc:
        return (exc.rcvd.code if exc.rcvd is not None else None), time.monotonic()


async def mint(api: Api, key: str) -> tuple[str, str]:
    status, minted = await api.call("POST", "/v1/sessions", key=key)
    assert status == 201, minted
    return minted["session_id"], minted["client_token"]


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_revoking_a_file_key_closes_its_connections_and_refuses_its_tokens(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession
) -> None:
    async with nodes(1) as (gw,):
        api = Api(gw, http)
        alice = keys.keys["alice"]
        _, token = await mint(api, alice)
        page = await GatewayClient.connect(f"{gw.url}?token={token}")
        backend = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        other = await GatewayClient.connect(gw.url, headers=keys.bearer("bob"))
        await page.turn("hello")

        started = time.monotonic()
        assert main(["keys", "revoke", "alice", "--file", str(keys.path)]) == 0
        (page_code, page_at), (backend_code, backend_at) = await asyncio.gather(
            closed(page), closed(backend)
        )
        print(
            f"file revoke → 4401: token {page_at - started:.3f}s, key {backend_at - started:.3f}s"
        )
        assert page_code == backend_code == CloseCode.KEY_REVOKED

        status, body, _ = await refusal(f"{gw.url}?token={token}")
        assert status == 401 and "revoked" in body
        status, _, _ = await refusal(gw.url, additional_headers=keys.bearer("alice"))
        assert status == 401
        assert (await api.call("POST", "/v1/sessions", key=alice))[0] == 401
        # Another key's connection is not touched.
        await other.send({"type": "ping"})
        assert isinstance(await other.next(), Pong)
        await other.close()


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_sighup_revokes_without_waiting_for_the_file_check(
    nodes: NodesFactory, keys: Keys
) -> None:
    async with nodes(1) as (gw,):
        key_file = gw.edges.key_file
        assert key_file is not None
        key_file.check_interval = 3600.0  # only the explicit reload reads the file
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("bob"))
        del keys.keys["bob"]
        keys.write()
        gw.edges.reload_keys()  # what SIGHUP does
        code, _ = await closed(client)
        assert code == CloseCode.KEY_REVOKED


async def test_a_tightened_policy_reaches_live_sessions_from_their_next_step(
    nodes: NodesFactory, keys: Keys, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[alice]\nserver_tools = ["read", "list"]\n')
    async with nodes(2, key_policy_file=str(policy)) as (a, b):
        driver = await GatewayClient.connect(a.url, headers=keys.bearer("alice"))
        events = await driver.turn('/tool list {"path": "."}')
        assert _results(events) == ["success"]
        # A second client through node B follows the session node A drives.
        follower = await GatewayClient.connect(
            b.url,
            session_id=driver.sid,
            after=driver.last_seq,
            headers=keys.bearer("alice"),
            max_queue=None,  # it reads no further than `configured`, and must still take the close
        )

        started = time.monotonic()
        policy.write_text('[alice]\nserver_tools = ["read"]\n')
        for client in (driver, follower):
            await client.until(lambda e: isinstance(e, Configured), timeout=CLOSE_WITHIN)
        print(f"policy file changed → configured: {time.monotonic() - started:.3f}s")

        events = await driver.turn('/tool list {"path": "."}')
        result = next(e for e in events if isinstance(e, Result))
        [withdrawn] = orjson.loads(result.content)
        assert withdrawn["status"] == "failure" and "not available" in withdrawn["content"]
        assert "its tools are: read" in withdrawn["content"]
        events = await driver.turn("/instructions")  # the model's prompt lists read only
        prompt = "".join(getattr(e, "content", "") for e in events if type(e).__name__ == "Respond")
        assert "- read:" in prompt and "- list:" not in prompt
        await asyncio.gather(driver.close(), follower.close())


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_policy_edit_replaces_listening_connections_a_few_at_a_time(
    nodes: NodesFactory, keys: Keys, tmp_path: Path
) -> None:
    """A policy edit that changes the tools of every listening voice session here: their
    provider connections are replaced ``POLICY_REOPENS_PER_SECOND`` a second, not all in
    the same moment (one open per session at once on the deployment's key)."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[alice]\nserver_tools = ["read", "list"]\n')
    async with nodes(1, key_policy_file=str(policy)) as (gw,):
        clients = [
            await GatewayClient.connect(gw.url, headers=keys.bearer("alice")) for _ in range(4)
        ]
        for client in clients:
            await client.send({"type": "configure", "input_audio": {"rate": 24000}})
            await client.until_type("configured")
            await client.send(bytes(960))  # a microphone's frame: the session listens
        runtimes = [gw.node.runtimes[c.sid] for c in clients]
        assert all(r.listening for r in runtimes)
        policy.write_text('[alice]\nserver_tools = ["read"]\n')
        for client in clients:
            await client.until(lambda e: isinstance(e, Configured), timeout=CLOSE_WITHIN)
        not_before = sorted(r.driver.asker.reopens.postponed_to for r in runtimes)
        await asyncio.gather(*(c.close() for c in clients))
    gaps = [later - earlier for earlier, later in itertools.pairwise(not_before)]
    assert gaps == pytest.approx([1 / POLICY_REOPENS_PER_SECOND] * 3, abs=0.01), gaps


def _results(events: list[object]) -> list[str]:
    return [r["status"] for e in events if isinstance(e, Result) for r in orjson.loads(e.content)]
