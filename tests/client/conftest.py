"""Client tests run against real gateways (the fixtures of tests/gateway)."""

from tests.gateway.conftest import gateway, gateway_factory, store_kind

__all__ = ["gateway", "gateway_factory", "store_kind"]
