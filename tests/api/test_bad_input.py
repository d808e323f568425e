"""Bad input the HTTP API had no test for (issue 37): each gets its status and words.

- ``POST /v1/sessions`` with a body that is not JSON: 415; a Redis that is gone: 503
  with ``Retry-After``; ``/events`` with ``limit`` out of 1..1000: 400.
- ``POST /v1/phone/tokens`` with no key (401), bad JSON (400), a ``ttl`` out of
  range (400), another key's session (403), a session that does not exist (404).
- The voice webhook with no Twilio auth token (503), a body that is not a form
  (415), a body that stalls (408).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.api.conftest import Api, Keys, NodesFactory
from tests.edge.conftest import poll_until
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)

TOKENS = "/v1/phone/tokens"
WEBHOOK = "/v1/phone/twilio/voice"


def message(body: object) -> str:
    assert isinstance(body, dict), body
    return str(body["error"]["message"])


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_sessions_refuse_what_is_not_json_and_limits_out_of_range(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession, store_kind: str
) -> None:
    async with nodes(1) as (gw,):
        api = Api(gw, http)
        alice = keys.keys["alice"]
        status, body = await api.call(
            "POST",
            "/v1/sessions",
            key=alice,
            data=b"instructions=hi",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert status == 415 and "Content-Type: application/json" in message(body)
        status, made = await api.call("POST", "/v1/sessions", key=alice, json={})
        assert status == 201
        events = f"/v1/sessions/{made['session_id']}/events"
        for limit in ("0", "1001", "-1", "ten", "1" * 30):
            status, body = await api.call("GET", f"{events}?limit={limit}", key=alice)
            assert status == 400 and "give a whole number from 1 to 1000" in message(body)
        status, body = await api.call("GET", f"{events}?limit=1000", key=alice)
        assert status == 200 and body["has_more"] is False
        status, body = await api.call("GET", f"{events}?after=-1", key=alice)
        assert status == 400 and "after='-1'" in message(body)


async def test_a_store_that_is_gone_is_503_with_retry_after(
    tmp_path: Path, keys: Keys, http: aiohttp.ClientSession, nodes: NodesFactory
) -> None:
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        async with nodes(1, redis_url=redis.url) as (gw,):
            api = Api(gw, http)
            alice = keys.keys["alice"]
            status, made = await api.call("POST", "/v1/sessions", key=alice, json={})
            assert status == 201
            redis.stop()
            headers = {"Authorization": f"Bearer {alice}"}
            async with http.get(
                f"{gw.api_url}/v1/sessions/{made['session_id']}", headers=headers
            ) as r:
                body = await r.json()
                assert r.status == 503, body
                assert r.headers["Retry-After"] == "5"
                assert "retry in a few seconds" in message(body)
    finally:
        redis.stop()


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_phone_tokens_refuse_bad_requests(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession, store_kind: str
) -> None:
    async with nodes(1, phone_twilio_auth_token="secret") as (gw,):
        api = Api(gw, http)
        alice, bob = keys.keys["alice"], keys.keys["bob"]
        status, body = await api.call("POST", TOKENS, json={})
        assert status == 401 and "API key is required" in message(body)
        status, body = await api.call("POST", TOKENS, key="nope", json={})
        assert status == 401 and "not valid" in message(body)
        json_type = {"Content-Type": "application/json"}
        status, body = await api.call("POST", TOKENS, key=alice, data=b"{ttl:", headers=json_type)
        assert status == 400 and "invalid body" in message(body)
        for ttl in (0, 86401, "300"):
            status, body = await api.call("POST", TOKENS, key=alice, json={"ttl": ttl})
            assert status == 400 and "$.ttl" in message(body), (ttl, body)
        status, body = await api.call("POST", TOKENS, key=alice, json={"call": "C" * 129})
        assert status == 400 and "$.call" in message(body)
        status, body = await api.call("POST", TOKENS, key=alice, json={"surprise": 1})
        assert status == 400 and "surprise" in message(body)
        _, bobs = await api.call("POST", "/v1/sessions", key=bob, json={})
        status, body = await api.call(
            "POST", TOKENS, key=alice, json={"session_id": bobs["session_id"]}
        )
        assert status == 403 and "another API key" in message(body)
        status, body = await api.call("POST", TOKENS, key=alice, json={"session_id": "nope"})
        assert status == 404 and "does not exist" in message(body)
        status, body = await api.call("POST", TOKENS, key=alice, json={"ttl": 60})
        assert status == 201 and body["stream_token"]


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_the_webhook_says_what_is_wrong(
    nodes: NodesFactory, http: aiohttp.ClientSession, store_kind: str
) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with nodes(1, api_keys_file="") as (gw,):
        async with http.post(gw.api_url + WEBHOOK, data=b"From=%2B1", headers=form) as r:
            text = await r.text()
        assert r.status == 503 and "set TWILIO_AUTH_TOKEN" in text
    async with nodes(1, api_keys_file="", phone_twilio_auth_token="secret", body_timeout=1.0) as (
        gw,
    ):
        url = gw.api_url + WEBHOOK
        async with http.post(
            url, data=b'{"From":"+1"}', headers={"Content-Type": "application/json"}
        ) as r:
            text = await r.text()
        assert r.status == 415 and "form-encoded" in text
        async with http.post(
            url, data=b"From=%2B1", headers={**form, "Content-Encoding": "gzip"}
        ) as r:
            text = await r.text()
        assert r.status == 415 and "not compressed" in text
        async with http.post(url, data=b"From=%2B1", headers=form) as r:
            text = await r.text()
        assert r.status == 403 and "X-Twilio-Signature" in text
        # A body announced and never sent: 408 within body_timeout, and the connection closed.
        host, port = gw.api_url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST {WEBHOOK} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-"
            "urlencoded\r\nContent-Length: 100\r\n\r\nFrom=".encode()
        )
        async with asyncio.timeout(10):
            answer = await reader.read()  # to the close
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive in time" in answer


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_webhook_form_that_is_not_utf8_is_400_and_no_traceback(
    nodes: NodesFactory,
    http: aiohttp.ClientSession,
    store_kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # aiohttp decodes a form by its charset: bytes that are not UTF-8, or a charset
    # Python does not know, raised out of the handler as a 500 with a traceback logged,
    # for anyone, before the signature was checked.
    form = "application/x-www-form-urlencoded"
    async with nodes(1, api_keys_file="", phone_twilio_auth_token="secret") as (gw,):
        url = gw.api_url + WEBHOOK
        for body, content_type in [
            (b"CallSid=CA1&From=\xff\xfe", form),
            (b"CallSid=CA1", form + "; charset=no-such-charset"),
        ]:
            async with http.post(url, data=body, headers={"Content-Type": content_type}) as r:
                text = await r.text()
            assert r.status == 400 and "UTF-8" in text, (r.status, text)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_request_aiohttp_cannot_parse_is_400_and_one_line_in_the_log(
    nodes: NodesFactory, store_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: aiohttp logged each one as an ERROR with its traceback, for anyone.
    heads = [
        b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n{}",
        b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + b"a" * 9000
        + b"\r\nContent-Length: 2\r\n\r\n{}",
    ]
    async with nodes(1, api_keys_file="") as (gw,):
        host, port = gw.api_url.removeprefix("http://").rsplit(":", 1)
        for head in heads:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(head)
            async with asyncio.timeout(10):
                answer = await reader.read()  # to the close
            writer.close()
            assert answer.startswith(b"HTTP/1.1 400") or answer.startswith(b"HTTP/1.0 400")
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    refused = [r for r in caplog.records if "malformed request refused" in r.getMessage()]
    assert len(refused) == 2 and not [r for r in refused if r.exc_info]


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_an_openai_endpoint_the_door_lacks_says_what_it_serves(
    nodes: NodesFactory, http: aiohttp.ClientSession, store_kind: str
) -> None:
    # openai-python's calls.accept() (a SIP call's) got a 404 listing /v1/sessions,
    # nothing of the door.
    async with nodes(1, api_keys_file="") as (gw,):
        url = f"http://127.0.0.1:{gw.port}/openai/v1/realtime/calls/rtc_1/accept"
        async with http.post(url) as r:
            body = await r.json()
    assert r.status == 404
    assert "POST /openai/v1/realtime/calls" in message(body) and "hangup" in message(body)


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_client_gone_before_its_answer_leaves_no_traceback(
    nodes: NodesFactory, store_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Found from outside (2026-12-07): each request whose client reset the connection
    # before the answer was written logged an ERROR with aiohttp's traceback ("Cannot
    # write to closing transport"): a cheap way to flood a node's log.
    body = b'{"instructions": "hello"}'
    head = b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    async with nodes(1, api_keys_file="") as (gw,):
        host, port = gw.api_url.removeprefix("http://").rsplit(":", 1)
        sessions = gw.node.store._sessions  # type: ignore[attr-defined]
        for _ in range(5):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(request)
            await writer.drain()
            writer.transport.abort()  # a reset before the answer: it is made all the same
        await poll_until(lambda: len(sessions) >= 5, "the requests are answered")
        # A client that stays gets its answer, after the ones that left were answered
        # into closed sockets (each answer is written as soon as its session is made).
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
        async with asyncio.timeout(10):
            assert (await reader.read()).startswith(b"HTTP/1.1 201")
        writer.close()
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text[-2000:]
