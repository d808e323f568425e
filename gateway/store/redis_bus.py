"""``RedisBus``: control messages between nodes over Redis pub/sub (``Bus``).

``PUBLISH``/``SUBSCRIBE`` on one server; sharded ``SPUBLISH``/``SSUBSCRIBE`` on a
Cluster, so a message goes to its channel's shard only
(``gateway.store.redis_topology``). Best effort, as the interface says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.store.redis_core import ERRORS, RedisCore

__all__ = ["RedisBus"]

log = logging.getLogger("gateway.store")


class RedisBus:
    """Channels named ``{prefix}:ctl:{channel}``."""

    def __init__(self, core: RedisCore) -> None:
        self._core = core

    def _channel(self, channel: str) -> str:
        return f"{self._core.prefix}:ctl:{channel}"

    async def publish(self, channel: str, data: bytes) -> int:
        """``PUBLISH``; on a Cluster ``SPUBLISH``, which only the channel's shard carries."""
        try:
            return await self._core.topology.publish(self._channel(channel), data)
        except ERRORS as exc:
            raise self._core.error(exc, "publishing a control message") from exc

    async def listen(self, channel: str, handler: Callable[[bytes], None]) -> None:
        """Subscribe on a connection of its own; after an outage or a failover, again."""
        name = self._channel(channel)
        while True:
            try:
                async with self._core.topology.messages(name) as messages:
                    async for data in messages:
                        handler(data)
            except ERRORS as exc:
                log.warning("%s; listening again in 1s", self._core.error(exc, "listening"))
                await asyncio.sleep(1.0)
