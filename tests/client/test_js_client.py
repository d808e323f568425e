"""The JavaScript client (gateway/console/static/client.js) under Node's test runner.

The tests themselves are in tests/client/js/*.test.mjs; this starts what they
talk to — a real gateway with a paced simulator, and a scripted server asking
for a client tool — and runs ``node --test`` against them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from tests.client.scripted import tool_server
from tests.gateway.conftest import GatewayFactory
from tests.support.redis_server import free_port

JS_TESTS = Path(__file__).parent / "js"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_the_js_client_passes_its_node_tests(
    gateway_factory: GatewayFactory, store_kind: str
) -> None:
    async with gateway_factory(sim_tokens_per_second=150.0) as gw, tool_server() as tools:
        env = {
            **os.environ,
            "GATEWAY_URL": gw.url,
            "TOOL_SERVER_URL": tools,
            "FREE_PORT": str(free_port()),
        }
        proc = await asyncio.create_subprocess_exec(
            "node",
            "--test",
            "--test-reporter=spec",
            *sorted(str(p) for p in JS_TESTS.glob("*.test.mjs")),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 50)
    assert proc.returncode == 0, out.decode()
