"""Client tests run against real gateways (the fixtures of tests/gateway), and gateway
processes on the built-in simulator (``recorded_gateway`` records every session)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import gateway, gateway_factory, store_kind
from tests.support.procs import NodeProcess
from tests.support.recorded import serve

__all__ = ["fresh_gateway", "gateway", "gateway_factory", "recorded_gateway", "store_kind"]


@pytest.fixture
def recorded_gateway(tmp_path: Path) -> Iterator[NodeProcess]:
    with serve(tmp_path, "--record") as node:
        yield node


@pytest.fixture
def fresh_gateway(tmp_path: Path) -> Iterator[NodeProcess]:
    with serve(tmp_path) as node:
        yield node
