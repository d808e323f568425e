"""Provider fallback through a running gateway: two simulators, the primary made to fail.

The gateway is configured ``provider=openai,gemini`` against an OpenAI-flavour
simulator and a Gemini-flavour one. What a client notices: its turns are
answered (by the fallback), an ``interrupt`` names the new provider when a
step was cut, and no error reaches it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway.pricing import PriceTable
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from gateway.upstream.gemini import DEFAULT_MODEL as GEMINI_MODEL
from protocol.events import Error, Interrupt, Metric
from tests.gateway.conftest import GatewayFactory
from tests.gateway.test_turns import assert_contiguous
from tests.support.client import GatewayClient, text_of

pytestmark = pytest.mark.parametrize("store_kind", ["memory"], indirect=True)


@asynccontextmanager
async def two_providers(
    gateway_factory: GatewayFactory, openai: SimConfig, **settings: Any
) -> AsyncIterator[tuple[str, Any, Any]]:
    async with (
        serve_sim(openai) as primary,
        serve_sim(SimConfig(flavor="gemini", api_key="gemini-key")) as fallback,
        gateway_factory(
            provider="openai,gemini",
            openai_base_url=primary.url,
            openai_api_key="openai-key",
            gemini_base_url=fallback.url,
            gemini_api_key="gemini-key",
            **settings,
        ) as gw,
    ):
        yield gw.url, primary, fallback


def final_answer(events: list[Any]) -> str:
    last = max((i for i, e in enumerate(events) if isinstance(e, Interrupt)), default=-1)
    return text_of(events[last + 1 :], "respond")


async def test_a_refused_key_moves_the_session_to_the_next_provider(
    gateway_factory: GatewayFactory,
) -> None:
    # The primary expects another key: every handshake is refused with 401.
    refusing = SimConfig(flavor="openai", api_key="another-key")
    async with two_providers(gateway_factory, refusing) as (url, primary, fallback):
        client = await GatewayClient.connect(url)
        one = await client.turn("hello")
        assert text_of(one, "respond") == "Echo: hello"
        # Nothing was cut (the refusal came before any output): no interrupt, no error.
        assert not any(isinstance(e, Interrupt | Error) for e in one)
        two = await client.turn("and again")
        assert text_of(two, "respond") == "Echo: and again"
        # The fallback holds the whole conversation, rebuilt from history.
        [conversation] = fallback.conversations()
        assert [text for role, text in conversation.messages() if role == "user"] == [
            "hello",
            "and again",
        ]
        assert primary.stats.responses_total == 0
        # Priced as the provider that answered, not as the primary.
        metric = next(e for e in two if isinstance(e, Metric))
        gemini_cost = PriceTable().cost("gemini", GEMINI_MODEL, metric.step)
        assert gemini_cost > 0
        assert metric.cost.step == pytest.approx(gemini_cost)
        assert_contiguous(client)
        await client.close()


async def test_repeated_drops_trip_the_breaker_and_the_interrupt_names_the_fallback(
    gateway_factory: GatewayFactory,
) -> None:
    # Every connection to the primary drops after 3 chunks, mid-step.
    dropping = SimConfig(flavor="openai", api_key="openai-key", drop_after=3)
    async with two_providers(gateway_factory, dropping, upstream_retries=4) as (url, _, fallback):
        client = await GatewayClient.connect(url)
        events = await client.turn("hello there")
        interrupts = [e for e in events if isinstance(e, Interrupt)]
        assert interrupts and "gemini" in interrupts[-1].content
        assert final_answer(events) == "Echo: hello there"
        assert not any(isinstance(e, Error) for e in events)
        assert fallback.stats.responses_total == 1
        assert_contiguous(client)
        await client.close()
