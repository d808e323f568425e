"""Issue 29: connections that never finish their request cannot exhaust a node.

Measured on main: 200 connections that sent half a request line to the API
port stayed open 45 s+, and at ~1,030 (the default nofile limit) the node
could accept nothing, not even /healthz. Here, on an in-process node with
real sockets: both ports close a request that does not arrive within
``header_timeout``; the API answers 408 to a body that does not arrive within
``body_timeout``; one address holds at most ``unauthenticated_per_address``
connections that have not authenticated (its oldest goes), while other
addresses and authenticated connections are not touched; /readyz turns 503
before descriptors run out. The real-process version with 1,100 connections
is test_slow_connections.py.
"""

from __future__ import annotations

import asyncio
import resource
import time

import pytest

from gateway.edge.health import Descriptors, raise_descriptor_limit
from gateway.edge.server import Gateway
from tests.edge.conftest import GatewayFactory, Keys, http_get, metric_value, poll_until
from tests.support.client import GatewayClient, text_of

pytestmark = pytest.mark.timeout(30)
memory_only = pytest.mark.parametrize("store_kind", ["memory"])

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def stalled(port: int, source: str = "127.0.0.1") -> Stream:
    """A connection that sends half a request line, and then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(b"GET /v1/realtime HT")
    await writer.drain()
    return reader, writer


async def closed(stream: Stream, within: float = 5.0) -> bool:
    """True once the server closed the connection (EOF or reset), False if it did not in time."""
    reader, writer = stream
    try:
        async with asyncio.timeout(within):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    writer.close()
    return True


def api_port(gw: Gateway) -> int:
    assert gw.api is not None
    return gw.api.port


@memory_only
async def test_both_ports_close_a_request_that_does_not_arrive_in_time(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(api_port=0, header_timeout=0.5) as gw:
        started = time.monotonic()
        streams = [await stalled(gw.port), await stalled(api_port(gw))]
        assert all([await closed(s) for s in streams])
        assert 0.4 < time.monotonic() - started < 4.0
        await poll_until(lambda: len(gw.edges.pending) == 0, "nothing pending")
        assert await http_get(gw, "/healthz") == (200, "ok\n")


@memory_only
async def test_the_api_answers_408_to_a_body_that_does_not_arrive(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(api_port=0, body_timeout=0.5) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", api_port(gw))
        writer.write(
            b"POST /v1/sessions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b"\r\n")[0]
            length = int(
                next(
                    h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
                ).split(b":")[1]
            )
            body = await reader.readexactly(length)
        assert status == b"HTTP/1.1 408 Request Timeout", head
        assert b"did not arrive within 0.5 s" in body and b'"code":"timeout"' in body
        assert await closed((reader, writer))


async def request(stream: Stream, head: bytes) -> bytes:
    """One HTTP/1.1 request on a kept-alive connection: the answer's status line."""
    reader, writer = stream
    writer.write(head + b"Host: gw\r\nContent-Length: 0\r\n\r\n")
    async with asyncio.timeout(5):
        answer = await reader.readuntil(b"\r\n\r\n")
        length = next(h for h in answer.split(b"\r\n") if h.lower().startswith(b"content-length"))
        await reader.readexactly(int(length.split(b":")[1]))
    return answer.split(b"\r\n")[0]


@memory_only
async def test_one_address_holds_a_bounded_number_of_unauthenticated_connections(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(
        api_port=0, unauthenticated_per_address=3, api_keys_file=str(keys.path)
    ) as gw:
        pending = gw.edges.pending
        mine = [await stalled(gw.port), await stalled(gw.port), await stalled(api_port(gw))]
        await poll_until(lambda: pending.held_by("127.0.0.1") == 3, "three pending")
        others = [await stalled(gw.port, "127.0.0.2") for _ in range(3)]
        await poll_until(lambda: pending.held_by("127.0.0.2") == 3, "three more, elsewhere")

        # A fourth, on either port: the address's oldest goes, nobody else's.
        mine.append(await stalled(api_port(gw)))
        assert await closed(mine[0])
        await poll_until(lambda: pending.held_by("127.0.0.1") == 3, "still three")
        assert not any([await closed(s, within=0.2) for s in mine[1:] + others])

        # A real client from the same address gets in (the oldest stalled one makes room),
        # is not counted once its handshake is admitted, and runs a turn.
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        assert await closed(mine[1])
        assert "Echo: hi" in text_of(await client.turn("hi"), "respond")
        assert pending.held_by("127.0.0.1") == 2
        await client.close()

        # On the API, a connection counts until a request of it brings a valid key.
        api = await asyncio.open_connection("127.0.0.1", api_port(gw), local_addr=("127.0.0.3", 0))
        assert await request(api, b"POST /v1/sessions HTTP/1.1\r\n") == b"HTTP/1.1 401 Unauthorized"
        assert pending.held_by("127.0.0.3") == 1
        alice = f"Authorization: Bearer {keys.keys['alice']}\r\n".encode()
        assert await request(api, b"POST /v1/sessions HTTP/1.1\r\n" + alice) == (
            b"HTTP/1.1 201 Created"
        )
        assert pending.held_by("127.0.0.3") == 0
        assert not await closed(api, within=0.2)  # kept alive, no longer pending

        _, metrics = await http_get(gw, "/metrics")
        closes = 'reason="unauthenticated_per_address"'
        assert metric_value(metrics, "rtgw_connections_refused_total", closes) == 2
        for stream in [*mine[2:], *others, api]:
            stream[1].close()


@memory_only
async def test_not_ready_when_descriptors_run_short(gateway_factory: GatewayFactory) -> None:
    async with gateway_factory() as gw:
        used = 899
        gw.descriptors = Descriptors(count=lambda: used, limit=lambda: 1000)
        assert await http_get(gw, "/readyz") == (200, "ready\n")
        gw.descriptors = Descriptors(count=lambda: 900, limit=lambda: 1000)
        status, body = await http_get(gw, "/readyz")
        assert status == 503
        assert "900 of its 1000 file descriptors in use" in body
        assert (await http_get(gw, "/healthz"))[0] == 200
        real = Descriptors()
        assert real.shortage() is None  # this process: far from its limit


def test_the_nofile_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(hard, 1024)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert raise_descriptor_limit() == (low, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
