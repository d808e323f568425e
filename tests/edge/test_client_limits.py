"""What one client can cost a node: frames per second, stored sessions, close frames.

Issues 13.9 (flooding client, a session record per connection) and 13.6 (a
lost session closed with 1000: its reason was longer than a close frame holds).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from websockets.exceptions import ConnectionClosed

from gateway.edge.closes import MAX_REASON_BYTES, close_reason
from gateway.edge.frame_rate import FrameRate, Verdict, over_limit, weight
from protocol.events import Error, Pong
from tests.edge.conftest import GatewayFactory, http_get, metric_value
from tests.support.client import GatewayClient, text_of

memory_only = pytest.mark.parametrize("store_kind", ["memory"])


# --------------------------------------------------------------------- close reasons


def test_close_reasons_are_cut_to_123_bytes_on_a_character_boundary() -> None:
    assert close_reason("short") == "short"
    for text in ("x" * 200, "é" * 100, "a" + "€" * 60, "🙂" * 40):
        reason = close_reason(text)
        data = reason.encode()  # would raise on a cut character
        assert len(data) <= MAX_REASON_BYTES and reason.endswith("…"), reason
        assert text.startswith(reason[:-1])
    exact = "y" * MAX_REASON_BYTES
    assert close_reason(exact) == exact


async def test_a_lost_session_closes_1012_with_a_reason_that_fits(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        await client.turn("hello")
        store, sid = gw.node.store, client.sid
        # Another node takes the session over (as after this node's lease expired).
        await store.release_lease(sid, gw.node.node_id)
        assert await store.acquire_lease(sid, "other-node", 30.0)
        await client.user("again")  # its first event cannot be logged: the lease is gone
        with contextlib.suppress(ConnectionClosed):
            await client.until(lambda e: False, timeout=20)
        assert client.ws.close_code == 1012, (client.ws.close_code, client.ws.close_reason)
        assert "reconnect" in (client.ws.close_reason or "")


# --------------------------------------------------------------------- frame rate


def test_the_bucket_refuses_then_closes_a_client_that_keeps_flooding() -> None:
    rate = FrameRate(rate=10.0, burst=5, now=0.0)
    assert [rate.check(0.0) for _ in range(5)] == [Verdict.ACCEPT] * 5
    assert rate.check(0.0) is Verdict.REFUSE
    assert abs(rate.wait() - 0.1) < 1e-9
    assert [rate.check(0.0) for _ in range(3)] == [Verdict.DROP] * 3
    assert rate.check(0.0) is Verdict.CLOSE
    # A client that slows down gets through again, and its count starts over.
    rate = FrameRate(rate=10.0, burst=5, now=0.0)
    for _ in range(6):
        rate.check(0.0)
    assert rate.check(0.1) is Verdict.ACCEPT and rate.refused == 1  # a frame let through
    assert rate.check(0.4) is Verdict.ACCEPT and rate.refused == 0  # slowed down: over
    # A client that keeps on at twice the rate is closed: half its frames are refused.
    rate = FrameRate(rate=10.0, burst=5, now=0.0)
    verdicts = [rate.check(n / 20) for n in range(40)]
    assert Verdict.CLOSE in verdicts and verdicts.count(Verdict.REFUSE) == 1
    assert FrameRate(rate=0.0, burst=1, now=0.0).check(0.0) is Verdict.ACCEPT  # off


def test_a_large_frame_counts_once_more_per_64_kib() -> None:
    """Decoding costs by size: 1 MiB events of 30,000 parts at 45 a second, each one
    frame, held a core (found from outside, 2026-12-07)."""
    assert [weight(n) for n in (0, 65_535, 65_536, 1 << 20)] == [1, 1, 2, 17]
    rate = FrameRate(rate=50.0, burst=200, now=0.0)
    sent = [rate.check(0.0, weight(1 << 20)) for _ in range(12)]
    assert sent.count(Verdict.ACCEPT) == 11  # 11 MiB at once, not 200
    assert rate.check(0.1, weight(100)) is Verdict.ACCEPT  # small frames go on meanwhile
    assert "one more per 64 KiB a frame holds" in over_limit("events", rate)
    assert "KiB" not in over_limit("audio frames", rate, sized=False)


@memory_only
async def test_a_flooding_client_is_told_then_closed_4029_and_the_node_stays_responsive(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(client_frames_per_second=5.0, client_frame_burst=20) as gw:
        flooder = await GatewayClient.connect(gw.url)
        for _ in range(20):
            await flooder.send({"type": "ping"})
        for _ in range(20):
            assert isinstance(await flooder.next(), Pong)  # a burst is served in full
        await flooder.send({"type": "ping"})
        refused = await flooder.next()
        assert isinstance(refused, Error) and refused.code == "rate_limited"
        assert "a second" in refused.content and "4029" in refused.content
        # It keeps going: closed with 4029 and a reason.
        with contextlib.suppress(ConnectionClosed):
            for _ in range(5_000):
                await flooder.send({"type": "ping"})
        with contextlib.suppress(ConnectionClosed):
            await flooder.until(lambda e: False, timeout=20)
        assert flooder.ws.close_code == 4029
        assert "too many frames" in (flooder.ws.close_reason or "")
        # Over the limit frames are dropped unread (a few pass as tokens refill).
        assert sum(isinstance(e, Pong) for e in flooder.events) < 100
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_client_frames_dropped_total") >= 20
        # Another client is served at once.
        other = await GatewayClient.connect(gw.url)
        assert text_of(await other.turn("hello", timeout=10), "respond") == "Echo: hello"
        await other.close()


@memory_only
async def test_a_client_flooding_at_full_speed_costs_the_node_no_backlog(
    gateway_factory: GatewayFactory,
) -> None:
    """Before: ~11k frames/s took a core and 12-15 s of backlog after the client left."""
    async with gateway_factory() as gw:
        flooder = await GatewayClient.connect(gw.url)
        frame = '{"type": "user", "content": "flood"}'

        async def flood() -> None:
            with contextlib.suppress(ConnectionClosed):
                for _ in range(20_000):
                    await flooder.ws.send(frame)

        await flood()
        with contextlib.suppress(ConnectionClosed):
            await flooder.until(lambda e: False, timeout=20)
        assert flooder.ws.close_code == 4029
        other = await GatewayClient.connect(gw.url)
        # A liveness check with a generous margin: the node answers at once.
        events = await asyncio.wait_for(other.turn("hello"), 5.0)
        assert text_of(events, "respond") == "Echo: hello"
        await other.close()


# --------------------------------------------------------------------- stored sessions


async def test_a_connection_that_sends_nothing_leaves_no_session_record(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        store = gw.node.store
        idle = await GatewayClient.connect(gw.url)
        await idle.send({"type": "ping"})
        assert isinstance(await idle.next(), Pong)
        # Another connection may join it before its first turn (same node).
        watcher = await GatewayClient.connect(gw.url, session_id=idle.sid)
        assert await store.get_meta(idle.sid) is None
        await watcher.close()
        await idle.close()
        assert await store.get_meta(idle.sid) is None
        assert await store.last_seq(idle.sid) == 0

        used = await GatewayClient.connect(gw.url)
        await used.turn("hello")
        meta = await store.get_meta(used.sid)
        assert meta is not None and meta["owner"]
        await used.close()
