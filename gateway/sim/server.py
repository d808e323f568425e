"""Run a simulator of either flavour: ``serve_sim`` for tests, ``run_sim`` for ``gateway sim``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import AsyncIterator, Callable

from gateway.sim.gemini import GeminiSim
from gateway.sim.model import Sim, SimConfig
from gateway.sim.openai_server import OpenAISim
from gateway.upstream.providers import flavour_of

__all__ = ["run_sim", "serve_sim"]

log = logging.getLogger("gateway.sim")


def _make_sim(config: SimConfig) -> Sim:
    """The simulator of the wire ``config.flavor``'s provider speaks, served as it serves it."""
    if flavour_of(config.flavor).wire == "gemini":
        return GeminiSim(config)
    return OpenAISim(config)


@contextlib.asynccontextmanager
async def serve_sim(
    config: SimConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    ssl: ssl_module.SSLContext | None = None,
) -> AsyncIterator[Sim]:
    """Run a simulator of ``config.flavor`` for the ``async with`` block.

    ``port=0``: any free port. With ``ssl`` it serves ``wss://`` (the
    ``google-genai`` SDK always connects with TLS).
    """
    sim = _make_sim(config or SimConfig())
    await sim.start(host, port, ssl=ssl)
    try:
        yield sim
    finally:
        await sim.close()


async def run_sim(
    config: SimConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    on_ready: Callable[[Sim], None] | None = None,
) -> None:
    """Serve until cancelled (``gateway sim``). ``on_ready`` is called once listening."""
    async with serve_sim(config, host, port) as sim:
        log.info("simulator (%s) listening on %s", sim.flavor, sim.endpoint)
        if on_ready is not None:
            on_ready(sim)
        await asyncio.Event().wait()
