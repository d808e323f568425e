"""``rate_limits.updated`` through the door, with the real ``openai`` SDK: after each
turn it starts, a client sees where its key stands against the gateway's per-key
limits (turns per minute as ``requests``, tokens per day as ``tokens``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.api.conftest import Keys, NodesFactory, keys, nodes, store_kind
from tests.openai_door.conftest import SERVER_EVENT

__all__ = ["keys", "nodes", "store_kind"]

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_each_turn_shows_the_keys_remaining_turns_and_tokens(
    nodes: NodesFactory, keys: Keys, tmp_path: Path, store_kind: str
) -> None:
    async with nodes(1, api_port=None, turns_per_minute=5, tokens_per_day=100_000) as (gw,):
        client = AsyncOpenAI(
            api_key=keys.keys["alice"],
            base_url=f"http://127.0.0.1:{gw.port}/openai/v1",
            websocket_base_url=f"ws://127.0.0.1:{gw.port}/openai/v1",
        )
        shown: list[dict[str, Any]] = []
        async with client.realtime.connect(model="gpt-realtime-2.1") as conn:
            for _ in range(2):
                await conn.conversation.item.create(
                    item={
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "hello"}],
                    }
                )
                await conn.response.create()
                seen, done = len(shown), False
                while not done or len(shown) == seen:  # the turn's end and its limits
                    raw = await asyncio.wait_for(conn.recv_bytes(), 30)
                    event: dict[str, Any] = json.loads(raw)
                    SERVER_EVENT.validate_python(event)  # the SDK's contract
                    assert event["type"] != "error", event
                    if event["type"] == "rate_limits.updated":
                        shown.append({r["name"]: r for r in event["rate_limits"]})
                    done = done or event["type"] == "response.done"
    assert len(shown) == 2
    assert [s["requests"]["remaining"] for s in shown] == [4, 3]
    assert all(s["requests"]["limit"] == 5 for s in shown)
    assert all(0 < s["requests"]["reset_seconds"] <= 60 for s in shown)
    assert shown[0]["tokens"]["limit"] == 100_000
    # The first turn's tokens are counted by the time the second starts.
    assert shown[1]["tokens"]["remaining"] < shown[0]["tokens"]["remaining"] <= 100_000
