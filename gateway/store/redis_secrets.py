"""``RedisSecrets``: the nodes' shared secret and the API keys hash (``Secrets``).

The keys hash ``{prefix}:keys`` maps an API key's SHA-256 digest to its
``key_id [tools=…]``; the gateway and ``gateway keys`` reach it only through
here, so it works on every store URL (one server, Sentinel, Cluster: the hash
is one key) with the store's connections and failover handling.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.redis_core import RedisCore

__all__ = ["RedisSecrets"]


class RedisSecrets:
    """Secrets under ``{prefix}:secret:{name}``, API keys in the hash ``{prefix}:keys``."""

    def __init__(self, core: RedisCore) -> None:
        self._core = core
        self.keys_hash = f"{core.prefix}:keys"

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        """``SET NX`` then ``GET``: the first node's candidate wins, every node reads it."""
        key = f"{self._core.prefix}:secret:{name}"
        await self._core.run("storing a shared secret", "SET", key, candidate, "NX")
        stored = await self._core.run("reading a shared secret", "GET", key)
        return bytes(stored) if stored is not None else candidate

    async def api_key(self, digest: str) -> str | None:
        raw = await self._core.run("reading an API key", "HGET", self.keys_hash, digest)
        return raw.decode() if raw is not None else None

    async def api_keys(self, digests: Sequence[str]) -> dict[str, str]:
        if not digests:
            return {}
        raw = await self._core.run("reading API keys", "HMGET", self.keys_hash, *digests)
        return {d: v.decode() for d, v in zip(digests, raw, strict=True) if v is not None}

    async def all_api_keys(self) -> dict[str, str]:
        raw = await self._core.run("listing API keys", "HGETALL", self.keys_hash)
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def put_api_key(self, digest: str, value: str) -> None:
        await self._core.run("storing an API key", "HSET", self.keys_hash, digest, value)

    async def remove_api_keys(self, digests: Sequence[str]) -> int:
        if not digests:
            return 0
        return int(await self._core.run("revoking API keys", "HDEL", self.keys_hash, *digests))
