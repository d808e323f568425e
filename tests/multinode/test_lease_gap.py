"""A Redis outage longer than the lease costs no turn (issue 13.6).

While Redis is down the lease expires on the server's clock; when it comes
back, the session's held batch is usually retried before the node's lease
keeper runs again. The append then finds nobody holding the lease: that is no
takeover, and the node takes the lease back instead of dropping the session.
"""

from __future__ import annotations

import asyncio
import time

import redis

from protocol.events import End, Interrupt, Metric, Respond, decode_event
from tests.multinode.conftest import LEASE_TTL, NodeFactory, SimFactory
from tests.multinode.test_failover import MESSAGE, assert_contiguous, logged
from tests.support.client import GatewayClient, text_of
from tests.support.redis_server import RedisServer


def _outage(server: RedisServer, seconds: float) -> None:
    """Stop Redis for ``seconds`` (the outage's length is what is tested), then start it."""
    server.stop()
    time.sleep(seconds)
    server.start()


async def test_an_outage_longer_than_the_lease_keeps_the_turn_on_its_node(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    client = await GatewayClient.connect(a.url)
    await client.user(MESSAGE)
    await client.until(lambda e: isinstance(e, Respond))
    await asyncio.to_thread(_outage, durable_redis, LEASE_TTL * 1.5)
    await client.until(lambda e: isinstance(e, Metric), timeout=40)
    # The same node finished the turn for the same connection: no 1012, no rerun.
    assert client.ws.close_code is None
    assert not any(isinstance(e, Interrupt) for e in client.events)
    assert text_of(client.events, "respond") == f"Echo: {MESSAGE}"
    assert_contiguous(client.events)
    again = await client.turn("after the outage")
    assert text_of(again, "respond") == "Echo: after the outage"
    assert_contiguous(client.events)
    r = redis.Redis.from_url(durable_redis.url)
    entries = r.xrange(f"rtgw:{{{client.sid}}}:log")
    r.close()
    assert [decode_event(fields[b"d"]) for _, fields in entries] == logged(client.events)
    assert any(isinstance(e, End) for e in client.events)
    await client.close()
