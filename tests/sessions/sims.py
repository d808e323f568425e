"""A provider's real adapter pointed at the in-process simulator, for the session rooms' tests."""

from __future__ import annotations

from gateway.sim.model import Sim
from gateway.upstream.provider import ProviderFactory
from gateway.upstream.providers import by_name

__all__ = ["SimFactory"]


class SimFactory(ProviderFactory):
    """``provider``'s factory on ``sim`` (of that flavour), noting what it is told fails."""

    def __init__(
        self, sim: Sim, key: str = "sim-key", *, provider: str = "openai", model: str = "sim"
    ) -> None:
        row = by_name(provider)
        super().__init__(row, row.settings(base_url=sim.url, api_key=key), model)
        self.failures: list[tuple[str, bool]] = []

    def failed(self, provider: str, *, fatal: bool) -> str:
        self.failures.append((provider, fatal))
        return super().failed(provider, fatal=fatal)
