"""A session the HTTP API made is new to its first client (issue 38): ``resumed`` is
false on its first connection and true on the next."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.client import Client
from tests.api.conftest import Api, Keys, NodesFactory

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_the_first_connection_to_a_minted_session_is_not_a_resume(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession
) -> None:
    async with nodes(1) as (gw,):
        status, minted = await Api(gw, http).call("POST", "/v1/sessions", key=keys.keys["alice"])
        assert status == 201, minted
        async with Client(gw.url, token=minted["client_token"]) as first:
            assert first.session is not None and first.session.resumed is False
            [e async for e in first.send("hello")]
        async with Client(gw.url, token=minted["client_token"]) as second:
            assert second.session is not None and second.session.resumed is True
