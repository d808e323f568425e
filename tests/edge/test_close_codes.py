"""The close codes a client acts on, each from the situation that sends it (docs/protocol.md "Close codes")."""

from __future__ import annotations

from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.edge.health import StoreProbe
from protocol.events import Respond
from tests.edge.conftest import GatewayFactory
from tests.support.client import GatewayClient
from tests.support.redis_server import RedisServer

memory_only = pytest.mark.parametrize("store_kind", ["memory"])


@memory_only
async def test_a_node_that_stops_closes_its_clients_with_1001_mid_turn(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(sim_tokens_per_second=20.0) as gw:
        client = await GatewayClient.connect(gw.url)
        await client.user("a long answer that is still streaming when the node stops")
        await client.until(lambda e: isinstance(e, Respond))
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await client.next(timeout=10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1001  # going away: reconnect (to another node)


@memory_only  # the gateway's store is a redis-server of this test's own, killed mid-test
async def test_a_store_that_fails_after_the_handshake_closes_with_1013(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """The readiness probe said the store was up; the session's lease then could not be
    taken: the client is told to retry later (1013), not left with a dead socket."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        async with gateway_factory(redis_url=server.url, store_retry_window=0.2) as gw:
            # The probe's answer is kept for a second; its clock here stands still until
            # moved, so the store dies within the time the answer "up" is kept.
            now = [0.0]
            gw.store_probe = StoreProbe(gw.node.store, clock=lambda: now[0])
            client = await GatewayClient.connect(gw.url)  # the probe asks: up
            await client.close()
            server.kill()
            async with connect(gw.url) as ws:
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1013
            assert closed.value.rcvd.reason == "session store unavailable; retry"
            server.start()  # on the same port
            now[0] += 60.0  # the probe asks again
            client = await GatewayClient.connect(gw.url)  # once it is back, clients are served
            await client.turn("hello")
            await client.close()
    finally:
        server.stop()
