"""A WebRTC call is admitted as the door's WebSocket clients are (``OpenAIDoor.enter``),
with the caller's credentials and no second socket: the key's aliases name its model, its
policy refuses a model before any media work, a key is needed, and each turn shows where
the key stands (``rate_limits.updated``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, NotFoundError, PermissionDeniedError

from tests.api.conftest import Keys, NodesFactory, keys, nodes, store_kind
from tests.webrtc.conftest import Peer

__all__ = ["keys", "nodes", "store_kind"]

pytestmark = pytest.mark.timeout(90)


def _text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_call_takes_its_keys_aliases_policy_and_limits(
    nodes: NodesFactory, keys: Keys, tmp_path: Path, store_kind: str
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[alice]\naliases = { fast = "gemini-3.8-live" }\n[bob]\nmodels = ["gpt-realtime-2.1"]\n'
    )
    settings = {"key_policy_file": str(policy), "turns_per_minute": 5}
    async with nodes(1, api_port=None, **settings) as (gw,):
        calls = f"http://127.0.0.1:{gw.port}/openai/v1/realtime/calls"

        def bearer(key: str) -> str:
            return f"Bearer {keys.keys[key]}"

        async with aiohttp.ClientSession() as http:
            offer = {"Content-Type": "application/sdp"}
            sdp = b"v=0\r\n"  # refused before its SDP is answered
            nobody = await http.post(f"{calls}?model=fast", data=sdp, headers=offer)
            assert nobody.status == 401
            unknown = await http.post(
                f"{calls}?model=fast", data=sdp, headers={**offer, "Authorization": bearer("bob")}
            )
            assert unknown.status == 400  # bob has no alias "fast"
            assert (await unknown.json())["error"]["code"] == "model_not_found"
            forbidden = await http.post(
                f"{calls}?model=gemini-3.8-live",
                data=sdp,
                headers={**offer, "Authorization": bearer("bob")},
            )
            assert forbidden.status == 403  # bob's policy: gpt-realtime-2.1 only
            assert (await forbidden.json())["error"]["code"] == "forbidden"

        peer = Peer()
        try:
            answer = await peer.call(f"{calls}?model=fast", Authorization=bearer("alice"))
            assert answer.status == 201
            created = (await peer.until("session.created"))[-1]
            peer.send(type="conversation.item.create", item=_text("hello"))
            peer.send(type="response.create")
            turn = await peer.until("response.done")
            if not any(e["type"] == "rate_limits.updated" for e in turn):
                turn += await peer.until("rate_limits.updated")
        finally:
            await peer.close()
    assert created["session"]["model"] == "gemini-3.8-live"  # alice's "fast"
    assert not [e for e in turn if e["type"] == "error"]
    limits = next(e for e in turn if e["type"] == "rate_limits.updated")["rate_limits"]
    requests = next(r for r in limits if r["name"] == "requests")
    assert requests["limit"] == 5 and requests["remaining"] == 4


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_draining_node_tells_its_calls_how_to_resume(
    nodes: NodesFactory, keys: Keys, store_kind: str
) -> None:
    async with nodes(1, api_port=None) as (gw,):
        peer = Peer()
        try:
            calls = f"http://127.0.0.1:{gw.port}/openai/v1/realtime/calls?model=gpt-realtime-2.1"
            answer = await peer.call(calls, Authorization=f"Bearer {keys.keys['alice']}")
            assert answer.status == 201
            await peer.until("session.created")
            await gw.drain(timeout=1.0)
            told = (await peer.until("error"))[-1]["error"]
        finally:
            await peer.close()
    assert told["code"] == "session_closed_1012"
    assert "session_id" in told["message"] and "after_event" in told["message"]


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_the_openai_sdk_hangs_up_a_call_its_key_owns(
    nodes: NodesFactory, keys: Keys, store_kind: str
) -> None:
    # openai-python's client.realtime.calls.hangup(call_id), unmodified: the call's
    # peer connection ends; nobody else's key, and no key, may end it.
    async with nodes(1, api_port=None) as (gw,):
        base = f"http://127.0.0.1:{gw.port}/openai/v1"
        alice = AsyncOpenAI(api_key=keys.keys["alice"], base_url=base, max_retries=0)
        bob = AsyncOpenAI(api_key=keys.keys["bob"], base_url=base, max_retries=0)
        peer = Peer()
        ended = asyncio.Event()
        peer.channel.on("close", ended.set)
        try:
            answer = await peer.call(
                f"{base}/realtime/calls?model=gpt-realtime-2.1",
                Authorization=f"Bearer {keys.keys['alice']}",
            )
            assert answer.status == 201
            await peer.until("session.created")
            call_id = peer.location.rsplit("/", 1)[-1]
            async with aiohttp.ClientSession() as http:
                anonymous = await http.post(f"{base}/realtime/calls/{call_id}/hangup")
                assert anonymous.status == 401
            with pytest.raises(PermissionDeniedError):
                await bob.realtime.calls.hangup(call_id)
            with pytest.raises(NotFoundError):
                await alice.realtime.calls.hangup("rtc_" + "0" * 24)
            assert not ended.is_set()  # refused hangups leave the call as it was
            peer.send(type="conversation.item.create", item=_text("still here?"))
            peer.send(type="response.create")
            assert (await peer.until("response.done"))[-1]["response"]["status"] == "completed"

            await alice.realtime.calls.hangup(call_id)
            await asyncio.wait_for(ended.wait(), 20)
            with pytest.raises(NotFoundError) as again:
                await alice.realtime.calls.hangup(call_id)
        finally:
            await peer.close()
            await alice.close()
            await bob.close()
    body = again.value.body  # the SDK hands over the error object
    assert isinstance(body, dict) and body["code"] == "call_not_found"


async def _stalled_offer(port: int, authorization: str | None) -> bytes:
    """An offer's request head announcing a 60,000-byte body, then 3 bytes of it: what
    the node answers before the rest (b"" if it waits for it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /openai/v1/realtime/calls?model=gpt-realtime-2.1 HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\nContent-Type: application/sdp\r\nContent-Length: 60000\r\n"
        + (f"Authorization: {authorization}\r\n" if authorization else "")
        + "\r\nv=0"
    )
    writer.write(head.encode())
    try:
        return await asyncio.wait_for(reader.read(4096), 3)
    except TimeoutError:
        return b""
    finally:
        writer.close()


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_callers_with_no_valid_key_hold_no_call_slot(
    nodes: NodesFactory, keys: Keys, store_kind: str
) -> None:
    # The node takes one call. Offers with no key or a wrong one stall their bodies:
    # each is refused at once, so the slot stays free for a caller with a key.
    async with nodes(1, api_port=None, webrtc_max_calls=1) as (gw,):
        strangers = await asyncio.gather(
            *(_stalled_offer(gw.port, None) for _ in range(5)),
            *(_stalled_offer(gw.port, "Bearer not-a-key") for _ in range(5)),
        )
        for answer in strangers:
            assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
            assert b"invalid_api_key" in answer
        peer = Peer()
        try:
            calls = f"http://127.0.0.1:{gw.port}/openai/v1/realtime/calls?model=gpt-realtime-2.1"
            answer = await peer.call(calls, Authorization=f"Bearer {keys.keys['alice']}")
            assert answer.status == 201
            await peer.until("session.created")
        finally:
            await peer.close()
