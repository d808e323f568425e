"""Voice sessions across nodes: a takeover mid-answer and speech after it;
speech through another node moves a session whose driver hears no microphone.

Real processes (see conftest): a simulator paced at 20 chunks a second, two
`gateway serve` nodes on one Redis. The voice configuration is stored with
the session, so the node that takes it over listens with it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.common.pcm import silence, tone
from protocol.events import Error, Interrupt, Pong, Respond, SpeechStopped, User
from tests.multinode.conftest import NodeFactory, SimFactory
from tests.multinode.test_failover import assert_contiguous, drain_connection, final_answer
from tests.support.client import GatewayClient, text_of

RATE = 24000

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def speak(client: GatewayClient, seconds: float, lead: float = 0.3) -> None:
    """``lead`` s of silence, ``seconds`` of speech (a tone), 0.8 s of silence, at
    real-time pace in 20 ms binary frames."""
    pcm = silence(lead, RATE) + tone(seconds, RATE) + silence(0.8, RATE)
    size = RATE // 50 * 2
    start = time.monotonic()
    for index, at in enumerate(range(0, len(pcm), size)):
        delay = start + index * 0.02 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await client.send(pcm[at : at + size])


@pytest.mark.parametrize("provider", ["openai", "gemini"])
async def test_kill_9_mid_spoken_answer_then_speech_on_the_new_node(
    provider: str, start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20", "--flavor", provider)
    a = start_node(sim, "node-a", provider=provider)
    b = start_node(sim, "node-b", provider=provider)
    first = await GatewayClient.connect(a.url)
    await first.send({"type": "configure", "input_audio": {"rate": RATE}})
    await first.until_type("configured")
    speaker = asyncio.create_task(speak(first, 0.6))
    await first.until(lambda e: isinstance(e, Respond))  # the spoken turn's answer runs
    a.kill()
    await drain_connection(first)
    speaker.cancel()

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    assert second.session.resumed
    await second.until_type("end")
    await second.until_type("metric")
    events = first.events + second.events
    assert_contiguous(events)
    # Node B reran the interrupted turn from the transcript in the history.
    assert any(isinstance(e, Interrupt) for e in second.events)
    assert [e.content for e in events if isinstance(e, User)] == ["(speech 0.6 s)"]
    assert final_answer(events) == "Echo: (speech 0.6 s)"

    # Node B listens with the stored voice configuration: the user speaks again.
    await speak(second, 0.9)
    again = await second.until_type("end")
    again += await second.until_type("metric")
    assert any(isinstance(e, SpeechStopped) for e in again)
    assert [e.content for e in again if isinstance(e, User)] == ["(speech 0.9 s)"]
    assert text_of(again, "respond") == "Echo: (speech 0.9 s)"
    assert_contiguous(first.events + second.events)
    await second.close()


async def configured_on(node_url: str) -> GatewayClient:
    client = await GatewayClient.connect(node_url)
    await client.send({"type": "configure", "input_audio": {"rate": RATE}})
    await client.until_type("configured")
    return client


@pytest.mark.parametrize("provider", ["openai", "gemini"])
async def test_speech_through_another_node_moves_a_quiet_session_there(
    provider: str, start_sim: SimFactory, start_node: NodeFactory
) -> None:
    """The client's network moved: its old connection on node A sends nothing
    (and A may not notice for a while); its new one on node B speaks."""
    sim = start_sim("--tokens-per-second", "20", "--flavor", provider)
    a = start_node(sim, "node-a", provider=provider)
    b = start_node(sim, "node-b", provider=provider)
    first = await configured_on(a.url)
    resumed_after = first.last_seq
    second = await GatewayClient.connect(b.url, session_id=first.sid, after=resumed_after)
    # The first second of silence goes while node A lets the session go.
    await speak(second, 0.6, lead=1.0)
    turn = await second.until_type("end")
    turn += await second.until_type("metric")
    assert [e.content for e in turn if isinstance(e, User)] == ["(speech 0.6 s)"]
    assert text_of(turn, "respond") == "Echo: (speech 0.6 s)"
    # Node A let it go: its client was told the session moved (reconnect).
    await drain_connection(first)
    assert first.ws.close_code == 1012
    seqs = [e.seq for e in second.events if not isinstance(e, Error)]
    assert seqs == list(range(resumed_after + 1, resumed_after + 1 + len(seqs)))
    await second.close()


async def test_a_live_microphone_keeps_its_session_on_its_node(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await configured_on(a.url)
    live = asyncio.create_task(speak(first, 0.0, lead=4.0))  # a microphone in a quiet room
    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    await speak(second, 0.6)
    await second.send({"type": "ping"})
    heard = await second.until(lambda e: isinstance(e, Pong))
    refusals = [e for e in heard if isinstance(e, Error)]
    assert refusals and all(e.code == "turn_active" for e in refusals)
    assert not any(isinstance(e, User) for e in heard)
    await live
    # Node A still drives it, with its client attached: a turn there works.
    turn = await first.turn("still here")
    assert text_of(turn, "respond") == "Echo: still here"
    await first.close()
    await second.close()
