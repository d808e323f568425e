"""Replies carry the seq the connection was sent (a replay too), and JSON audio is audio.

Issue 30: a pong after a replay said seq 0, and a 20 ms microphone sending
``{"type": "audio"}`` frames sat exactly at the 50 frames/s limit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib

import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from gateway.common.pcm import silence
from gateway.edge.closes import CloseCode
from protocol.events import Error, Pong
from tests.edge.conftest import GatewayFactory
from tests.support.client import GatewayClient

memory_only = pytest.mark.parametrize("store_kind", ["memory"])


@memory_only
async def test_a_pong_after_a_replay_repeats_the_last_seq_sent(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        first = await GatewayClient.connect(gw.url)
        await first.turn("hello")
        last, sid = first.last_seq, first.sid
        await first.close()
        # A reconnect that replays the whole log, with a ping sent at once.
        again = await GatewayClient.connect(gw.url, session_id=sid, after=0)
        await again.send({"type": "ping"})
        events = await again.until(lambda e: isinstance(e, Pong))
        pong = events[-1]
        assert [e.seq for e in events[:-1]] == list(range(1, last + 1))
        assert pong.seq == last
        # An error reply is stamped the same way.
        await again.send("{not json")
        error = await again.next()
        assert isinstance(error, Error) and error.seq == last
        await again.close()


@memory_only
async def test_json_audio_frames_do_not_count_against_the_frame_limit(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(client_frames_per_second=5.0, client_frame_burst=5) as gw:
        client = await GatewayClient.connect(gw.url)
        await client.send({"type": "configure", "input_audio": {"format": "pcm16", "rate": 24000}})
        await client.until_type("configured")
        frame = {"type": "audio", "audio": base64.b64encode(silence(0.02, 24000)).decode()}
        for _ in range(60):  # 1.2 s of 20 ms frames at once: far past 5/s with bursts of 5
            await client.send(frame)
        # Still under the limit for other frames: a ping is answered, no rate_limited came.
        await client.send({"type": "ping"})
        events = await client.until(lambda e: isinstance(e, Pong))
        assert not [e for e in events if isinstance(e, Error)], events
        await asyncio.sleep(0)
        await client.close()


@memory_only
@pytest.mark.parametrize(("voice", "json"), [(True, False), (True, True), (False, False)])
async def test_an_audio_flood_is_refused_then_closed_while_a_microphone_is_not(
    gateway_factory: GatewayFactory, voice: bool, json: bool
) -> None:
    """Found from outside: audio had no limit at all. One client sending 80,000 tiny
    frames a second (with voice configured, or not) took a core, kept /healthz waiting
    over a second and another client's ping 0.7 s."""
    async with gateway_factory() as gw:
        mic = await GatewayClient.connect(gw.url)
        flood = await GatewayClient.connect(gw.url)
        for client in (mic, flood) if voice else (mic,):
            await client.send(
                {"type": "configure", "input_audio": {"format": "pcm16", "rate": 24000}}
            )
            await client.until_type("configured")
        chunk = silence(0.02, 24000)
        frame = {"type": "audio", "audio": base64.b64encode(chunk).decode()}
        with contextlib.suppress(ConnectionClosed):
            for sent in range(5_000):  # past the burst (1,000): a flood, not a microphone
                await flood.ws.send(orjson.dumps(frame).decode() if json else b"\0\0")
                if sent % 50 == 0:
                    await mic.ws.send(chunk)  # an honest microphone beside it
        with contextlib.suppress(ConnectionClosed):
            await flood.until(lambda e: False, timeout=20)
        assert flood.ws.close_code == CloseCode.RATE_LIMITED
        told = [e for e in flood.events if isinstance(e, Error) and e.code == "rate_limited"]
        assert told and "too many audio frames" in told[0].content
        await mic.send({"type": "ping"})
        events = await mic.until(lambda e: isinstance(e, Pong))
        assert not [e for e in events if isinstance(e, Error)], events
        await mic.close()
