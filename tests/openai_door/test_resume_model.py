"""A resumed door session and ``?model=``: the model a connection names is the one the
session runs from then on (``session.update`` cannot change it, so reconnecting is how
a client changes it); naming the model it runs changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.openai_door.conftest import MODELS, RawClient
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(60)


async def _resume(node: NodeProcess, model: str, sid: str, after: str) -> RawClient:
    return await RawClient.open(
        f"{node.base}/openai/v1/realtime?model={model}&session_id={sid}&after_event={after}"
    )


async def _turn(client: RawClient, text: str) -> list[dict[str, Any]]:
    await client.say(text)
    return await client.until("response.done")


async def test_a_resume_with_another_model_switches_the_session_to_it(node: NodeProcess) -> None:
    first = await RawClient.open(f"{node.base}/openai/v1/realtime?model={MODELS[0]}")
    try:
        created = (await first.until("session.created"))[-1]
        last = (await _turn(first, "hello"))[-1]["event_id"]
    finally:
        await first.close()
    sid = created["session"]["id"]
    assert created["session"]["model"] == MODELS[0]

    switched = await _resume(node, MODELS[1], sid, last)
    try:
        got = await _turn(switched, "hello again")
    finally:
        await switched.close()
    [updated] = [e for e in got if e["type"] == "session.updated"]
    assert updated["session"]["model"] == MODELS[1]
    assert got.index(updated) == 0  # before the turn it asked for: that ran on it
    assert got[-1]["response"]["status"] == "completed"

    again = await _resume(node, MODELS[1], sid, got[-1]["event_id"])
    try:
        more = await _turn(again, "and again")
    finally:
        await again.close()
    assert not [e for e in more if e["type"] == "session.updated"]  # nothing changed
