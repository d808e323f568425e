"""Which browser pages may open a WebSocket to a node (issue 13.4).

An open dev node (loopback, no keys) accepted every Origin: any web page the
developer visited could drive it. The Origin's host is never compared with the
request's Host header, which a DNS-rebinding page controls.
"""

from __future__ import annotations

import pytest
from websockets.asyncio.client import connect
from websockets.typing import Origin

from gateway.edge.admission import origin_allowed
from protocol.events import Session, decode_event
from tests.edge.conftest import GatewayFactory, Keys, refusal

memory_only = pytest.mark.parametrize("store_kind", ["memory"])

LOCAL = ("127.0.0.1", 8765)


def test_an_open_node_accepts_loopback_pages_only() -> None:
    def ok(origin: str) -> bool:
        return origin_allowed(origin, frozenset(), auth_on=False, local_address=LOCAL)

    for origin in (
        "http://localhost:5173",
        "https://localhost",
        "http://127.0.0.1:3000",
        "http://127.1.2.3:9",
        "http://[::1]:8080",
    ):
        assert ok(origin), origin
    for origin in (
        "https://evil.example",
        "http://evil.example:8765",  # DNS rebinding: a name, whatever it resolves to
        "http://localhost.evil.example",
        "http://192.168.1.5:8765",
        "null",  # sandboxed frames and file: pages
        "file://",
        "ws://localhost",
    ):
        assert not ok(origin), origin


def test_the_allow_list_decides_when_set_and_the_own_page_always_may() -> None:
    allowed = frozenset({"https://app.example"})
    assert origin_allowed("https://app.example", allowed, auth_on=False, local_address=LOCAL)
    assert not origin_allowed("http://localhost:5173", allowed, auth_on=False, local_address=LOCAL)
    # The node's own page: the address and port the connection arrived on.
    assert origin_allowed("http://127.0.0.1:8765", allowed, auth_on=False, local_address=LOCAL)
    assert origin_allowed("http://localhost:8765", allowed, auth_on=False, local_address=LOCAL)
    assert not origin_allowed("http://localhost:8766", allowed, auth_on=False, local_address=LOCAL)
    lan = ("10.0.0.5", 8765)
    assert origin_allowed("http://10.0.0.5:8765", allowed, auth_on=True, local_address=lan)
    assert not origin_allowed("http://localhost:8765", allowed, auth_on=True, local_address=lan)
    assert origin_allowed(
        "https://anything.example", frozenset({"*"}), auth_on=False, local_address=LOCAL
    )


def test_with_keys_and_no_list_any_page_may_try_its_key() -> None:
    assert origin_allowed("https://app.example", frozenset(), auth_on=True, local_address=LOCAL)


@memory_only
async def test_an_open_dev_node_refuses_foreign_pages_even_with_a_rebound_host(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        # A page from another site: refused, and told why.
        status, body, _ = await refusal(gw.url, origin=Origin("https://evil.example"))
        assert status == 403 and "without API keys" in body
        # DNS rebinding: evil.example now resolves to 127.0.0.1, so the browser
        # sends Host: evil.example:PORT and a matching Origin. Still refused.
        rebound = f"ws://evil.example:{gw.port}/v1/realtime"
        status, _, _ = await refusal(
            rebound,
            origin=Origin(f"http://evil.example:{gw.port}"),
            host="127.0.0.1",
            port=gw.port,
        )
        assert status == 403
        # The node's own page, other local dev pages, and non-browser clients connect.
        for origin in (f"http://127.0.0.1:{gw.port}", "http://localhost:5173", None):
            async with connect(gw.url, origin=Origin(origin) if origin else None) as ws:
                assert isinstance(decode_event(await ws.recv()), Session)


@memory_only
async def test_a_node_with_keys_accepts_pages_that_bring_a_key(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        async with connect(
            gw.url,
            origin=Origin("https://app.example"),
            additional_headers=keys.bearer("alice"),
        ) as ws:
            assert isinstance(decode_event(await ws.recv()), Session)
        status, _, _ = await refusal(gw.url, origin=Origin("https://app.example"))
        assert status == 401  # the page still needs a key
