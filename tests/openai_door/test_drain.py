"""A draining node closes a client of the OpenAI door with 1012 and tells it how to
resume through this door (``session_id`` and ``after_event``), not the gateway door's way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed

from tests.api.conftest import Keys, NodesFactory, keys, nodes, store_kind
from tests.openai_door.conftest import RawClient

__all__ = ["keys", "nodes", "store_kind"]

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_drain_closes_with_1012_naming_after_event(
    nodes: NodesFactory, keys: Keys, tmp_path: Path, store_kind: str
) -> None:
    async with nodes(1, api_port=None) as (gw,):
        bearer = {"Authorization": f"Bearer {keys.keys['alice']}"}
        url = f"ws://127.0.0.1:{gw.port}/openai/v1/realtime?model=gpt-realtime-2.1"
        client = await RawClient.open(url, additional_headers=bearer)
        assert (await client.next())["type"] == "session.created"
        drain = asyncio.create_task(gw.drain(timeout=1.0))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await client.next()
        await drain
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1012
    assert "after_event" in closed.value.rcvd.reason
