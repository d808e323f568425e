"""Gateways with auth and limits, on both stores, plus helpers for refusals.

``gateway_factory`` is the one from tests/gateway (parametrized over the
memory and Redis stores); a test that only needs one store overrides it with
``@pytest.mark.parametrize("store_kind", ["memory"])``.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.edge.auth import hash_key
from gateway.edge.server import Gateway
from tests.gateway.conftest import GatewayFactory, gateway_factory, store_kind

__all__ = ["GatewayFactory", "gateway_factory", "store_kind"]

POLL = 0.01


class Keys:
    """A keys file with named keys; ``line`` and ``write`` make more."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys: dict[str, str] = {}

    def add(self, key_id: str, key: str | None = None) -> str:
        key = key or f"rtgw_test_{key_id}_{len(self.keys)}_secret"
        self.keys[key_id] = key
        self.write()
        return key

    def write(self) -> None:
        lines = ["# test keys", *(f"{i}:{hash_key(k)}" for i, k in self.keys.items())]
        self.path.write_text("\n".join(lines) + "\n")

    def bearer(self, key_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[key_id]}"}


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    k = Keys(tmp_path / "api-keys")
    k.add("alice")
    k.add("bob")
    return k


async def refusal(url: str, **kwargs: Any) -> tuple[int, str, dict[str, str]]:
    """Connect expecting an HTTP refusal: (status, body, headers)."""
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, **kwargs):
            pass
    response = info.value.response
    return response.status_code, response.body.decode(), dict(response.headers.raw_items())


async def http_get(gateway: Gateway, path: str) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{gateway.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(get)


async def poll_until(check: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until true, for conditions that have no event to await
    (a slot freed by a connection-close watcher, a counter in another task)."""
    async with asyncio.timeout(10.0):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await asyncio.sleep(POLL)


def metric_value(text: str, name: str, labels: str = "") -> float:
    """The value of one series in Prometheus text output (0 when absent)."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series == wanted:
            return float(value)
    return 0.0
