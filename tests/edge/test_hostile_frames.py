"""One client's frames cannot take the node's loop or memory (issue 38): probes from outside.

A ``gateway serve`` process (memory store, no keys); a client opens a
WebSocket by hand and writes, without reading, what the issue's probes
wrote: a message in 1,048,574 one-byte fragments (before: ``/healthz`` 12-26
s, +286-304 MB, 5.4 s of the node's CPU), and a flood of pings whose pongs it
never reads (108 MB before: ``/healthz`` 5.8-9.1 s, +154 MB). The node's CPU
time and memory are the sharp checks (they do not grow with the machine's
load); ``/healthz`` must answer after, and another client's turn works.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.client import GatewayClient
from tests.support.hostile import PING, PeakRss, fragments, raw_flood
from tests.support.procs import NodeProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

CPU = 1.0
"""CPU seconds of the node a probe may cost: measured 0.05-0.1 s after the fix (5.4 s
for the fragments before it, ~3 s for 20 MB of pings)."""
MEMORY = 48 << 20
"""RSS growth a probe may cost: +2-4 MB measured after the fix, +150-300 MB before."""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    root: Path = tmp_path_factory.mktemp("frames")
    args = ["serve", "--port", "0", "--workspace-root", str(root / "ws")]
    with NodeProcess(args, env={"REDIS_URL": ""}) as proc:
        yield proc


async def healthy(node: NodeProcess) -> float:
    started = time.monotonic()
    async with aiohttp.ClientSession() as http, http.get(node.http + "/healthz") as r:
        assert r.status == 200
    return time.monotonic() - started


async def another_turn(node: NodeProcess) -> None:
    client = await GatewayClient.connect(node.url)
    events = await client.turn("hello")
    assert any(type(e).__name__ == "End" for e in events), events
    await client.close()


async def test_a_message_in_a_million_fragments_is_closed_with_1009(node: NodeProcess) -> None:
    assert node.proc is not None
    await another_turn(node)  # warm: the node's first session costs its imports
    with PeakRss(node.proc.pid) as memory:
        said = await raw_flood(node.url, fragments(1_048_574), 1 << 16)
    print(f"\n[fragments] {said}; node CPU {memory.cpu:.2f} s, RSS +{memory.grew >> 20} MiB")
    assert "1009" in said or "cut off" in said, said
    assert memory.cpu < CPU and memory.grew < MEMORY
    assert await healthy(node) < 5.0
    await another_turn(node)


async def test_pings_never_read_are_closed_with_1008(node: NodeProcess) -> None:
    assert node.proc is not None
    await another_turn(node)
    flood = PING * 160_000  # 21 MB: what loopback's buffers take without the node reading
    with PeakRss(node.proc.pid) as memory:
        async with asyncio.timeout(60):
            said = await raw_flood(node.url, flood, 1 << 16)
    print(f"\n[pings] {said}; node CPU {memory.cpu:.2f} s, RSS +{memory.grew >> 20} MiB")
    # The node ends the flood: a 1008, a reset while writing, or (when its close frame
    # was queued behind pongs the flooder never read) the connection closed or reset.
    ended = ("1008", "cut off", "closed without", "ConnectionResetError")
    assert any(word in said for word in ended), said
    assert memory.cpu < CPU and memory.grew < MEMORY
    assert await healthy(node) < 5.0
    await another_turn(node)


async def test_a_client_flooding_past_its_close_is_read_no_further(node: NodeProcess) -> None:
    """A client over its frame limit is closed 4029; one that goes on writing without
    reading was parsed frame by frame for the 2 s the node waited for its answer (a
    core, and the loop 50-80 ms a read). What it sends after the close is now dropped
    unparsed, up to 1 MiB, and then not read at all until the node cuts it off."""
    assert node.proc is not None
    await another_turn(node)
    tiny = b"\x82\x82" + b"\x00" * 4 + b"\x00\x00"  # a 2-byte binary frame, masked with zeros
    with PeakRss(node.proc.pid) as memory:
        async with asyncio.timeout(60):
            said = await raw_flood(node.url, tiny * (8 << 20), 1 << 16)  # 64 MiB
    print(f"\n[tiny frames] {said}; node CPU {memory.cpu:.2f} s, RSS +{memory.grew >> 20} MiB")
    assert "cut off" in said or "4029" in said, said
    assert memory.cpu < CPU and memory.grew < MEMORY
    assert await healthy(node) < 5.0
    await another_turn(node)
