"""Gateways with the HTTP API on, API keys, and a small JSON client for the API.

``nodes(n)`` starts ``n`` in-process nodes sharing one real Redis (or, with
``store_kind`` memory, one node on the in-process store); each has its
WebSocket port and its API port on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.app import running_gateway
from gateway.config import load_config
from gateway.edge.server import Gateway
from tests.edge.conftest import Keys

__all__ = ["Api", "Keys", "NodesFactory"]

NodesFactory = Callable[..., AbstractAsyncContextManager[list[Gateway]]]


class Api:
    """JSON calls to one node's HTTP API: ``(status, body as JSON or text)``."""

    def __init__(self, gateway: Gateway, http: aiohttp.ClientSession) -> None:
        self.base = gateway.api_url
        self.http = http

    async def call(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        json: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        if json is not None:
            data = orjson.dumps(json)
            sent.setdefault("Content-Type", "application/json")
        async with self.http.request(method, self.base + path, data=data, headers=sent) as r:
            text = await r.text()
            try:
                return r.status, await r.json(content_type=None) if text else None
            except ValueError:
                return r.status, text


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    k = Keys(tmp_path / "api-keys")
    k.add("alice")
    k.add("bob")
    return k


@pytest.fixture(params=["redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def nodes(
    store_kind: str, tmp_path: Path, keys: Keys, request: pytest.FixtureRequest
) -> NodesFactory:
    redis_url = request.getfixturevalue("redis_url") if store_kind == "redis" else ""

    @contextlib.asynccontextmanager
    async def start(count: int = 1, **overrides: Any) -> AsyncIterator[list[Gateway]]:
        async with contextlib.AsyncExitStack() as stack:
            started = []
            for n in range(count):
                settings: dict[str, Any] = {
                    "port": 0,
                    "api_port": 0,
                    "redis_url": redis_url,
                    "workspace_root": str(tmp_path / f"workspaces-{n}"),
                    "lease_ttl": 3.0,
                    "api_keys_file": str(keys.path),
                    "node_id": f"node-{n}",
                }
                settings.update(overrides)
                gw = await stack.enter_async_context(running_gateway(load_config(settings, env={})))
                started.append(gw)
            yield started

    return start


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
