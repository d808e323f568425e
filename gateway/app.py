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
from gateway.sessions.node import Node
from gateway.store import open_store
from gateway.upstream.base import UpstreamFactory
from tools.builtin import default_registry

__all__ = ["running_gateway"]

log = logging.getLogger("gateway")


@contextlib.asynccontextmanager
async def _upstream_factory(config: Config) -> AsyncIterator[UpstreamFactory]:
    from gateway.upstream.gemini import DEFAULT_MODEL as GEMINI_DEFAULT_MODEL
    from gateway.upstream.gemini import GeminiLiveFactory
    from gateway.upstream.openai import OpenAIRealtimeFactory

    if config.provider == "sim":
        from gateway.sim.model import SimConfig
        from gateway.sim.server import serve_sim

        sim_config = SimConfig(
            flavor=config.sim_flavor,
            tokens_per_second=config.sim_tokens_per_second,
            chunk_size=config.sim_chunk_size,
            first_token_delay=config.sim_first_token_delay,
            drop_after=config.sim_drop_after,
        )
        async with serve_sim(sim_config, host="127.0.0.1", port=0) as sim:
            # The simulator speaks the chosen provider's wire: the real adapter drives it.
            factory: UpstreamFactory
            if config.sim_flavor == "gemini":
                factory = GeminiLiveFactory(
                    base_url=sim.url, model=config.model or "sim", api_key="sim"
                )
            else:
                factory = OpenAIRealtimeFactory(
                    base_url=sim.url, model=config.model or "sim", api_key="sim"
                )
            factory.provider = "sim"
            yield factory
        return
    if config.provider == "openai":
        if not config.openai_api_key:
            raise ConfigError(
                "provider openai needs an API key: set OPENAI_API_KEY (or GATEWAY_OPENAI_API_KEY)"
            )
        yield OpenAIRealtimeFactory(
            base_url=config.openai_base_url,
            model=config.model or "gpt-realtime",
            api_key=config.openai_api_key,
        )
        return
    if config.provider == "gemini":
        if not config.gemini_api_key:
            raise ConfigError(
                "provider gemini needs an API key: set GEMINI_API_KEY (or GATEWAY_GEMINI_API_KEY)"
            )
        yield GeminiLiveFactory(
            base_url=config.gemini_base_url,
            model=config.model or GEMINI_DEFAULT_MODEL,
            api_key=config.gemini_api_key,
        )
        return
    raise ConfigError(f"provider {config.provider!r} is not available: use sim, openai or gemini")


@contextlib.asynccontextmanager
async def running_gateway(config: Config) -> AsyncIterator[Gateway]:
    """A started gateway node; stopped (clients get 1001) when the block exits."""
    store = open_store(
        config.redis_url or None,
        prefix=config.key_prefix,
        ttl=config.session_ttl,
        max_log=config.max_log,
    )
    if store.kind == "memory":
        log.info(
            "store: in-process memory (sessions live as long as this process; "
            "set REDIS_URL to share them between nodes)"
        )
    else:
        log.info("store: %s", store.kind)
    try:
        async with _upstream_factory(config) as factory:
            node = Node(config, store, factory, default_registry(enable_shell=config.enable_shell))
            gateway = Gateway(node)
            await gateway.start()
            try:
                yield gateway
            finally:
                await gateway.close()
    finally:
        await store.close()
