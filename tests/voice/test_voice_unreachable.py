"""A voice session whose model API cannot be reached: told once, retried with backoff.

A listening voice session opens its upstream between turns. When that open
failed it was retried at once, in a loop: the node held a core at 100% per
such session and the client heard nothing. Now the client gets one ``error``
(``upstream``) and the gateway retries after a doubling wait, so the
connection attempts a listener sees in a window are a handful, not thousands.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.app import running_gateway
from gateway.config import load_config
from gateway.upstream.dial import websocket_url
from protocol.events import Error
from tests.voice.conftest import VoiceClient

RATE = 24000


@pytest.mark.parametrize(
    ("given", "dialled"),
    [
        ("https://api.openai.com/v1", "wss://api.openai.com/v1"),
        ("HTTP://127.0.0.1:9/v1", "ws://127.0.0.1:9/v1"),
        ("wss://example.test/v1", "wss://example.test/v1"),
        ("ftp://example.test/v1", "ftp://example.test/v1"),
    ],
)
def test_http_base_urls_are_dialled_as_websockets(given: str, dialled: str) -> None:
    assert websocket_url(given) == dialled


@pytest.mark.timeout(30)
async def test_an_unreachable_upstream_is_told_once_and_retried_with_backoff(
    tmp_path: Path,
) -> None:
    attempts = 0

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal attempts
        attempts += 1
        writer.close()  # no handshake: every open fails

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = {
        "provider": "openai",
        "openai_base_url": f"http://127.0.0.1:{port}/v1",
        "openai_api_key": "k",
        "port": 0,
        "workspace_root": str(tmp_path),
    }
    async with server, running_gateway(load_config(settings, env={})) as gateway:
        client = await VoiceClient.connect(gateway.url)
        await client.configure(input_audio={"rate": RATE})
        told = await client.until("error")
        error = told[-1]
        assert isinstance(error, Error) and error.code == "upstream"
        assert "keeps trying" in error.content
        # Over the next 1.5 s: a few retries (0.5 s, then 1 s), and no second error.
        counted_from = attempts
        with pytest.raises(TimeoutError):
            await client.until("error", timeout=1.5)
        retried = attempts - counted_from
        assert 1 <= retried <= 5, f"{retried} connection attempts in 1.5 s"
        # The session still answers.
        await client.send({"type": "ping"})
        await client.until("pong")
        await client.close()
