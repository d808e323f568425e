"""A provider that accepts the session and then goes silent, through a running gateway.

The provider is a small hostile OpenAI Realtime endpoint on loopback: it
sends ``session.created`` and then either never answers a response (its
WebSocket still answers pings: the connection looks alive) or, once a
response is asked for, sends a text frame's header and then one byte at a
time (a message that never completes). What a client notices: within
``upstream_stall_timeout`` an ``interrupt`` says the step is rerun on a new
connection; when the new connection is silent too, an ``error`` coded
``upstream_timeout`` and the turn's ``end`` — never a turn held open for minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

import orjson
import pytest
from websockets.asyncio.server import Server, ServerConnection, serve

from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from protocol.events import End, Error, Interrupt, Metric
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient, text_of

pytestmark = [
    pytest.mark.parametrize("store_kind", ["memory"], indirect=True),
    pytest.mark.timeout(60),
]

STALL = 1.0  # the gateway's upstream_stall_timeout in these tests

Mode = Literal["hang", "drip"]


class HostileProvider:
    """An OpenAI Realtime endpoint that never finishes a response (see the module docstring)."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.connections = 0
        self.requests = 0
        self.dripped = 0
        self._server: Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"ws://{host}:{port}"

    async def handle(self, ws: ServerConnection) -> None:
        self.connections += 1
        created = {"type": "session.created", "event_id": "e0", "session": {"id": "s"}}
        await ws.send(orjson.dumps(created).decode())
        async for message in ws:
            if b"response.create" not in (
                message if isinstance(message, bytes) else message.encode()
            ):
                continue
            self.requests += 1
            if self.mode == "drip":
                # A text frame of 256 bytes (FIN, opcode 1, 16-bit length), then a byte a tick.
                ws.transport.write(bytes([0x81, 126, 0x01, 0x00]))
                # The gateway may hang up between two ticks (its half-close shows as
                # write_eof, which is_closing does not report): then the drip ends.
                with contextlib.suppress(RuntimeError, ConnectionError):
                    while not ws.transport.is_closing():
                        ws.transport.write(b"x")
                        self.dripped += 1
                        await asyncio.sleep(STALL / 5)
                return

    @asynccontextmanager
    async def running(self) -> AsyncIterator[HostileProvider]:
        async with serve(self.handle, "127.0.0.1", 0) as server:
            self._server = server
            yield self


@asynccontextmanager
async def gateway_on(factory: GatewayFactory, url: str) -> AsyncIterator[str]:
    async with factory(
        provider="openai",
        openai_base_url=url,
        openai_api_key="key",
        upstream_stall_timeout=STALL,
    ) as gw:
        yield gw.url


@pytest.mark.parametrize("mode", ["hang", "drip"])
async def test_a_silent_provider_is_retried_once_then_the_turn_ends_with_a_code(
    gateway_factory: GatewayFactory, mode: Mode
) -> None:
    async with (
        HostileProvider(mode).running() as provider,
        gateway_on(gateway_factory, provider.url) as url,
    ):
        client = await GatewayClient.connect(url)
        started = time.perf_counter()
        await client.user("hello")
        events = await client.until(lambda e: isinstance(e, End), timeout=30.0)
        took = time.perf_counter() - started
        first_word = next(e for e in events if isinstance(e, Interrupt))
        assert "sent nothing for 1s" in first_word.content
        [error] = [e for e in events if isinstance(e, Error)]
        assert error.code == "upstream_timeout"
        assert "send your message again" in error.content
        # Two silences of STALL each (the first connection and the rerun's), then the end;
        # the margin is for a loaded machine, far below "minutes".
        assert 2 * STALL <= took < 2 * STALL + 10
        assert provider.connections == 2 and provider.requests == 2
        if mode == "drip":
            assert provider.dripped > 0  # the frame was still arriving when the gateway gave up
        metric = await client.next()
        assert isinstance(metric, Metric)
        await client.close()


async def test_a_slow_but_steady_answer_is_not_cut(gateway_factory: GatewayFactory) -> None:
    # 4 chunks a second for several seconds: each gap is well under the stall timeout,
    # the whole answer well over it.
    async with (
        serve_sim(SimConfig(tokens_per_second=4, first_token_delay=STALL / 2)) as sim,
        gateway_on(gateway_factory, sim.url) as url,
    ):
        client = await GatewayClient.connect(url)
        started = time.perf_counter()
        events = await client.turn("a slow answer, long enough to outlast the stall watch")
        assert time.perf_counter() - started > 2 * STALL
        assert not any(isinstance(e, Interrupt | Error) for e in events)
        assert text_of(events, "respond").startswith("Echo: a slow answer")
        await client.close()
