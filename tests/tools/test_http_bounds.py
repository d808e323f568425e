"""HTTP tools are bounded in bytes and time against a hostile endpoint (issue 29).

Reading whole bodies, a 1 GB answer or a ~1 MB gzip bomb held the node's
loop for 10–19 s and grew its RSS by 2.5–4.1 GB; a body dripped at a byte a
second ran 30 s past ``timeout = 3``. Each test here makes the call through
the real executor while watching the loop (ticks every 20 ms, with a last
reading at the end) and the process's peak RSS, and prints the figures.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol.calls import ToolCall, ToolResult
from tools.base import ToolContext
from tools.executor import Executor
from tools.providers.http import HttpTool, HttpToolSpec, body_limit, http_client
from tools.registry import Registry

from .helpers import failed, footprint, ok
from .servers.hostile_http import BOMB, GIB, HostileServer, hostile_server

pytestmark = pytest.mark.timeout(30)

MAX_OUTPUT = 64_000
TIMEOUT = 2.0
_MAX_GAP = 2.5
"""A loaded machine's margin: ticks came within 11-37 ms here; the unbounded reader held the
loop 10+ s (4x this)."""
_MAX_RSS_MB = 100.0


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    with hostile_server() as srv:
        yield srv


@pytest.fixture
async def call(server: HostileServer, tmp_path: Path) -> AsyncIterator[Any]:
    names = ("huge", "bomb", "drip", "pretty", "gzip", "brotli")
    async with http_client() as client:
        tools = [
            HttpTool(
                HttpToolSpec(
                    name=name,
                    url=f"{server.base}/{name}",
                    description=f"the {name} endpoint",
                    parameters={"type": "object"},
                    timeout=TIMEOUT,
                ),
                client,
            )
            for name in names
        ]
        registry = Registry(tools)
        ctx = ToolContext(workspace=tmp_path, session_id="sess-h")

        async def run(tool: str, max_output: int = MAX_OUTPUT) -> ToolResult:
            executor = Executor(registry, timeout=30.0, per_tool_max_output={tool: max_output})
            return await executor.run_call(ToolCall(name=tool, args={}), ctx)

        yield run


async def test_a_1gb_body_is_cut_at_the_limit_and_fails_at_once(
    call: Any, server: HostileServer
) -> None:
    async with footprint() as cost:
        message = failed(await call("huge"))
    print(f"\n1 GiB body: {cost}; the server wrote {server.sent['/huge']:,} bytes")
    limit = body_limit(MAX_OUTPUT)
    assert f"'huge' answered more than {limit:,} bytes" in message
    assert "Ask for less at once" in message
    assert cost.seconds < TIMEOUT
    assert cost.max_gap < _MAX_GAP, cost
    assert cost.rss_growth_mb < _MAX_RSS_MB, cost
    assert server.sent["/huge"] < GIB // 4  # it stopped reading; the kernel buffered the rest


async def test_a_gzip_bomb_is_refused_after_its_first_inflated_piece(
    call: Any, server: HostileServer
) -> None:
    async with footprint() as cost:
        message = failed(await call("bomb"))
    print(f"\ngzip bomb ({len(BOMB):,} bytes → 1 GiB): {cost}")
    assert "'bomb' answered a gzip-compressed body that expands past" in message
    assert f"{body_limit(MAX_OUTPUT):,} bytes" in message
    assert cost.seconds < TIMEOUT
    assert cost.max_gap < _MAX_GAP, cost
    assert cost.rss_growth_mb < _MAX_RSS_MB, cost


async def test_a_drip_fails_at_the_deadline_of_the_whole_call(call: Any) -> None:
    """One byte a second never trips a per-read timeout; the section's timeout is a deadline."""
    started = time.monotonic()
    async with footprint() as cost:
        message = failed(await call("drip"))
    elapsed = time.monotonic() - started
    print(f"\n1 byte/s drip, timeout {TIMEOUT:g}s: failed after {elapsed:.2f} s; {cost}")
    assert f"'drip' did not answer within {TIMEOUT:g}s" in message
    assert "bytes of its body by then" in message
    # Not before the deadline; after it, within a loaded machine's 5x (2.00 s measured),
    # where the unbounded reader ran 30 s past it.
    assert TIMEOUT - 0.1 <= elapsed < TIMEOUT * 5
    assert cost.max_gap < _MAX_GAP, cost


async def test_a_pretty_printed_body_longer_than_the_cap_still_arrives_whole(call: Any) -> None:
    """The margin: 105 kB of indented JSON is 13 kB compact, under the 64 kB cap."""
    content = ok(await call("pretty"))
    assert isinstance(content, dict) and len(content["rows"]) > 1_000


async def test_the_limit_follows_the_tools_own_max_output(call: Any) -> None:
    message = failed(await call("pretty", max_output=30_000))
    assert f"'pretty' answered more than {body_limit(30_000):,} bytes" in message
    assert "more than one tool result keeps (30,000 bytes)" in message


async def test_a_small_gzip_body_is_inflated_and_read(call: Any) -> None:
    assert ok(await call("gzip")) == {"ok": True, "via": "gzip"}


async def test_an_encoding_the_gateway_did_not_ask_for_is_refused(call: Any) -> None:
    message = failed(await call("brotli"))
    assert "Content-Encoding 'br', which the gateway did not ask for" in message
