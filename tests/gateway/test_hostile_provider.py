"""A provider (or anything between it and the node) that breaks the WebSocket protocol
fails its connection, and the client is told (issue 38).

A stand-in provider on loopback opens the session and then sends what a
broken or hostile one would: a text frame that is not UTF-8 (its adapter
used to skip it: RFC 6455 §8.1 says fail the connection), a delta in a
million one-byte fragments (it held the node's loop 7-9.6 s), a 64 MiB frame
(4.4-6.5 s: the reader gathered it by concatenation). The client's
turn ends with an ``upstream`` error, and the node's log says the gateway
closed the connection and why (code 1007 or 1009).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from protocol.events import Error
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def provider(send: bytes) -> AsyncIterator[str]:
    """A provider that opens the session, reads the gateway's ``session.update`` (the
    gateway reads its frames itself from then on), then writes ``send`` raw."""

    async def handler(ws: ServerConnection) -> None:
        await ws.send('{"type":"session.created","event_id":"e1","session":{}}')
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()
            ws.transport.write(send)
            await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def fragments(count: int) -> bytes:
    return b"\x01\x01{" + b"\x00\x01 " * (count - 2) + b"\x80\x01}"


def large(size: int) -> bytes:
    """One text frame of ``size`` bytes a provider may send (a frame the adapter skips),
    then a close (1011) so the turn ends."""
    body = b'{"type":"rate_limits.updated","pad":"' + b"x" * (size - 40) + b'"}'
    head = b"\x81\x7f" + len(body).to_bytes(8)
    close = b"\x88\x02" + (1011).to_bytes(2)
    return head + body + close


CASES: dict[str, tuple[bytes, Callable[[str], bool]]] = {
    "invalid UTF-8": (b"\x81\x05\xc3\x28abc", lambda s: "code 1007" in s and "UTF-8" in s),
    "a million fragments": (fragments(1_000_000), lambda s: "code 1009" in s),
}
CLOSED_BY_PROVIDER: dict[str, tuple[bytes, Callable[[str], bool]]] = {
    "a 64 MiB frame": (large(64 << 20), lambda s: "code 1011" in s),
}


@pytest.mark.parametrize("store_kind", ["memory"])
@pytest.mark.parametrize("case", [*CASES, *CLOSED_BY_PROVIDER])
async def test_a_provider_that_breaks_the_protocol_fails_the_turn_with_why(
    gateway_factory: GatewayFactory, store_kind: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    send, says = {**CASES, **CLOSED_BY_PROVIDER}[case]
    async with provider(send) as url:
        settings = {
            "provider": "openai",
            "openai_base_url": url,
            "openai_api_key": "sk-test-key",
            "upstream_retries": 0,
        }
        async with gateway_factory(**settings) as gw:
            client = await GatewayClient.connect(gw.url)
            cpu = time.process_time()
            events = await client.turn("hello")
            cpu = time.process_time() - cpu
            errors = [e for e in events if isinstance(e, Error)]
            assert errors and errors[0].code == "upstream", events
            assert "send your message again" in errors[0].content
            assert cpu < 3.0  # a million fragments: 7-9.6 s before; a 64 MiB frame 4.4-6.5 s
            # The operator's log says why (the client's words name no provider detail).
            [lost] = [r.getMessage() for r in caplog.records if "upstream lost" in r.getMessage()]
            if case in CASES:
                assert "the gateway closed the OpenAI Realtime connection" in lost
            assert says(lost), lost
            print(f"\n[{case}] {lost}; CPU {cpu:.2f} s")
            await client.close()
