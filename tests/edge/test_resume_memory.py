"""A resume from ``after=0`` over a log of large events, on a real Redis: bounded memory.

The log holds 40 turns of a 400 KB message and its 400 KB echo (about 32 MB).
The node's allocations are traced (``tracemalloc``) while a client resumes the
session from the start and reads every event: the replay goes a page (1 MiB)
at a time, so it allocates a few pages whatever the log's size; loading the
session on a node that does not hold it reads its history a page at a time,
so the history is held once (its items), not twice (its bytes and its items).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.app import running_gateway
from gateway.config import load_config
from gateway.edge.server import Gateway
from tests.support.client import GatewayClient

pytestmark = pytest.mark.timeout(180)

TURNS = 40
SIZE = 400_000
MIB = 1 << 20


@pytest.fixture
async def gateway(redis_url: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = {
        "port": 0,
        "redis_url": redis_url,
        "workspace_root": str(tmp_path / "ws"),
        "sim_chunk_size": 1_000_000,  # one delta per answer: large events
        "lease_ttl": 3.0,
        # 16 MB of messages in a few seconds: over a client's rate (a frame counts once
        # per 64 KiB), which this test of memory does not measure.
        "client_frames_per_second": 0.0,
    }
    async with running_gateway(load_config(settings, env={})) as gw:
        yield gw


async def large_log(gw: Gateway) -> tuple[str, int]:
    client = await GatewayClient.connect(gw.url)
    last = 0
    for n in range(TURNS):
        await client.turn(f"{n} " + "x" * SIZE)
        last = client.last_seq
        client.events.clear()
    await client.close()
    return client.sid, last


async def replay_all(url: str, sid: str, last: int) -> int:
    """Read every event from the start, as a client resuming with after=0; bytes read."""
    read = 0
    async with connect(f"{url}?session_id={sid}&after=0", max_size=None) as ws:
        await ws.recv()  # session
        while True:
            frame = await asyncio.wait_for(ws.recv(), 60)
            read += len(frame)
            if orjson.loads(frame).get("seq", 0) >= last:
                return read


def traced_peak() -> int:
    return tracemalloc.get_traced_memory()[1]


async def test_a_replay_from_the_start_allocates_pages_not_the_log(gateway: Gateway) -> None:
    sid, last = await large_log(gateway)
    # Keep the session loaded (a client at the log's end): only the replay is measured.
    async with connect(f"{gateway.url}?session_id={sid}&after={last}", max_size=None) as keep:
        await keep.recv()
        gc.collect()
        tracemalloc.start()
        try:
            read = await replay_all(gateway.url, sid, last)
            peak = traced_peak()
        finally:
            tracemalloc.stop()
    assert read > 2 * TURNS * SIZE  # the whole log came
    assert peak < 16 * MIB, f"{peak / MIB:.0f} MiB allocated replaying {read / MIB:.0f} MiB"


async def test_loading_a_session_holds_its_history_once(gateway: Gateway) -> None:
    sid, last = await large_log(gateway)
    async with asyncio.timeout(30):
        while sid in gateway.node.runtimes:  # noqa: ASYNC110 - no event to await
            await asyncio.sleep(0.05)
    history = sum(len(b) for b in await gateway.node.store.read_history(sid))
    gc.collect()
    tracemalloc.start()
    try:
        read = await replay_all(gateway.url, sid, last)
        peak = traced_peak()
    finally:
        tracemalloc.stop()
    assert read > 2 * TURNS * SIZE
    # The items (about the history's size) and a page or two; reading it whole made 2x.
    assert peak < history * 1.35 + 16 * MIB, (
        f"{peak / MIB:.0f} MiB allocated loading {history / MIB:.0f} MiB of history"
    )


def held_by(snapshot: tracemalloc.Snapshot, *places: str) -> int:
    """Bytes still allocated by code whose traceback passes through any of ``places``."""
    return sum(
        stat.size
        for stat in snapshot.statistics("traceback")
        if any(place in frame.filename for frame in stat.traceback for place in places)
    )


async def test_a_closed_sessions_conversation_is_freed_without_a_full_collection(
    gateway: Gateway,
) -> None:
    """Found by measuring a README node: 20 messages of 900 kB a session grew it ~40 MB
    a session, kept past the store's budget. A closed runtime, and the in-process
    simulator's connection, are cycles of objects, freed by a full collection only,
    which ``gateway serve``'s thresholds make rare (as disabled here): with them went
    the session's whole conversation. The store's copy (bytes) is all that stays."""
    gc.collect()
    gc.disable()
    tracemalloc.start(32)
    try:
        sid, _ = await large_log(gateway)
        async with asyncio.timeout(30):
            while sid in gateway.node.runtimes:  # noqa: ASYNC110 - no event to await
                await asyncio.sleep(0.05)
        places = ("client_frames.py", "/gateway/sim/")
        async with asyncio.timeout(30):
            while (held := held_by(tracemalloc.take_snapshot(), *places)) > 4 * MIB:  # noqa: ASYNC110 - freed memory sends no event
                await asyncio.sleep(0.2)
    except TimeoutError:
        pytest.fail(f"{held / MIB:.0f} MiB of a closed session's messages still held")
    finally:
        tracemalloc.stop()
        gc.enable()
