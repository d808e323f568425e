"""``--model`` with several providers: one model each, in the providers' order.

One model name for ``openai,gemini`` was silently dropped (each provider ran
its default); now a list gives each provider its own, an empty entry keeps a
provider's default, and a count that does not match is refused at start.
"""

from __future__ import annotations

import pytest

from gateway.app import _node_factory, _upstream_factories
from gateway.config import ConfigError, load_config
from gateway.upstream.base import ProviderChain

KEYS = {"openai_api_key": "k", "gemini_api_key": "k"}


@pytest.mark.timeout(20)
async def test_each_provider_gets_its_own_model() -> None:
    config = load_config({"provider": "openai,gemini", "model": "m-one, m-two", **KEYS}, env={})
    async with _upstream_factories(config) as factories:
        chain = _node_factory(config, factories)
    assert isinstance(chain, ProviderChain)
    assert chain.factories["openai"].model == "m-one"
    assert chain.factories["gemini"].model == "m-two"
    assert chain.model == "m-one"  # the primary's, until a fallback


@pytest.mark.timeout(20)
async def test_an_empty_entry_keeps_that_providers_default() -> None:
    config = load_config({"provider": "openai,gemini", "model": ",m-two", **KEYS}, env={})
    async with _upstream_factories(config) as factories:
        chain = _node_factory(config, factories)
        defaults = _node_factory(load_config({"provider": "openai", **KEYS}, env={}), factories)
    assert isinstance(chain, ProviderChain)
    assert chain.factories["openai"].model == defaults.model != ""
    assert chain.factories["gemini"].model == "m-two"


@pytest.mark.parametrize("model", ["gpt-realtime", "a,b,c"])
def test_a_model_count_that_does_not_match_is_refused(model: str) -> None:
    with pytest.raises(ConfigError, match="one per provider"):
        load_config({"provider": "openai,gemini", "model": model, **KEYS}, env={})
