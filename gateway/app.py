"""Assembling a gateway node from a ``Config``: store, upstream, tools, server.

``running_gateway(config)`` is the one way to get a running node, used by the
CLI, the tests and the benchmarks alike, so what is tested is what is run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
from collections.abc import AsyncIterator
from typing import Final

import msgspec

from gateway.config import Config, ConfigError
from gateway.edge.server import Gateway
from gateway.phone.control import PhoneControl
from gateway.phone.edge import PhoneEdge
from gateway.pricing import PricesError, PriceTable, load_prices
from gateway.sessions.node import Node, UpstreamFactories
from gateway.store import open_store
from gateway.tracing import Tracing, TracingError
from gateway.upstream import providers
from gateway.upstream.base import ProviderChain, UpstreamFactory
from gateway.upstream.models import model_refusal, model_warning
from gateway.upstream.provider import Provider, ProviderSettings
from gateway.webrtc.route import install as install_webrtc
from protocol.fallback import ProviderBreaker
from tools.builtin.phone import phone_tools
from tools.registry import Registry
from tools.toolset import builtin_names, open_registry
from tools.toolsfile import ToolsFileError, load_tools_file

__all__ = ["running_gateway"]

log = logging.getLogger("gateway")

STARTUP_PING_SECONDS = 5.0
"""How long a starting node waits for the store to answer once (it starts either way)."""


@contextlib.asynccontextmanager
async def _upstream_factories(config: Config) -> AsyncIterator[UpstreamFactories]:
    """``(provider, model)`` → its factory: the node's own, and those sessions pick.

    Every provider of the table (``gateway.upstream.providers``) is served
    with its settings; one without an API key raises ``ValueError`` saying
    which variable sets it. ``sim`` is the in-process simulator, which runs
    when the node's own provider is ``sim``, driven by the adapter of the
    provider whose wire it speaks (``--sim-flavor``).
    """
    async with contextlib.AsyncExitStack() as stack:
        sim_urls: dict[str, str] = {}  # flavour → its simulator's URL
        if providers.SIM in config.providers:
            from gateway.sim.server import serve_sim

            # The node's flavour, and one per provider that lists models: a session that
            # names a provider's model (the OpenAI door's ?model=) is served by that
            # provider's flavour.
            for flavor in dict.fromkeys((config.sim.flavor, *SIM_FLAVOURS)):
                sim_config = msgspec.structs.replace(config.sim, flavor=flavor)
                sim = await stack.enter_async_context(
                    serve_sim(sim_config, host="127.0.0.1", port=0)
                )
                sim_urls[flavor] = sim.url

        def make(provider: str, model: str) -> UpstreamFactory:
            if provider == providers.SIM:
                if not sim_urls:
                    raise ValueError("'sim' is served only by gateways whose own provider is sim")
                # The simulator speaks the chosen provider's wire: the real adapter drives it.
                named = sim_flavor_of(model)
                flavour = providers.by_name(named or config.sim.flavor)
                sim_url = sim_urls[flavour.name if named else config.sim.flavor]
                sim_row = dataclasses.replace(
                    flavour,
                    name=providers.SIM,
                    label=f"the simulator ({flavour.label} flavour)",
                    key_variable="GATEWAY_SIM_API_KEY",
                )
                settings = flavour.settings(base_url=sim_url, api_key=config.sim.api_key or "sim")
                return sim_row.factory(settings, model or "sim")
            row = providers.by_name(provider)
            settings = config.upstream(provider)
            own = provider in config.providers  # the node's own: its errors stop the start
            if not settings.api_key:
                if own:
                    raise ConfigError(
                        f"provider {provider} needs an API key: set {row.key_variable} "
                        f"(or GATEWAY_{provider.upper()}_API_KEY)"
                    )
                raise ValueError(f"{provider!r} has no API key configured on this gateway")
            missing = _missing(row, settings, model)
            if missing is not None:
                raise ConfigError(missing) if own else ValueError(missing)
            factory = row.factory(settings, model)
            _check_model(provider, factory.wire, factory.model, own=own)
            return factory

        yield make


SIM_FLAVOURS: Final = tuple(
    row.name for row in providers.PROVIDERS if row.models and row.sim is not None
)
"""The flavours a simulator node serves besides its own: the providers that list models."""


def sim_flavor_of(model: str) -> str | None:
    """The simulator flavour serving ``model`` on a simulator node: the provider whose
    model it is (its row lists it), or None for a model no provider lists."""
    row = providers.listing(model)
    return row.name if row is not None and row.sim is not None else None


def _missing(row: Provider, settings: ProviderSettings, model: str) -> str | None:
    """What a provider with no default URL or model needs set (Azure: both), or None."""
    if not settings.base_url:
        example = f" (e.g. {row.example_base_url})" if row.example_base_url else ""
        return f"provider {row.name} needs its URL: set --{row.name}-base-url{example}"
    if not model and not row.default_model:
        return (
            f"provider {row.name} needs a {row.model_is}: set --model to your {row.model_is}'s name"
        )
    return None


_warned: set[tuple[str, str]] = set()


def _check_model(provider: str, wire: str, model: str, *, own: bool) -> None:
    """Refuse a model its provider shut down (naming the replacement); log, once, one
    that is deprecated or that the model table does not know."""
    today = datetime.date.today()
    found = providers.facts(wire, model)
    refused = model_refusal(provider, found, today)
    if refused is not None:
        raise ConfigError(refused) if own else ValueError(refused)
    warning = model_warning(provider, found, today)
    if warning is not None and (provider, model) not in _warned:
        _warned.add((provider, model))
        log.warning("%s", warning)


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
async def _open_tools(config: Config, phone: PhoneControl) -> AsyncIterator[Registry]:
    """The node's tools: built-ins, plus the tools file's MCP servers and HTTP tools,
    plus the call tools when they are on (``--phone-tools``: they act through ``phone``)."""
    # A tools file is checked and its servers started before anything listens;
    # its mistakes are configuration errors (one line, exit 2), not tracebacks.
    try:
        tools_file = (
            load_tools_file(config.tools_file, builtin_names=builtin_names())
            if config.tools_file
            else None
        )
        async with open_registry(tools_file, enable_shell=config.enable_shell) as registry:
            if config.phone.tools:
                for tool in phone_tools(phone):
                    registry.register(tool)
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
        config.store or None,
        prefix=config.key_prefix,
        ttl=config.session_ttl,
        max_log=config.max_log,
        memory_bytes=config.memory_store_mb << 20,
        durability=config.durability,
        replica_timeout=config.replica_timeout,
        retry_window=config.store_retry_window,
    )
    if store.kind == "memory":
        log.info(
            "store: in-process memory (sessions live as long as this process; "
            "set --store (GATEWAY_STORE or REDIS_URL) to a Redis URL to share them between nodes)"
        )
    else:
        log.info("store: %s (durability %s)", store.kind, config.durability)
    try:
        # Learn the store's topology (a Cluster's slots, Sentinel's primary)
        # before listening: the first handshake's half-second store probe
        # should not pay for it. A store that is down now is not fatal here;
        # one that refuses for good (a wrong password…) is: waiting cannot fix it.
        refused: str | None = None
        with contextlib.suppress(TimeoutError):
            refused = await asyncio.wait_for(store.refusal(), STARTUP_PING_SECONDS)
        if refused is not None:
            raise ConfigError(refused)
        phone = PhoneControl(config.phone)  # the call tools' side, before the tools
        async with _open_tools(config, phone) as registry, _upstream_factories(config) as factories:
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
            node.metrics.store.watch(store.unconfirmed)
            gateway = Gateway(
                node,
                lambda edges: PhoneEdge(node, edges, phone),
                lambda app, door, serve, owns, caller: install_webrtc(
                    app, config, door, serve, owns, caller
                ),
            )
            await gateway.start()
            try:
                yield gateway
            finally:
                await gateway.close()
    finally:
        await store.close()
        # After the node stopped: its last spans (turns cut by the stop) are flushed.
        tracing.close()
