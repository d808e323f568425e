"""Auth as OpenAI's: a gateway API key as ``Authorization: Bearer``; an ephemeral key
from ``POST /openai/v1/realtime/client_secrets`` (this gateway's client token) in the
browser's ``openai-insecure-api-key.`` subprotocol; refusals in OpenAI's error shape."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from websockets.exceptions import InvalidStatus

from tests.api.conftest import Keys, NodesFactory, keys, nodes, store_kind
from tests.edge.conftest import poll_until
from tests.openai_door.conftest import RawClient

__all__ = ["keys", "nodes", "store_kind"]

pytestmark = pytest.mark.timeout(60)
MODEL = "gpt-realtime-2.1"


async def test_an_api_key_opens_the_door_and_a_wrong_one_is_refused(
    nodes: NodesFactory, keys: Keys
) -> None:
    async with nodes(1, api_port=None) as (gw,):
        client = AsyncOpenAI(
            api_key=keys.keys["alice"], websocket_base_url=f"ws://127.0.0.1:{gw.port}/openai/v1"
        )
        async with client.realtime.connect(model=MODEL) as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                }
            )
            await conn.response.create()
            async for event in conn:
                assert event.type != "error", event
                if event.type == "response.done":
                    break
        with pytest.raises(InvalidStatus) as info:
            await RawClient.open(
                f"ws://127.0.0.1:{gw.port}/openai/v1/realtime?model={MODEL}",
                additional_headers={"Authorization": "Bearer rtgw_wrong"},
            )
        assert info.value.response.status_code == 401
        assert json.loads(info.value.response.body)["error"]["code"] == "invalid_api_key"


async def test_a_client_secret_opens_its_session_in_a_browsers_subprotocol(
    nodes: NodesFactory, keys: Keys
) -> None:
    async with nodes(1, api_port=None) as (gw,):
        client = AsyncOpenAI(api_key=keys.keys["alice"], base_url=f"{gw.http_url}/openai/v1")
        secret = await client.realtime.client_secrets.create(
            session={"type": "realtime", "model": MODEL, "instructions": "Answer like a pirate."},
            expires_after={"anchor": "created_at", "seconds": 600},
        )
        assert secret.value.startswith("rtgw_ct.") and secret.expires_at > 0
        browser = await RawClient.open(
            f"ws://127.0.0.1:{gw.port}/openai/v1/realtime?model={MODEL}",
            subprotocols=["realtime", f"openai-insecure-api-key.{secret.value}"],  # type: ignore[list-item]
        )
        try:
            assert browser.ws.subprotocol == "realtime"
            created = await browser.next()
            assert created["type"] == "session.created"
            assert created["session"]["instructions"] == "Answer like a pirate."
            await browser.say("hello")
            done = (await browser.until("response.done"))[-1]
            assert done["response"]["status"] == "completed"
            # An ephemeral key configures its session, as OpenAI's do (the Agents SDKs send
            # their agent's session.update as they connect): within its key's policy.
            await browser.send(
                type="session.update",
                event_id="u1",
                session={"type": "realtime", "instructions": "Answer like a sailor."},
            )
            updated = (await browser.until("session.updated"))[-1]
            assert updated["session"]["instructions"] == "Answer like a sailor."
            # Its system messages instruct the model, as an API key's do.
            await browser.send(
                type="conversation.item.create",
                event_id="s1",
                item={
                    "id": "sys_1",
                    "type": "message",
                    "role": "system",
                    "content": [{"type": "input_text", "text": "Be brief."}],
                },
            )
            await browser.until("conversation.item.done")
            await browser.say("hi")
            done = (await browser.until("response.done"))[-1]
            assert done["response"]["status"] == "completed"
            assert not [e for e in browser.events if e["type"] == "error"]
            # What the key's policy refuses stays refused: another model.
            await browser.send(
                type="session.update", event_id="u2", session={"type": "realtime", "model": "x"}
            )
            error = (await browser.until("error"))[-1]["error"]
            assert error["event_id"] == "u2"
        finally:
            await browser.close()
        # A page reload connects again with the same key, naming no event: it joins the
        # session as it is now (session.created, first), and nothing before is sent again
        # as if it were new (the Agents SDK ran a replayed client tool call again).
        reloaded = await RawClient.open(
            f"ws://127.0.0.1:{gw.port}/openai/v1/realtime?model={MODEL}",
            subprotocols=["realtime", f"openai-insecure-api-key.{secret.value}"],  # type: ignore[list-item]
        )
        try:
            created = await reloaded.next()
            assert created["type"] == "session.created"
            assert created["session"]["instructions"] == "Answer like a sailor."  # as updated
            await reloaded.send(type="conversation.item.retrieve", item_id="no", event_id="p")
            answer = await reloaded.next()  # nothing of the two turns before it
            assert (answer["type"], answer["error"]["event_id"]) == ("error", "p"), answer
        finally:
            await reloaded.close()
        # The ephemeral key opens nothing else: not the HTTP API.
        other = AsyncOpenAI(api_key=secret.value, base_url=f"{gw.http_url}/openai/v1")
        with pytest.raises(Exception) as refused:
            await other.realtime.client_secrets.create(session={"type": "realtime", "model": MODEL})
        assert "403" in str(refused.value) or "client token" in str(refused.value)


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_model_the_keys_policy_forbids_is_refused_before_the_socket_opens(
    nodes: NodesFactory, keys: Keys, tmp_path: Path, store_kind: str
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[alice]\nproviders = ["sim"]\nmodels = ["gpt-realtime-2.1"]\n')
    async with nodes(1, api_port=None, key_policy_file=str(policy)) as (gw,):
        bearer = {"Authorization": f"Bearer {keys.keys['alice']}"}
        base = f"ws://127.0.0.1:{gw.port}/openai/v1/realtime"
        with pytest.raises(InvalidStatus) as info:
            await RawClient.open(f"{base}?model=gemini-3.8-live", additional_headers=bearer)
        assert info.value.response.status_code == 403
        assert "model" in json.loads(info.value.response.body)["error"]["message"]
        allowed = await RawClient.open(f"{base}?model=gpt-realtime-2.1", additional_headers=bearer)
        try:
            created = await allowed.next()
            assert created["type"] == "session.created"
        finally:
            await allowed.close()
        # Resuming it with a model the policy forbids would switch to it: refused as well.
        sid, after = created["session"]["id"], created["event_id"]
        with pytest.raises(InvalidStatus) as info:
            await RawClient.open(
                f"{base}?model=gemini-3.8-live&session_id={sid}&after_event={after}",
                additional_headers=bearer,
            )
        assert info.value.response.status_code == 403


@pytest.mark.logs_traceback  # websockets logs the refused Sec-WebSocket-Key with its traceback
@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_handshake_that_fails_after_the_check_leaves_no_session_connection(
    nodes: NodesFactory, store_kind: str, keys: Keys
) -> None:
    async with nodes(1, api_port=None) as (gw,):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            (
                f"GET /openai/v1/realtime?model={MODEL} HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {keys.keys['alice']}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: not-a-key\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        answer = await asyncio.wait_for(reader.read(), 20)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400")
        # The door's own connection to the session went away with the failed handshake.
        await poll_until(lambda: not gw.connections, "the inner connection closed")
