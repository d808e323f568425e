"""The simulated network (``tests.support.netem``): it delays, limits, cuts and stays bounded.

No upper bound on any time is asserted (the machine is shared); what a link
must never do is deliver *sooner* than its latency or bandwidth allow, lose
or reorder bytes, or hold more than its bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.netem import LatencyProxy, Link, NetemProcess
from tests.support.redis_topologies import ReplicatedRedis, wait_until

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def server(handler: Handler = _echo) -> AsyncIterator[int]:
    """A TCP server on loopback; its handlers are cancelled and awaited at the end."""
    tasks: set[asyncio.Task[None]] = set()

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await handler(reader, writer)

    srv = await asyncio.start_server(run, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_every_round_trip_takes_at_least_the_rtt() -> None:
    async with server() as port, LatencyProxy(("127.0.0.1", port), Link(rtt=0.02)) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        for _ in range(5):
            started = time.perf_counter()
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            assert time.perf_counter() - started >= 0.02
        writer.close()
        assert proxy.stats.connections == 1


async def test_jitter_keeps_every_byte_in_order() -> None:
    payload = os.urandom(300_000)
    link = Link(rtt=0.004, jitter=0.003)
    async with server() as port, LatencyProxy(("127.0.0.1", port), link, seed=7) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        for at in range(0, len(payload), 1000):  # many small chunks, each jittered
            writer.write(payload[at : at + 1000])
            await writer.drain()
        got = await reader.readexactly(len(payload))
        writer.close()
    assert got == payload


async def test_bandwidth_limits_how_soon_bytes_arrive() -> None:
    size = 200_000
    async with server() as port:
        link = Link(bandwidth=1_000_000)  # 1 MB/s: 200 kB takes at least 0.2 s one way
        async with LatencyProxy(("127.0.0.1", port), link) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            started = time.perf_counter()
            writer.write(b"x" * size)
            await reader.readexactly(size)
            # The echo streams back while the rest still goes up: one way's worth.
            assert time.perf_counter() - started >= size / 1_000_000
            writer.close()


async def test_a_reader_that_stops_reading_holds_only_the_bound() -> None:
    """A destination that reads nothing: the proxy stops reading at its bound, and
    loses nothing once the destination reads again."""
    paused = asyncio.Event()
    received = bytearray()
    done = asyncio.Event()
    size = 16 << 20

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await paused.wait()
        while len(received) < size:
            chunk = await reader.read(1 << 20)
            if not chunk:
                break
            received.extend(chunk)
        done.set()
        writer.close()

    bound = 512 << 10
    async with (
        server(slow) as port,
        LatencyProxy(("127.0.0.1", port), Link(rtt=0.001), max_buffer=bound) as proxy,
    ):
        _reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        payload = os.urandom(size)
        writer.write(payload)
        # The proxy must push back: the sender cannot hand everything over.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(writer.drain(), 1.0)
        assert proxy.stats.pauses >= 1
        # One read past the bound at most (asyncio reads up to 256 KiB at once).
        assert proxy.stats.max_queued <= bound + (256 << 10)
        paused.set()
        await asyncio.wait_for(done.wait(), 30)
        writer.close()
    assert bytes(received) == payload


async def test_cut_resets_both_ends_and_later_connections_work() -> None:
    server_saw: asyncio.Queue[BaseException | bytes] = asyncio.Queue()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            server_saw.put_nowait(await reader.read(100))
            server_saw.put_nowait(await reader.read(100))
        except ConnectionError as exc:
            server_saw.put_nowait(exc)
        writer.close()

    async with server(hold) as port, LatencyProxy(("127.0.0.1", port)) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"hello")
        assert await server_saw.get() == b"hello"  # the server holds the connection
        assert proxy.cut() == 1
        with pytest.raises(ConnectionResetError):
            await reader.read(100)
        after = await server_saw.get()
        assert after == b"" or isinstance(after, ConnectionResetError)
        # The route itself still works.
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"again")
        assert await server_saw.get() == b"again"
        writer.close()
        assert proxy.stats.cuts == 1


async def test_refusing_resets_new_connections() -> None:
    async with server() as port, LatencyProxy(("127.0.0.1", port)) as proxy:
        proxy.refusing = True
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        with pytest.raises(ConnectionResetError):
            writer.write(b"x")
            await writer.drain()
            await reader.read(1)
        proxy.refusing = False
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        writer.close()


async def test_a_held_link_delivers_when_it_heals() -> None:
    async with server() as port, LatencyProxy(("127.0.0.1", port)) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        proxy.held = True
        writer.write(b"later")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(5), 0.3)
        proxy.held = False
        assert await reader.readexactly(5) == b"later"
        writer.close()


async def test_half_close_reaches_the_other_side() -> None:
    async def answer_at_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client's EOF
        writer.write(data.upper())
        writer.close()

    async with (
        server(answer_at_eof) as port,
        LatencyProxy(("127.0.0.1", port), Link(rtt=0.002)) as proxy,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"abc")
        writer.write_eof()
        assert await reader.read() == b"ABC"  # the answer, then the server's end
        writer.close()


def test_link_parses_the_command_lines_form() -> None:
    assert Link.parse("1ms") == Link(rtt=0.001)
    assert Link.parse("2") == Link(rtt=0.002)
    assert Link.parse("rtt=500us,jitter=0.1ms,bandwidth=10MB") == Link(
        rtt=0.0005, jitter=0.0001, bandwidth=10e6
    )
    with pytest.raises(ValueError, match="use rtt, jitter, bandwidth"):
        Link.parse("latency=1ms")
    with pytest.raises(ValueError, match=">= 0"):
        Link(rtt=-1.0)


@pytest.mark.slow
def test_a_replica_replicates_through_the_proxy_process(tmp_path: Path) -> None:
    """primary ↔ replica: the replica dials the proxy; WAIT counts it; a cut is healed."""
    with NetemProcess() as netem:
        pair = ReplicatedRedis(tmp_path)
        port = netem.add("replica", ("127.0.0.1", pair.primary.port), Link(rtt=0.002))
        pair.start(replica_via=port)
        try:
            with pair.primary.client() as c:
                c.set("k", "v")
                assert c.execute_command("WAIT", 1, 2000) == 1
            stats = netem.stats("replica")
            assert stats.connections >= 1 and stats.bytes > 0
            assert netem.cut("replica") >= 1
            assert pair.replica is not None

            def synced_again() -> bool:
                assert pair.replica is not None
                with pair.replica.client() as r:
                    return r.info("replication")["master_link_status"] == "up"

            wait_until(synced_again, "the replica reconnects through the proxy")
            with pair.primary.client() as c:
                c.set("k2", "v2")
                assert c.execute_command("WAIT", 1, 5000) == 1
            with pair.replica.client() as r:
                assert r.get("k2") == b"v2"
        finally:
            pair.stop()
