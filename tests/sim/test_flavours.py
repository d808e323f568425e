"""Every provider row has a simulator flavour, and the flavour serves the row's own adapter.

The flavours derive from the rows (``Provider.sim``): a row added without one
fails here, not in a user's ``--sim-flavor``.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gateway.cli import build_parser
from gateway.pricing import DEFAULT_PRICES
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from gateway.upstream import providers
from gateway.upstream.base import ResponseDone, TextDelta
from gateway.upstream.provider import Provider
from protocol.assembly import Message
from tests.upstream.helpers import STEP_TIMEOUT

ROWS = [pytest.param(row, id=row.name) for row in providers.PROVIDERS]


@pytest.mark.parametrize("row", ROWS)
def test_every_provider_row_has_a_simulator_flavour(row: Provider) -> None:
    assert row.sim is not None, (
        f"provider {row.name!r} has no simulator flavour: give its row sim=SimFlavour(...) "
        "(gateway/upstream/provider.py) so that it is tested against the server it will meet"
    )
    assert row.name in providers.FLAVOURS
    assert build_parser().parse_args(["serve", "--sim-flavor", row.name]).sim_flavor == row.name


@pytest.mark.parametrize("row", ROWS)
async def test_the_flavour_serves_the_rows_adapter(row: Provider) -> None:
    """The row's adapter, configured as for the real API, answers a turn on its flavour."""
    async with serve_sim(SimConfig(flavor=row.name, api_key="k")) as sim:
        settings = row.settings(base_url=sim.url, api_key="k")
        upstream = row.factory(settings, "sim").create()
        try:
            async with asyncio.timeout(STEP_TIMEOUT):
                await upstream.open("", [Message(role="user", content="/raw ok<end>")])
                await upstream.start_response()
                text = ""
                while not isinstance(event := await upstream.recv(), ResponseDone):
                    if isinstance(event, TextDelta):
                        text += event.text
        finally:
            await upstream.close()
    assert text == "ok<end>"
    assert sim.stats.connections_total == 1


def test_a_row_without_a_flavour_is_refused_with_the_flavours_named() -> None:
    bare = dataclasses.replace(providers.by_name("openai"), name="acme", sim=None)
    assert bare.sim is None
    with pytest.raises(ValueError, match="flavor"):
        SimConfig(flavor="acme")
    with pytest.raises(ValueError, match="no simulator flavour 'acme': use openai"):
        providers.flavour_of("acme")


def test_models_and_prices_derive_from_the_rows() -> None:
    for row in providers.PROVIDERS:
        for model in row.models:
            assert model.wire == row.wire
            assert providers.facts(row.wire, model.name) == model
            if model.price is not None:
                assert DEFAULT_PRICES[row.name][model.name] == model.price
        if row.price is not None:
            assert DEFAULT_PRICES[row.name]["*"] == row.price
    assert providers.listing("grok-voice-latest") is providers.by_name("xai")
    assert providers.facts("gemini", "sim").answers == "text"
    assert not providers.facts("gemini", "gemini-next-live").known
