"""Issue 29 on the HTTP API: what one key sends cannot exhaust a node's memory or Redis.

Measured on main: ``GET …/events?limit=300`` over large events answered one
251 MB page (+845 MB in the node); 200 minted sessions with ~1 MB
configurations, never used, put 212 MB in Redis, each kept 86,397 s. Here:
export pages hold at most 1 MiB of events (one larger event comes alone) and
``next_after`` continues; a session nobody connects to is kept
``unused_session_ttl`` (seen as the PTTL of its Redis keys), its first
connection gives it ``session_ttl``; and the configurations of a key's
sessions count against ``config_bytes_per_key``.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as aioredis

from gateway.edge.api import PAGE_BYTES
from tests.api.conftest import Api, Keys, NodesFactory
from tests.edge.conftest import poll_until
from tests.support.client import GatewayClient

pytestmark = pytest.mark.timeout(60)

KB = 1000


def config_of(size: int) -> dict[str, Any]:
    """A ``POST /v1/sessions`` body whose stored configuration is about ``size`` bytes
    (in tools of 20 kB each: a tool schema may be 32 KiB)."""
    count = max(1, size // (20 * KB))
    schema = {"type": "object", "description": "x" * (size // count)}
    return {"tools": [{"name": f"big{n}", "parameters": schema} for n in range(count)]}


async def test_export_pages_are_bounded_by_bytes_and_continue(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession
) -> None:
    sizes = [300 * KB] * 3 + [1500 * KB] + [300 * KB] * 2
    # Big events: a user message and its echo, one chunk each (the answer is not chunked).
    async with nodes(1, max_frame=4 << 20, sim_chunk_size=4 << 20) as (gw,):
        alice = keys.keys["alice"]
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        for size in sizes:
            await client.turn("/raw " + "x" * size)
        sid = client.sid
        last = client.last_seq
        await client.close()

        pages: list[list[dict[str, Any]]] = []
        after, more = 0, True
        while more:
            url = f"{gw.api_url}/v1/sessions/{sid}/events?after={after}"
            async with http.get(url, headers={"Authorization": f"Bearer {alice}"}) as r:
                assert r.status == 200
                raw = await r.read()
            page = orjson.loads(raw)
            if len(page["events"]) > 1:
                assert len(raw) <= PAGE_BYTES + 1024, len(raw)  # events plus the envelope
            pages.append(page["events"])
            assert page["next_after"] == page["events"][-1]["seq"]
            after, more = page["next_after"], page["has_more"]

        seqs = [e["seq"] for p in pages for e in p]
        assert seqs == list(range(1, last + 1))
        # An event larger than a page comes alone: the 1.5 MB message and its echo.
        alone = [p for p in pages if any(len(e.get("content", "")) >= 1500 * KB for e in p)]
        assert len(alone) == 2 and all(len(p) == 1 for p in alone)
        assert max(len(p) for p in pages) > 1  # small events share a page

        # The count still bounds a page; past the end a page is empty.
        status, page = await Api(gw, http).call(
            "GET", f"/v1/sessions/{sid}/events?after=1&limit=1", key=alice
        )
        assert status == 200 and [e["seq"] for e in page["events"]] == [2] and page["has_more"]
        status, page = await Api(gw, http).call(
            "GET", f"/v1/sessions/{sid}/events?after={last}", key=alice
        )
        assert page == {
            "session_id": sid,
            "events": [],
            "next_after": last,
            "has_more": False,
        }


async def test_unused_sessions_go_soon_and_used_ones_stay(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession, redis_url: str
) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    try:
        async with nodes(1, unused_session_ttl=1.0) as (gw,):
            api = Api(gw, http)
            alice = keys.keys["alice"]
            (_, used), (_, unused) = [
                await api.call("POST", "/v1/sessions", key=alice) for _ in range(2)
            ]
            for minted in (used, unused):
                for kind in ("meta", "log", "history"):  # log and history: when they come
                    pttl = await raw.pttl(f"rtgw:{{{minted['session_id']}}}:{kind}")
                    assert pttl <= 1000 and (pttl > 0 or kind != "meta"), (kind, pttl)

            # A client connects (and sends nothing): the session is kept session_ttl.
            client = await GatewayClient.connect(f"{gw.url}?token={used['client_token']}")
            meta = f"rtgw:{{{used['session_id']}}}:meta"

            async def kept() -> bool:
                return int(await raw.pttl(meta)) > 86_000_000

            await poll_until(kept, "the used session gets the normal TTL")
            await client.close()

            async def gone() -> bool:
                path = f"/v1/sessions/{unused['session_id']}"
                return (await api.call("GET", path, key=alice))[0] == 404

            await poll_until(gone, "the unused session expires")
            assert (await api.call("GET", f"/v1/sessions/{used['session_id']}", key=alice))[
                0
            ] == 200
    finally:
        await raw.aclose()


async def test_configurations_count_against_a_per_key_quota(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession
) -> None:
    async with nodes(1, config_bytes_per_key=100 * KB, unused_session_ttl=1.0) as (gw,):
        api = Api(gw, http)
        alice, bob = keys.keys["alice"], keys.keys["bob"]
        made = []
        for _ in range(2):
            status, minted = await api.call(
                "POST", "/v1/sessions", key=alice, json=config_of(40 * KB)
            )
            assert status == 201, minted
            made.append(minted["session_id"])

        status, refused = await api.call("POST", "/v1/sessions", key=alice, json=config_of(40 * KB))
        assert status == 429, refused
        message = refused["error"]["message"]
        assert refused["error"]["code"] == "quota_exceeded"
        held = re.search(
            r"already store (\d+) bytes of configuration and this one is (\d+)", message
        )
        assert held and 80 * KB < int(held[1]) < 85 * KB and 40 * KB < int(held[2]) < 43 * KB
        assert "past its quota of 100000 bytes" in message
        assert "DELETE /v1/sessions/ID" in message and "--config-bytes-per-key" in message
        # Another key has its own quota; one configuration larger than a whole quota is 413.
        assert (await api.call("POST", "/v1/sessions", key=bob, json=config_of(40 * KB)))[0] == 201
        status, too_big = await api.call("POST", "/v1/sessions", key=bob, json=config_of(120 * KB))
        assert status == 413 and "more than this API key may store" in too_big["error"]["message"]

        # A deleted session gives its bytes back.
        assert (await api.call("DELETE", f"/v1/sessions/{made[0]}", key=alice))[0] == 204
        status, minted = await api.call("POST", "/v1/sessions", key=alice, json=config_of(40 * KB))
        assert status == 201, minted

        # So do unused sessions, once they expire.
        assert (await api.call("POST", "/v1/sessions", key=alice, json=config_of(40 * KB)))[
            0
        ] == 429

        async def freed() -> bool:
            status, _ = await api.call("POST", "/v1/sessions", key=alice, json=config_of(40 * KB))
            return status == 201

        await poll_until(freed, "the unused sessions' bytes come back")
