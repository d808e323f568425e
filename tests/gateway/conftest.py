"""A real gateway node in-process (real sockets, real simulator, real store)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from gateway.app import running_gateway
from gateway.config import load_config
from gateway.edge.server import Gateway

GatewayFactory = Callable[..., AbstractAsyncContextManager[Gateway]]


@pytest.fixture(params=["memory", "redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def gateway_factory(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> GatewayFactory:
    """Start gateways with settings on top of test defaults, on the parametrized store."""
    redis_url = request.getfixturevalue("redis_url") if store_kind == "redis" else ""

    def factory(**overrides: Any) -> AbstractAsyncContextManager[Gateway]:
        settings: dict[str, Any] = {
            "port": 0,
            "redis_url": redis_url,
            "workspace_root": str(tmp_path / "workspaces"),
            "lease_ttl": 3.0,
        }
        settings.update(overrides)
        return running_gateway(load_config(settings, env={}))

    return factory


@pytest.fixture
async def gateway(gateway_factory: GatewayFactory) -> AsyncIterator[Gateway]:
    async with gateway_factory() as gw:
        yield gw
