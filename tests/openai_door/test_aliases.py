"""Per-key model aliases (the key policy's ``aliases``): ``?model=fast`` is the model the
key named ``fast``, through the real ``openai`` SDK; a key without the alias is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from websockets.exceptions import InvalidStatus

from tests.api.conftest import Keys, NodesFactory, keys, nodes, store_kind
from tests.openai_door.conftest import SERVER_EVENT

__all__ = ["keys", "nodes", "store_kind"]

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_keys_alias_picks_its_model_and_other_keys_have_none(
    nodes: NodesFactory, keys: Keys, tmp_path: Path, store_kind: str
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[alice]\naliases = { fast = "gemini-3.8-live" }\n')
    async with nodes(1, api_port=None, key_policy_file=str(policy)) as (gw,):

        def client(key: str) -> AsyncOpenAI:
            return AsyncOpenAI(
                api_key=keys.keys[key],
                base_url=f"http://127.0.0.1:{gw.port}/openai/v1",
                websocket_base_url=f"ws://127.0.0.1:{gw.port}/openai/v1",
            )

        async with client("alice").realtime.connect(model="fast") as conn:

            async def next_event() -> dict[str, Any]:
                event: dict[str, Any] = json.loads(await conn.recv_bytes())
                SERVER_EVENT.validate_python(event)  # the SDK's contract, or the test fails
                return event

            created = await next_event()
            assert created["type"] == "session.created"
            assert created["session"]["model"] == "gemini-3.8-live"
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hello"}],
                }
            )
            await conn.response.create()
            while (event := await next_event())["type"] != "response.done":
                assert event["type"] != "error", event
            assert event["response"]["status"] == "completed"

        # client_secrets' session.model takes the key's aliases too.
        secret = await client("alice").realtime.client_secrets.create(
            session={"type": "realtime", "model": "fast"}
        )
        assert secret.session.model == "gemini-3.8-live"  # type: ignore[union-attr]

        with pytest.raises(InvalidStatus) as refused:
            async with client("bob").realtime.connect(model="fast"):
                pass
        assert refused.value.response.status_code == 400
        error = json.loads(refused.value.response.body)["error"]
        assert error["code"] == "model_not_found"
