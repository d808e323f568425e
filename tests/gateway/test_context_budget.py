"""Bounded context: a long session taken over by another node is given a history cut to budget.

The simulator's ``/context`` probe answers with the number of conversation
items its connection holds, so the test sees what the provider was given.
"""

from __future__ import annotations

import re

import pytest

from protocol.budget import context_tokens_estimate
from protocol.events import Respond
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient, text_of

TURNS = 6
LONG = "tell me about this, " * 30  # ~600 characters, ~170 tokens a message


async def _items_after_reopen(gateway_factory: GatewayFactory, context_tokens: int) -> int:
    async with gateway_factory(context_tokens=context_tokens) as gw:
        client = await GatewayClient.connect(gw.url)
        for n in range(TURNS):
            await client.turn(f"{n}: {LONG}")
        await client.close()
    # Another node takes the session over: its upstream opens from history.
    async with gateway_factory(context_tokens=context_tokens) as gw:
        again = await GatewayClient.connect(gw.url, session_id=client.sid, after=client.last_seq)
        events = await again.turn("/context")
        await again.close()
    m = re.fullmatch(r"Context: (\d+) items", text_of(events, "respond"))
    assert m, [e for e in events if isinstance(e, Respond)]
    return int(m.group(1))


@pytest.mark.parametrize("store_kind", ["redis"], indirect=True)
async def test_a_reopened_session_gives_the_model_fewer_messages_under_a_budget(
    gateway_factory: GatewayFactory,
) -> None:
    whole = await _items_after_reopen(gateway_factory, 0)
    assert whole == 2 * TURNS + 1  # every user message and answer, and the probe
    async with gateway_factory() as gw:
        prompt = context_tokens_estimate(gw.node.setups.system_prompt)
    # Room for the probe and about two of the long turns.
    cut = await _items_after_reopen(gateway_factory, prompt + 2 * 200)
    assert 1 < cut < whole
    # The budget keeps the latest turn even when nothing else fits.
    assert await _items_after_reopen(gateway_factory, 1) == 1
