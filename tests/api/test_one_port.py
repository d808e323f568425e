"""One port: the HTTP API, the WebSocket and the pages on the gateway's ``--port``.

A node started as the README says (no ``--api-port``) serves the console's API
calls (mint, recording, delete) and the WebSocket on the same port; a request
head that never ends is cut by the port's head timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import pytest

from gateway.edge.one_port import route
from tests.api.conftest import Api, Keys, NodesFactory
from tests.support.client import GatewayClient, text_of

pytestmark = pytest.mark.timeout(60)


async def test_the_api_and_the_websocket_share_the_port(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession
) -> None:
    async with nodes(1, api_port=None, record=True) as (gw,):
        assert gw.api_url == gw.http_url  # no second port
        api = Api(gw, http)
        alice = keys.keys["alice"]
        status, minted = await api.call("POST", "/v1/sessions", key=alice, json={})
        assert status == 201, minted
        sid, token = minted["session_id"], minted["client_token"]

        client = await GatewayClient.connect(f"{gw.url}?token={token}")
        try:
            assert client.sid == sid
            assert text_of(await client.turn("hello"), "respond")
        finally:
            await client.close()

        # The console's calls: its recording and Delete, on the page's own origin.
        async with http.get(
            f"{gw.http_url}/v1/sessions/{sid}/recording", headers=keys.bearer("alice")
        ) as r:
            assert r.status == 200, await r.text()
            assert r.headers.get("Connection", "").lower() == "close"
            assert len(await r.read()) > 0
        # The pages still answer on the same port.
        async with http.get(f"{gw.http_url}/healthz") as r:
            assert r.status == 200 and await r.text() == "ok\n"
        status, _ = await api.call("DELETE", f"/v1/sessions/{sid}", key=alice)
        assert status == 204
        status, body = await api.call("GET", f"/v1/sessions/{sid}", key=alice)
        assert status == 404, body


async def test_the_extra_api_port_still_serves(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession
) -> None:
    async with nodes(1, api_port=0) as (gw,):
        assert gw.api_url != gw.http_url
        for base in (gw.api_url, gw.http_url):
            async with http.post(f"{base}/v1/sessions", json={}, headers=keys.bearer("alice")) as r:
                assert r.status == 201, await r.text()


async def _cut_after(port: int, head: bytes) -> float:
    """Seconds until the gateway closes a connection that sent ``head`` and then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(head)
    await writer.drain()
    try:
        rest = await asyncio.wait_for(reader.read(), 30)
    except ConnectionResetError:
        rest = b""
    writer.close()
    assert rest == b"", rest  # cut, not answered
    return time.monotonic() - started


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n",  # a head that never ends
        b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: web",
        b"",  # nothing at all
    ],
)
async def test_a_slow_head_is_cut(nodes: NodesFactory, head: bytes) -> None:
    async with nodes(1, api_port=None, header_timeout=1.0) as (gw,):
        took = await _cut_after(gw.port, head)
        assert 0.9 <= took < 10, took


@pytest.mark.parametrize("size", [70_000, 200_000, 5_000_000])
async def test_an_endless_head_is_answered_431_at_its_size_limit(
    nodes: NodesFactory, size: int
) -> None:
    """It was reset with its bytes unread (found from outside, 2026-12-07): the client
    never learned why. What it sends after the answer is dropped (1 MiB at most)."""
    async with nodes(1, api_port=None, header_timeout=30.0) as (gw,):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"POST /v1/sessions HTTP/1.1\r\n" + b"X-Pad: " + b"a" * size)
        with contextlib.suppress(ConnectionError):
            await writer.drain()  # the 5 MB head is cut off after 1 MiB more
        async with asyncio.timeout(10):
            answer = await reader.read()  # to the end of the stream
        writer.close()
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b"header_too_large" in body and b"over 65536 bytes" in body


@pytest.mark.parametrize(
    "path",
    ["POST /openai/v1/realtime/calls", "GET /openai/v1/realtime?model=m", "GET /healthz"],
)
async def test_an_overlong_header_is_refused_in_json_without_echoing_it(
    nodes: NodesFactory, path: str
) -> None:
    """aiohttp answered a 100 KB Authorization with a text 400 that echoed the first
    100 bytes of the credential; both servers' limit is ~8 KiB a line."""
    secret = "sk-" + "s3cr3t" * 2_000
    async with nodes(1, api_port=None) as (gw,):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        head = f"{path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n\r\n"
        writer.write(head.encode())
        async with asyncio.timeout(10):
            answer = await reader.read()  # to the close
        writer.close()
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 431") and b"application/json" in status
    assert b"header_too_large" in body and b"s3cr3t" not in answer


@pytest.mark.parametrize(
    "path",
    ["GET /v1/realtime", "GET /openai/v1/realtime?model=m", "GET /healthz", "POST /v1/sessions"],
)
async def test_a_head_of_too_many_headers_is_answered_in_json(
    nodes: NodesFactory, path: str
) -> None:
    """Past websockets' 128 headers a handshake (or any GET it serves) was closed with no
    answer at all, and each logged a traceback; aiohttp's answer was a text 400."""
    async with nodes(1, api_port=None) as (gw,):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        many = "".join(f"X-Header-{n}: v\r\n" for n in range(200))
        handshake = (
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        )
        writer.write(f"{path} HTTP/1.1\r\nHost: x\r\n{handshake}{many}\r\n".encode())
        async with asyncio.timeout(10):
            answer = await reader.read()  # to the close
        writer.close()
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 431") and b"application/json" in status, answer[:300]
    assert b"more than 128 headers" in body


@pytest.mark.parametrize(
    ("line", "status", "code"),
    [
        ("BREW /healthz HTTP/1.1", b"501", b"method_not_implemented"),
        ("FOO /v1/sessions HTTP/1.1", b"501", b"method_not_implemented"),
        ("GET /v1/realtime", b"400", b"bad_request_line"),
        ("GET /a b HTTP/1.1", b"400", b"bad_request_line"),
    ],
)
async def test_an_unknown_method_or_a_broken_request_line_is_answered_in_json(
    nodes: NodesFactory, line: str, status: bytes, code: bytes
) -> None:
    """aiohttp's parser answered both with a text 400 that quoted the request line."""
    async with nodes(1, api_port=None) as (gw,):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(f"{line}\r\nHost: x\r\n\r\n".encode())
        async with asyncio.timeout(10):
            answer = await reader.read()  # to the close
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status) and b"application/json" in head, answer
    assert code in body and b"healthz" not in body and b"sessions" not in body


async def test_a_path_that_starts_with_two_slashes_is_that_path(nodes: NodesFactory) -> None:
    """``urlsplit`` read ``//etc/passwd`` as the host ``etc`` and the path ``/passwd``,
    and ``//x/v1/realtime`` as the WebSocket endpoint."""
    async with nodes(1, api_port=None) as (gw,):
        for path in ("//etc/passwd", "//x/healthz"):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            async with asyncio.timeout(10):
                answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.1 404"), answer[:200]
            assert repr(path).encode() in answer, answer


@pytest.mark.parametrize(
    ("head", "to"),
    [
        (b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n", "ws"),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "ws"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "ws"),
        (b"GET /v1/phone/twilio HTTP/1.1\r\nHost: x\r\nupgrade:  WebSocket\r\n\r\n", "ws"),
        (b"GET /openai/v1/realtime?model=m HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", "ws"),
        (b"GET /v1/sessions/abc/events?after=0 HTTP/1.1\r\nHost: x\r\n\r\n", "http"),
        (b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n\r\n", "http"),
        (b"OPTIONS /v1/sessions HTTP/1.1\r\nHost: x\r\n\r\n", "http"),
        (b"DELETE /v1/sessions/abc HTTP/1.1\r\nHost: x\r\n\r\n", "http"),
        (b"POST /openai/v1/realtime/client_secrets HTTP/1.1\r\n\r\n", "http"),
    ],
)
def test_the_head_decides_who_serves_it(head: bytes, to: str) -> None:
    assert route(head) == to
