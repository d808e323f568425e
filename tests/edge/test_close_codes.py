"""The close codes a client acts on, each from the situation that sends it (README "Close codes")."""

from __future__ import annotations

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.store.base import StoreUnavailable
from protocol.events import Respond
from tests.edge.conftest import GatewayFactory
from tests.support.client import GatewayClient

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


@memory_only
async def test_a_store_that_fails_after_the_handshake_closes_with_1013(
    gateway_factory: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The readiness probe said the store was up; the session's lease then could not be
    taken: the client is told to retry later (1013), not left with a dead socket."""
    async with gateway_factory() as gw:

        async def down(*args: object) -> bool:
            raise StoreUnavailable("the store went away after the handshake")

        monkeypatch.setattr(gw.node.store, "acquire_lease", down)
        async with connect(gw.url) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1013
        assert closed.value.rcvd.reason == "session store unavailable; retry"
        monkeypatch.undo()
        client = await GatewayClient.connect(gw.url)  # once it is back, clients are served
        await client.close()
