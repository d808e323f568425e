"""``context``: messages added to the conversation without a turn, end to end.

The simulator's ``/context`` probe answers with the number of conversation items its
connection holds, so the tests see what the provider was given, on the open
connection and on one rebuilt from history.
"""

from __future__ import annotations

import re

import pytest

from gateway.edge.server import Gateway
from protocol.events import Context, Error, Forgotten, User
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient, text_of

pytestmark = pytest.mark.timeout(60)


def _items(events: list[object]) -> int:
    m = re.fullmatch(r"Context: (\d+) items", text_of(events, "respond"))  # type: ignore[arg-type]
    assert m, events
    return int(m.group(1))


async def test_context_reaches_the_model_now_and_after_a_rebuild_without_a_turn(
    gateway: Gateway,
) -> None:
    client = await GatewayClient.connect(gateway.url)
    before = _items(await client.turn("/context"))
    await client.send({"type": "context", "role": "system", "content": "Be brief.", "id": "c1"})
    added = (await client.until_type("context"))[-1]
    assert isinstance(added, Context)
    assert (added.role, added.content, added.reply_to) == ("system", "Be brief.", "c1")
    await client.send({"type": "context", "role": "assistant", "content": "Noted.", "item": "a1"})
    again = (await client.until_type("context"))[-1]
    assert isinstance(again, Context) and again.item == "a1"
    # No turn ran for either; the open connection has both (and the last answer).
    after = _items(await client.turn("/context"))
    assert after == before + 4  # the answer, two context messages, the new message
    # A new connection is given them from history (a configure reopens it).
    await client.send({"type": "configure", "instructions": "Speak plainly."})
    await client.until_type("configured")
    rebuilt = _items(await client.turn("/context"))
    assert rebuilt == after + 2
    # Forgotten by its seq, as a user message is.
    await client.send({"type": "forget", "first": added.seq, "last": added.seq})
    gone = (await client.until_type("forgotten"))[-1]
    assert isinstance(gone, Forgotten)
    assert _items(await client.turn("/context")) == rebuilt + 1
    await client.close()


async def test_context_waits_for_the_answer_and_bad_ones_are_refused(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(sim_tokens_per_second=50.0) as gw:
        await _waits_for_the_answer(gw)


async def _waits_for_the_answer(gateway: Gateway) -> None:
    # A paced answer: the context arrives while it is being written.
    client = await GatewayClient.connect(gateway.url)
    await client.send({"type": "user", "content": "/long 1"})
    await client.until_type("respond")
    await client.send({"type": "context", "role": "system", "content": "x", "id": "mid"})
    events = await client.until_type("context")
    assert not [e for e in events if isinstance(e, Error)]
    kinds = [type(e).__name__ for e in events]
    assert "End" in kinds and "Metric" in kinds  # it went in once the answer was written
    assert events[-1].reply_to == "mid"  # type: ignore[union-attr]
    await client.send({"type": "context", "role": "tool", "content": "x"})
    bad = await client.until(lambda e: isinstance(e, Error))
    assert isinstance(bad[-1], Error) and bad[-1].code == "bad_frame"
    # The session goes on: no turn was opened by either.
    events = await client.turn("hello")
    assert isinstance(events[0], User)
    assert text_of(events, "respond") == "Echo: hello"
    await client.close()
