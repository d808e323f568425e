"""A voice session whose model API cannot be reached: told once, retried with backoff.

A listening voice session opens its upstream between turns. When that open
failed it was retried at once, in a loop: the node held a core at 100% per
such session and the client heard nothing. Now the client gets one ``error``
(``upstream``) and the gateway retries after a doubling wait, so the
connection attempts a listener sees in a window are a handful, not thousands.
"""

from __future__ import annotations

import asyncio
import time
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
    attempts: list[float] = []  # when each connection came
    attempted = asyncio.Condition()

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with attempted:
            attempts.append(time.monotonic())
            attempted.notify_all()
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
        # Two more attempts come, each after its wait (0.5 s, then 1 s: a loaded machine
        # only makes them later), and the client is not told again.
        counted_from = len(attempts)
        async with asyncio.timeout(30), attempted:
            await attempted.wait_for(lambda: len(attempts) >= counted_from + 2)
        first, second, third = attempts[counted_from - 1 : counted_from + 2]
        assert second - first >= 0.45 and third - second >= 0.95, attempts
        # The session still answers, and said nothing more meanwhile.
        await client.send({"type": "ping"})
        meanwhile = await client.until("pong")
        assert not [e for e in meanwhile if isinstance(e, Error)], meanwhile
        await client.close()
