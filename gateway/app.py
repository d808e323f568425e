"""Assembling a gateway node from a ``Config``: store, upstream, tools, server.

``running_gateway(config)`` is the one way to get a running node, used by the
CLI, the tests and the benchmarks alike, so what is tested is what is run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from gateway.config import Config, ConfigError
from gateway.edge.server import Gateway
from gateway.pricing import PricesError, PriceTable, load_prices
from gateway.sessions.node import Node, UpstreamFactories
from gateway.settings import declared
from gateway.store import open_store
from gateway.tracing import Tracing, TracingError
from gateway.upstream.base import ProviderChain, UpstreamFactory
from protocol.fallback import ProviderBreaker
from tools.registry import Registry
from tools.toolset import builtin_names, open_registry
from tools.toolsfile import ToolsFileError, load_tools_file

__all__ = ["running_gateway"]

log = logging.getLogger("gateway")


@contextlib.asynccontextmanager
async def _upstream_factories(config: Config) -> AsyncIterator[UpstreamFactories]:
    """``(provider, model)`` → its factory: the node's own, and those sessions pick.

    A provider needs its API key (or, for ``sim``, the in-process simulator,
    which runs when the node's own provider is ``sim``); one that cannot be
    served raises ``ValueError`` saying what is missing.
    """
    from gateway.upstream.gemini import DEFAULT_MODEL as GEMINI_DEFAULT_MODEL
    from gateway.upstream.gemini import GeminiLiveFactory
    from gateway.upstream.openai import DEFAULT_MODEL as OPENAI_DEFAULT_MODEL
    from gateway.upstream.openai import OpenAIRealtimeFactory

    async with contextlib.AsyncExitStack() as stack:
        sim_url = ""
        if "sim" in config.providers:
            from gateway.sim.server import serve_sim

            sim = await stack.enter_async_context(serve_sim(config.sim, host="127.0.0.1", port=0))
            sim_url = sim.url

        def make(provider: str, model: str) -> UpstreamFactory:
            factory: UpstreamFactory
            if provider == "sim":
                if not sim_url:
                    raise ValueError("'sim' is served only by gateways whose own provider is sim")
                # The simulator speaks the chosen provider's wire: the real adapter drives it.
                adapter = (
                    GeminiLiveFactory if config.sim.flavor == "gemini" else OpenAIRealtimeFactory
                )
                factory = adapter(
                    base_url=sim_url, model=model or "sim", api_key=config.sim.api_key or "sim"
                )
                factory.provider = "sim"
                return factory
            if provider == "openai":
                return OpenAIRealtimeFactory(
                    base_url=config.openai_base_url,
                    model=model or OPENAI_DEFAULT_MODEL,
                    api_key=_provider_key(config, "openai", config.openai_api_key),
                )
            if provider == "gemini":
                return GeminiLiveFactory(
                    base_url=config.gemini_base_url,
                    model=model or GEMINI_DEFAULT_MODEL,
                    api_key=_provider_key(config, "gemini", config.gemini_api_key),
                )
            raise ValueError(f"no provider {provider!r}: use sim, openai or gemini")

        yield make


def _provider_key(config: Config, provider: str, key: str) -> str:
    if key:
        return key
    if provider in config.providers:
        return _api_key(provider, key)  # the node's own: a configuration error at start
    raise ValueError(f"{provider!r} has no API key configured on this gateway")


def _api_key(provider: str, key: str) -> str:
    """``key``, or a ``ConfigError`` naming the variables that set the provider's key."""
    if key:
        return key
    setting = next(d for d in declared(Config) if d.name == f"{provider}_api_key")
    raise ConfigError(
        f"provider {provider} needs an API key: set {' or '.join(reversed(setting.env))}"
    )


def _node_factory(config: Config, factories: UpstreamFactories) -> UpstreamFactory:
    """The node's own upstream: one provider's factory, or a ``ProviderChain`` of several.

    A list of providers takes a list of models, one each (``Config.models``):
    one model name would be wrong for all providers but one.
    """
    models = config.models or ("",) * len(config.providers)
    if len(config.providers) == 1:
        return factories(config.provider, models[0])
    chain = [factories(p, m) for p, m in zip(config.providers, models, strict=True)]
    breaker = ProviderBreaker(config.providers, cooldown=config.fallback_cooldown)
    return ProviderChain(chain, breaker)


@contextlib.asynccontextmanager
async def _open_tools(config: Config) -> AsyncIterator[Registry]:
    """The node's tools: built-ins, plus the tools file's MCP servers and HTTP tools."""
    # A tools file is checked and its servers started before anything listens;
    # its mistakes are configuration errors (one line, exit 2), not tracebacks.
    try:
        tools_file = (
            load_tools_file(config.tools_file, builtin_names=builtin_names())
            if config.tools_file
            else None
        )
        async with open_registry(tools_file, enable_shell=config.enable_shell) as registry:
            log.info("tools: %s", ", ".join(registry.names()) or "(none)")
            yield registry
    except ToolsFileError as exc:
        raise ConfigError(str(exc)) from None


def _prices(config: Config) -> PriceTable:
    """The built-in price table, with the prices file on top when one is set."""
    if not config.prices_file:
        return PriceTable()
    try:
        return load_prices(config.prices_file)
    except PricesError as exc:
        raise ConfigError(str(exc)) from None


def _tracing(config: Config) -> Tracing:
    """Tracing as the OTEL_* environment asks (off without it), built once per node."""
    try:
        return Tracing.from_env(node_id=config.node_id)
    except TracingError as exc:
        raise ConfigError(str(exc)) from None


@contextlib.asynccontextmanager
async def running_gateway(config: Config) -> AsyncIterator[Gateway]:
    """A started gateway node; stopped (clients get 1001) when the block exits."""
    prices = _prices(config)
    tracing = _tracing(config)
    store = open_store(
        config.redis_url or None,
        prefix=config.key_prefix,
        ttl=config.session_ttl,
        max_log=config.max_log,
        durability=config.durability,
        replica_timeout=config.replica_timeout,
        retry_window=config.store_retry_window,
    )
    if store.kind == "memory":
        log.info(
            "store: in-process memory (sessions live as long as this process; "
            "set REDIS_URL to share them between nodes)"
        )
    else:
        log.info("store: %s (durability %s)", store.kind, config.durability)
    try:
        async with _open_tools(config) as registry, _upstream_factories(config) as factories:
            factory = _node_factory(config, factories)
            node = Node(
                config,
                store,
                factory,
                registry,
                factories=factories,
                prices=prices,
                tracing=tracing,
            )
            gateway = Gateway(node)
            await gateway.start()
            try:
                yield gateway
            finally:
                await gateway.close()
    finally:
        await store.close()
        # After the node stopped: its last spans (turns cut by the stop) are flushed.
        tracing.close()
