"""Liveness (/healthz) and readiness (/readyz), issue 18.

Before, /healthz said 200 while Redis was down and every new client got 1013.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.edge.conftest import GatewayFactory, http_get, poll_until, refusal
from tests.support.client import GatewayClient
from tests.support.redis_server import RedisServer

memory_only = pytest.mark.parametrize("store_kind", ["memory"])


@memory_only
async def test_ready_while_serving_not_ready_when_full_or_draining(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(max_connections=1) as gw:
        assert await http_get(gw, "/healthz") == (200, "ok\n")
        assert await http_get(gw, "/readyz") == (200, "ready\n")
        client = await GatewayClient.connect(gw.url)
        status, body = await http_get(gw, "/readyz")
        assert status == 503 and "full" in body
        await client.close()

        async def ready() -> bool:
            return (await http_get(gw, "/readyz"))[0] == 200

        await poll_until(ready, "the slot to free")
        gw.node.draining = True  # as a drain starts
        status, body = await http_get(gw, "/readyz")
        assert status == 503 and "draining" in body
        assert (await http_get(gw, "/healthz"))[0] == 200  # alive: do not restart it
        gw.node.draining = False


@memory_only
async def test_not_ready_while_the_store_is_unreachable(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    redis = RedisServer(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    redis.start()
    try:
        async with gateway_factory(redis_url=redis.url) as gw:
            assert (await http_get(gw, "/readyz"))[0] == 200
            redis.stop()

            async def not_ready() -> bool:
                status, body = await http_get(gw, "/readyz")
                return status == 503 and "store" in body

            await poll_until(not_ready, "readiness to see the store down")  # cached <= 1 s
            # New clients get a clean HTTP 503 at the handshake (was: open, then 1013).
            status, body, _ = await refusal(gw.url)
            assert status == 503 and "store" in body
            assert (await http_get(gw, "/healthz"))[0] == 200
            redis.start()

            async def ready() -> bool:
                return (await http_get(gw, "/readyz"))[0] == 200

            await poll_until(ready, "readiness to see the store back")
    finally:
        redis.stop()
