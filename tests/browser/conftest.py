"""Fixtures for the page tests: a gateway subprocess per test, one Chromium per module.

The gateway runs as a real ``gateway serve`` subprocess (what users run), and
the page runs in Debian's Chromium driven by Playwright, so the tests cover
the served files, the CSP, the WebSocket and the JavaScript together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.procs import NodeProcess

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

StartGateway = Callable[..., NodeProcess]

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every page test slow (a real Chromium and a gateway subprocess each).

    The hook sees the whole session's items, so it marks only those under this directory.
    """
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def start_gateway() -> Iterator[StartGateway]:
    """``start_gateway("--sim-tokens-per-second", "20")``: a listening node, killed after the test."""
    nodes: list[NodeProcess] = []

    def start(*args: str) -> NodeProcess:
        node = NodeProcess(["serve", "--port", "0", *args]).start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        # SIGKILL: a drain would wait for a turn a failed test left running.
        node.kill()
