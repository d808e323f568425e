"""A spoken session recorded and replayed: the user's audio goes again, at its pace.

Two gateways on an OpenAI-flavoured simulator (its transcript of speech is
its length, ``(speech 1.2 s)``): one records a session whose user speaks,
then types; ``gateway.client.replay`` sends the recorded audio to the other
at its recorded offsets, and the spoken turn comes out the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import running_gateway
from gateway.client import Client
from gateway.client.recording import fetch_recording
from gateway.client.replay import ReplayOptions, replay
from gateway.client.replay_plan import plan_replay
from gateway.config import load_config
from gateway.edge.server import Gateway
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from tests.support.recorded import gateway_cli, recording_of
from tests.voice.conftest import KEY, VoiceClient, utterance

pytestmark = pytest.mark.timeout(60)

RATE = 24000


@contextlib.asynccontextmanager
async def two_gateways(tmp_path: Path, **knobs: Any) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """A recording gateway (with its HTTP API) and a fresh one, on one simulator
    (``knobs``: the simulator's)."""
    async with serve_sim(SimConfig(flavor="openai", api_key=KEY, **knobs)) as sim:
        base: dict[str, Any] = {
            "provider": "openai",
            "openai_base_url": sim.url,
            "openai_api_key": KEY,
            "model": "sim",
            "port": 0,
            "workspace_root": str(tmp_path / "ws"),
        }
        recording = load_config({**base, "record": True, "api_port": 0}, env={})
        async with (
            running_gateway(recording) as recorder,
            running_gateway(load_config(base, env={})) as fresh,
        ):
            yield recorder, fresh


async def test_a_spoken_turn_replays_with_its_audio_at_its_recorded_pace(
    tmp_path: Path,
) -> None:
    async with two_gateways(tmp_path) as (recorder, fresh):
        async with Client(recorder.url) as client:
            await client.configure(
                input_audio={"format": "pcm16", "rate": RATE, "turn_detection": "server_vad"}
            )
            async for _ in client.speak(utterance(1.2, RATE), RATE):
                pass
            async for _ in client.send("hello"):
                pass
            sid = client.session_id
        data = await recording_of(recorder, sid, "")
        assert data == await fetch_recording(recorder.api_url, sid)
        plan = plan_replay(data)
        kinds = [a.kind for a in plan.actions]
        assert kinds[0] == "configure" and kinds[-1] == "user" and "audio" in kinds, kinds
        result = await replay(plan, ReplayOptions(url=fresh.url, idle_max=0.2))
    assert [d.changes for d in result.turns] == [[], []], result.notes
    spoken, typed = result.turns
    assert spoken.replayed is not None and spoken.replayed.user == "(speech 1.2 s)"
    assert spoken.replayed.spoken and spoken.replayed.answer == "Echo: (speech 1.2 s)"
    assert typed.replayed is not None and typed.replayed.answer == "Echo: hello"


async def test_an_eval_turn_spoken_by_espeak_ng_is_heard(tmp_path: Path) -> None:
    scenarios = tmp_path / "spoken.toml"
    scenarios.write_text(
        """
[[scenario]]
name = "spoken"

[[scenario.turn]]
say = "Hello, can you hear me?"
voice = "en-us"
expect = { matches = "^Echo: \\\\(speech \\\\d\\\\.\\\\d s\\\\)$", ends = "end" }

[[scenario.turn]]
user = "hello"
expect = { contains = "Echo: hello" }
"""
    )
    async with two_gateways(tmp_path) as (_, fresh):
        code, out, err = await gateway_cli("eval", str(scenarios), "--url", fresh.url)
    assert code == 0, out + err
    assert "(says) Hello, can you hear me?" in out and "2 of 2 turns passed" in out


async def test_a_barge_in_replays_at_its_recorded_offset(tmp_path: Path) -> None:
    async with two_gateways(tmp_path, tokens_per_second=20, chunk_size=2) as (recorder, fresh):
        client = await VoiceClient.connect(recorder.url)
        await client.configure(input_audio={"rate": RATE})
        await client.send({"type": "user", "content": "/raw " + "z" * 400})
        await client.until("respond")  # the answer is running: the user speaks over it
        sender = asyncio.create_task(client.stream(utterance(0.5, RATE), RATE))
        await client.until("cancelled")
        await client.turn_end()
        await sender
        sid = client.session.session_id
        await client.close()
        plan = plan_replay(await recording_of(recorder, sid, ""))
        result = await replay(plan, ReplayOptions(url=fresh.url, idle_max=0.2))
    assert [d.changes for d in result.turns] == [[], []], (result.turns, result.notes)
    cut, spoken = result.turns
    assert cut.replayed is not None and cut.replayed.outcome == "cancelled"
    assert spoken.replayed is not None and spoken.replayed.user == "(speech 0.5 s)"
