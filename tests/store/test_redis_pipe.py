"""The append pipe: the log writer's rounds answered by callback on one Redis connection.

Each test drives ``RedisStore.submit_appends`` (what the node's log writer
calls) against a real redis-server and checks what a session would see: its
result per append, the log in Redis, and failures reported as "maybe stored"
within the socket timeout, never a hang or a lost append.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.store import LeaseLost, LogEntry, RedisStore, SeqConflict, StoreUnavailable
from tests.store.test_store import LEASE, entries
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(30)

FAIL_FAST = 5.0
Batches = Sequence[tuple[str, str, Sequence[LogEntry], Sequence[bytes]]]


async def submit(store: RedisStore, batches: Batches) -> list[BaseException | None]:
    """One log-writer round; asserts the answer comes by callback, after the call returns."""
    answered: asyncio.Future[list[BaseException | None]] = (
        asyncio.get_running_loop().create_future()
    )
    returned = False

    def on_done(results: list[BaseException | None]) -> None:
        assert returned, "on_done was called from inside submit_appends"
        answered.set_result(results)

    store.submit_appends(batches, on_done)
    returned = True
    async with asyncio.timeout(FAIL_FAST):
        return await answered


async def until_on_pipe(store: RedisStore, sid: str, next_seq: int) -> int:
    """Append one event per round until a round went on the pipe; the next free seq."""
    before = store.stats.pipe_rounds
    async with asyncio.timeout(FAIL_FAST):
        while store.stats.pipe_rounds == before:
            assert await submit(store, [(sid, "n1", entries(next_seq, 1), [])]) == [None]
            next_seq += 1
    return next_seq


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStore]:
    made = RedisStore.from_url(redis_url)
    yield made
    await made.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_rounds_go_on_the_pipe_and_land_in_order(store: RedisStore) -> None:
    sids = ["a", "b", "c"]
    for sid in sids:
        assert await store.acquire_lease(sid, "n1", LEASE)
    next_seq = {"a": await until_on_pipe(store, "a", 1), "b": 1, "c": 1}
    pipe_rounds = store.stats.pipe_rounds
    for _ in range(20):
        round_ = [(sid, "n1", entries(next_seq[sid], 2), [b"h"]) for sid in sids]
        assert await submit(store, round_) == [None, None, None]
        for sid in sids:
            next_seq[sid] += 2
    assert store.stats.pipe_rounds == pipe_rounds + 20
    for sid in sids:
        log = await store.read_log(sid, 0, limit=10_000)
        assert [e.seq for e in log] == list(range(1, next_seq[sid]))
        assert len(await store.read_history(sid)) == 20


async def test_each_append_of_a_round_gets_its_own_verdict(store: RedisStore) -> None:
    assert await store.acquire_lease("mine", "n1", LEASE)
    assert await store.acquire_lease("theirs", "n2", LEASE)
    assert await store.acquire_lease("raced", "n1", LEASE)
    seq = await until_on_pipe(store, "mine", 1)
    await store.append("raced", "n1", entries(1, 3))

    results = await submit(
        store,
        [
            ("mine", "n1", entries(seq, 1), []),
            ("theirs", "n1", entries(1, 1), []),  # n2 holds it
            ("raced", "n1", entries(2, 1), []),  # the log already ends at 3
            ("mine", "n1", [LogEntry(seq + 1, b"x"), LogEntry(seq + 5, b"y")], []),  # a gap
        ],
    )

    assert results[0] is None
    assert isinstance(results[1], LeaseLost) and results[1].holder == "n2"
    assert isinstance(results[2], SeqConflict) and "ends at 3" in str(results[2])
    assert isinstance(results[3], ValueError) and "consecutive" in str(results[3])
    assert await store.last_seq("mine") == seq
    assert await store.last_seq("theirs") == 0


async def test_a_flushed_script_cache_costs_a_resend_not_an_append(
    store: RedisStore, raw: aioredis.Redis
) -> None:
    assert await store.acquire_lease("s", "n1", LEASE)
    seq = await until_on_pipe(store, "s", 1)
    await raw.script_flush()

    assert await submit(store, [("s", "n1", entries(seq, 2), [])]) == [None]

    assert store.stats.noscript_reloads >= 1
    assert [e.seq for e in await store.read_log("s", 0)] == list(range(1, seq + 2))


async def test_close_lets_a_round_in_flight_land(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url)
    assert await store.acquire_lease("s", "n1", LEASE)
    seq = await until_on_pipe(store, "s", 1)
    answered: asyncio.Future[list[BaseException | None]] = (
        asyncio.get_running_loop().create_future()
    )
    store.submit_appends([("s", "n1", entries(seq, 1), [])], answered.set_result)
    await store.close()

    assert await answered == [None]
    reader = RedisStore.from_url(redis_url)
    try:
        assert await reader.last_seq("s") == seq
    finally:
        await reader.close()


# --- outages -------------------------------------------------------------------


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    if server.proc is not None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


async def test_a_hung_redis_fails_the_round_within_the_timeout_then_recovers(
    own_server: RedisServer,
) -> None:
    assert own_server.proc is not None
    store = RedisStore.from_url(own_server.url, socket_timeout=0.5, connect_timeout=0.5)
    try:
        assert await store.acquire_lease("s", "n1", LEASE)
        seq = await until_on_pipe(store, "s", 1)

        os.kill(own_server.proc.pid, signal.SIGSTOP)
        (result,) = await submit(store, [("s", "n1", entries(seq, 1), [])])
        assert isinstance(result, StoreUnavailable)
        assert f"127.0.0.1:{own_server.port}" in str(result)
        assert "last_seq" in str(result)  # maybe stored: the session reads before resending
        os.kill(own_server.proc.pid, signal.SIGCONT)

        last = await store.last_seq("s")
        assert last in (seq - 1, seq)  # the append may or may not have landed
        await until_on_pipe(store, "s", last + 1)  # and the pipe is back
    finally:
        await store.close()


async def test_a_restart_while_idle_fails_no_round(own_server: RedisServer) -> None:
    store = RedisStore.from_url(own_server.url)
    try:
        assert await store.acquire_lease("s", "n1", LEASE)
        await until_on_pipe(store, "s", 1)
        await asyncio.to_thread(own_server.restart)  # empty again: no persistence
        assert await store.acquire_lease("s", "n1", LEASE)

        assert await submit(store, [("s", "n1", entries(1, 1), [])]) == [None]
        await until_on_pipe(store, "s", 2)
        assert [e.seq for e in await store.read_log("s", 0)][:2] == [1, 2]
    finally:
        await store.close()
