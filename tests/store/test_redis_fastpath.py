"""Canaries for ``gateway.store.redis_fastpath``: fail loudly if redis-py changes under it.

The shortcuts rely on a connected redis-py asyncio ``Connection`` reading from
an ``asyncio.StreamReader`` at ``_reader``, and on RESP packing equal to
redis-py's own. If one of these fails after a redis-py upgrade, set
``BatchSender.bulk_replies = False`` (redis-py's parser) until the fast path is
adapted, and re-measure with ``tests/bench/store_bench.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from gateway.store.redis_fastpath import (
    bulk,
    closed_by_server,
    fast_replies,
    join_bulk,
    pack_append,
    pack_xadd,
    reply_lines,
    take_transport,
)
from gateway.store.redis_scripts import APPEND
from gateway.store.redis_seqmemo import CHECK


@pytest.fixture
async def conn(redis_url: str) -> AsyncIterator[Connection]:
    client = Redis.from_url(redis_url, protocol=2)
    connection = await client.connection_pool.get_connection()
    assert isinstance(connection, Connection)
    await connection.connect()
    yield connection
    await client.connection_pool.release(connection)
    await client.aclose()


async def test_a_connected_connection_reads_from_a_stream_reader(conn: Connection) -> None:
    assert fast_replies(conn), (
        "redis-py no longer keeps an asyncio.StreamReader at Connection._reader: "
        "the bulk reply reads of gateway.store.redis_fastpath cannot work"
    )
    assert not closed_by_server(conn)


async def test_replies_read_in_bulk_are_redis_pys_replies(conn: Connection) -> None:
    await conn.send_packed_command(
        conn.pack_commands([("PING",), ("INCRBY", "n", 5), ("GET", "missing-but-ok")])
    )
    lines = [line async for chunk in reply_lines(conn, 3) for line in chunk]
    # GET of a missing key is a one-line reply ($-1); the append script's
    # replies are one line each by construction.
    assert lines == [b"+PONG", b":5", b"$-1"]


async def test_a_bare_xadd_is_redis_pys_and_its_bulk_reply_one_line(conn: Connection) -> None:
    """A bare append (``pack_xadd``) as redis-py packs it; its ID reply, and a nil,
    are one line each whatever the reads' boundaries (``join_bulk``)."""
    ours = pack_xadd(b"rtgw:{s1}:", bulk(b"50"), 7, b"a\r\nb")
    theirs = b"".join(
        conn.pack_commands(
            [("XADD", b"rtgw:{s1}:log", "NOMKSTREAM", "MAXLEN", "~", 50, "7-0", "d", b"a\r\nb")]
        )
    )
    assert ours == theirs
    key = b"rtgw:{fastpath-bare}:"
    made = conn.pack_commands([("DEL", key + b"log"), ("XADD", key + b"log", "6-0", "d", "x")])
    seven = pack_xadd(key, bulk(b"50"), 7, b"a")
    gone = pack_xadd(b"rtgw:{fastpath-gone}:", bulk(b"50"), 1, b"x")
    await conn.send_packed_command([*made, seven, gone, seven])
    lines = [line async for chunk in reply_lines(conn, 5) for line in chunk]
    assert lines[2:4] == [b"$7-0", b"$-1"]  # stored; a missing log is not made (nil)
    assert lines[4].startswith(b"-ERR") and b"smaller" in lines[4]  # at or below the last
    # A header whose value is in the next read goes back to be read again.
    assert join_bulk([b":1", b"$3"]) == ([b":1"], b"$3\r\n")
    assert join_bulk([b"$3", b"7-0", b"$-1"]) == ([b"$7-0", b"$-1"], b"")


async def test_packing_matches_redis_py(conn: Connection) -> None:
    key, node = b"rtgw:{s1}:", b"n1"
    ours = pack_append(key, node, bulk(b"1000") + bulk(b"50"), 7, [b"a", b"\r\n"], [b"h"], CHECK)
    theirs = b"".join(
        conn.pack_commands(
            [
                (
                    "EVALSHA",
                    APPEND.sha,
                    4,
                    key + b"meta",
                    key + b"log",
                    key + b"history",
                    key + b"lease",
                    node,
                    1000,
                    50,
                    7,
                    2,
                    1,
                    b"a",
                    b"\r\n",
                    b"h",
                )
            ]
        )
    )
    assert ours == theirs


async def test_a_connection_closed_by_the_server_is_seen(conn: Connection, redis_url: str) -> None:
    admin = Redis.from_url(redis_url)
    try:
        await conn.send_command("CLIENT", "ID")
        client_id = await conn.read_response()
        await admin.client_kill_filter(_id=client_id)

        async def seen() -> bool:
            return closed_by_server(conn)

        async with asyncio.timeout(5):
            while not await seen():  # noqa: ASYNC110 - the EOF has no event of ours
                await asyncio.sleep(0.01)
    finally:
        await admin.aclose()


async def test_a_connections_transport_can_be_read_by_another_protocol(redis_url: str) -> None:
    """What ``redis_pipe`` relies on: take the transport, set a protocol, get the replies."""
    client = Redis.from_url(redis_url, protocol=2)
    connection = client.connection_pool.make_connection()
    await connection.connect()
    try:
        transport = take_transport(connection)
        assert transport is not None, (
            "redis-py no longer writes through an asyncio.StreamWriter at Connection._writer: "
            "gateway.store.redis_pipe cannot take its transport"
        )
        got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        class Replies(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                if not got.done():
                    got.set_result(data)

        transport.set_protocol(Replies())
        transport.write(b"*1\r\n$4\r\nPING\r\n")
        async with asyncio.timeout(5):
            assert await got == b"+PONG\r\n"
        transport.abort()
    finally:
        await client.aclose()
