"""Client tests run against real gateways (the fixtures of tests/gateway), and gateway
processes on the built-in simulator (``recorded_gateway`` records every session).

Recording a session and starting gateway processes take seconds: the CLI tests
of replay and eval share them per module (``module_recorded_gateway``,
``module_fresh_gateway``, ``recorded_file``: one exported recording, read-only
to the tests, which copy it to change it), and only a test that needs a
session of its own records one.
"""

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import gateway, gateway_factory, store_kind
from tests.support.procs import NodeProcess
from tests.support.recorded import exported, serve

__all__ = [
    "API_KEY",
    "fresh_gateway",
    "gateway",
    "gateway_factory",
    "keyed_gateway",
    "module_fresh_gateway",
    "module_recorded_gateway",
    "recorded_file",
    "recorded_gateway",
    "store_kind",
]

API_KEY = "rtgw-client-tests-key-0123456789"


@pytest.fixture
def recorded_gateway(tmp_path: Path) -> Iterator[NodeProcess]:
    with serve(tmp_path, "--record") as node:
        yield node


@pytest.fixture
def fresh_gateway(tmp_path: Path) -> Iterator[NodeProcess]:
    with serve(tmp_path) as node:
        yield node


@pytest.fixture(scope="module")
def module_recorded_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with serve(tmp_path_factory.mktemp("recorded"), "--record") as node:
        yield node


@pytest.fixture(scope="module")
def module_fresh_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with serve(tmp_path_factory.mktemp("fresh")) as node:
        yield node


@pytest.fixture(scope="module")
def keyed_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A gateway that takes ``API_KEY`` only (``--api-keys-file``)."""
    folder = tmp_path_factory.mktemp("keyed")
    keys = folder / "keys"
    keys.write_text(f"tests:{hashlib.sha256(API_KEY.encode()).hexdigest()}\n")
    with serve(folder, "--api-keys-file", str(keys)) as node:
        yield node


@pytest.fixture(scope="module")
def recorded_file(
    module_recorded_gateway: NodeProcess, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A recorded session (a tool call, a cancel, /instructions), exported once per module."""
    return asyncio.run(exported(module_recorded_gateway, tmp_path_factory.mktemp("recording")))
