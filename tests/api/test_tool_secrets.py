"""A tool's secrets never leave the gateway: an HTTP tool whose endpoint echoes its request.

The tools file gives the tool a key of its own (``X-Api-Key``, written in the
file) and a bearer token from the environment (``${ECHO_TOKEN}``). The
endpoint echoes the headers it got (and, on its failing path, quotes the key
in an HTTP 500 body). What a user checks: neither value is in the client's
events, the session's events export, its recording or a resumed replay; a
``[redacted:NAME]`` marker stands in its place.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.client import Client
from protocol.events import Result
from protocol.events import encode as encode_event
from tests.api.conftest import Api, Keys, NodesFactory
from tests.support.client import GatewayClient
from tests.support.recorded import recording_of

pytestmark = pytest.mark.timeout(60)

KEY = "k-live-0123456789abcdef"
TOKEN = "tok-from-the-environment-42"


class _Echo(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        got = {
            "key": self.headers.get("X-Api-Key", ""),
            "authorization": self.headers.get("Authorization", ""),
            "token_only": self.headers.get("Authorization", "").removeprefix("Bearer "),
            KEY: "as a key too",
        }
        failing = self.path == "/fail"
        body = (f"denied for key {KEY}" if failing else json.dumps(got)).encode()
        self.send_response(500 if failing else 200)
        self.send_header("Content-Type", "text/plain" if failing else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def tools_file(path: Path, base: str) -> str:
    section = (
        'description = "Echo."\nparameters = { type = "object" }\n'
        f'headers = {{ X-Api-Key = "{KEY}", Authorization = "Bearer ${{ECHO_TOKEN}}" }}\n'
    )
    path.write_text(
        f'[builtin]\nenable = []\n\n[http.echo]\nurl = "{base}/echo"\n{section}\n'
        f'[http.fail]\nurl = "{base}/fail"\n{section}'
    )
    return str(path)


def assert_clean(what: str, data: bytes) -> None:
    for secret in (KEY, TOKEN):
        assert secret.encode() not in data, f"{what} carries {secret!r}"


async def test_an_echoed_tool_secret_reaches_no_event_export_or_recording(
    nodes: NodesFactory,
    keys: Keys,
    echo: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    http: aiohttp.ClientSession,
) -> None:
    monkeypatch.setenv("ECHO_TOKEN", TOKEN)
    alice = keys.keys["alice"]
    tools = tools_file(tmp_path / "tools.toml", echo)
    async with nodes(1, tools_file=tools) as (gw,):
        seen: list[bytes] = []
        async with Client(gw.url, token=alice) as client:
            await client.configure(record=True)
            for turn in ("/tool echo {}", "/tool fail {}"):
                async for event in client.send(turn):
                    seen.append(encode_event(event))
            sid = client.session_id
        assert_clean("the client's events", b"\n".join(seen))
        results = [orjson.loads(line) for line in seen if b'"type":"result"' in line]
        echoed, failed = (orjson.loads(r["content"])[0] for r in results)
        assert echoed["status"] == "success"
        assert echoed["content"]["key"] == "[redacted:X-Api-Key]"
        assert echoed["content"]["authorization"] == "[redacted:Authorization]"
        assert echoed["content"]["token_only"] == "[redacted:ECHO_TOKEN]"
        assert "[redacted:X-Api-Key]" in echoed["content"]  # a key, scrubbed as well
        assert failed["status"] == "failure"
        assert "HTTP 500: denied for key [redacted:X-Api-Key]" in failed["content"]

        status, exported = await Api(gw, http).call(
            "GET", f"/v1/sessions/{sid}/events?after=0", key=alice
        )
        assert status == 200
        assert_clean("the events export", orjson.dumps(exported))
        replayed = await GatewayClient.connect(
            gw.url, session_id=sid, after=0, headers=keys.bearer("alice")
        )
        again = await replayed.until(lambda e: isinstance(e, Result) and "fail" in e.content)
        await replayed.close()
        assert_clean("a resumed replay", b"\n".join(encode_event(e) for e in again))
        recording = await recording_of(gw, sid, alice)
        assert b"[redacted:X-Api-Key]" in recording
        assert_clean("the recording", recording)
