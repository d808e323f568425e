"""The HTTP side of the gateway's port: health, metrics, refusals at the handshake."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.edge.server import Gateway


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _http(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.port}"


async def test_healthz_and_metrics(gateway: Gateway) -> None:
    import asyncio

    status, body = await asyncio.to_thread(_get, _http(gateway) + "/healthz")
    assert (status, body) == (200, "ok\n")
    status, body = await asyncio.to_thread(_get, _http(gateway) + "/metrics")
    assert status == 200 and "rtgw_connections" in body


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ("?session_id=nope", 404, "does not exist"),
        ("?after=abc", 400, "not a seq"),
        # Found from outside: the last one silently won (which position a resume took).
        ("?after=3&after=4", 400, "after is given more than once, with different values"),
        ("?stream=token&stream=event", 400, "stream is given more than once"),
    ],
)
async def test_refusals_happen_at_the_handshake(
    gateway: Gateway, query: str, status: int, says: str
) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with connect(gateway.url + query):
            pass
    assert info.value.response.status_code == status
    assert says in info.value.response.body.decode()


async def test_unknown_paths_are_404(gateway: Gateway) -> None:
    import asyncio

    status, body = await asyncio.to_thread(_get, _http(gateway) + "/v2/other")
    assert status == 404 and "/v1/realtime" in body
