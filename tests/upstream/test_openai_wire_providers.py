"""Providers on OpenAI Realtime's wire: Azure's URL and key, xAI's session, OpenAI's controls.

Each adapter meets the simulator flavour of its provider (gateway/sim/openai_server.py),
which serves the path, key and session shape that provider documents (docs/providers.md).
"""

from __future__ import annotations

import pytest

from gateway.sim.model import SimConfig
from gateway.sim.openai import RealtimeConnection
from gateway.sim.openai_state import session_refusal
from gateway.sim.server import serve_sim
from gateway.upstream import openai_wire as wire
from gateway.upstream.azure import AzureRealtime
from gateway.upstream.base import (
    AudioIn,
    AudioOut,
    ModelOptions,
    UpstreamClosed,
    UpstreamError,
    VoiceConfig,
)
from gateway.upstream.openai import OpenAIRealtime
from gateway.upstream.xai import XaiRealtime
from protocol.assembly import Message

from .helpers import read_turn

KEY = "provider-key"


async def hi(up: OpenAIRealtime) -> str:
    """One user turn; the answer's text."""
    await up.add_message(Message(role="user", content="hi"))
    await up.start_response()
    return (await read_turn(up)).text


async def errors_of_a_turn(up: OpenAIRealtime) -> list[str]:
    """One user turn; the messages of the errors the server sent during it."""
    await up.add_message(Message(role="user", content="hi"))
    await up.start_response()
    turn = await read_turn(up)
    return [e.message for e in turn.errors if isinstance(e, UpstreamError)]


async def test_azure_takes_its_key_as_api_key_and_its_deployment_as_the_model() -> None:
    async with serve_sim(SimConfig(flavor="azure", api_key=KEY)) as sim:
        assert sim.url.endswith("/openai/v1")
        up = AzureRealtime(base_url=sim.url, api_key=KEY, model="my-deployment")
        assert up.headers() == {"api-key": KEY}
        await up.open("", [])
        assert "Echo: hi" in await hi(up)
        await up.close()
        entra = AzureRealtime(base_url=sim.url, api_key=KEY, model="d", auth="bearer")
        assert entra.headers() == {"Authorization": f"Bearer {KEY}"}
        await entra.open("", [])
        await entra.close()
        wrong = AzureRealtime(
            base_url=sim.url, api_key="nope", model="d", key_variable="AZURE_OPENAI_API_KEY"
        )
        with pytest.raises(UpstreamClosed) as info:
            await wrong.open("", [])
        assert "401" in info.value.reason and "AZURE_OPENAI_API_KEY" in info.value.reason
        no_deployment = AzureRealtime(base_url=sim.url, api_key=KEY, model="")
        with pytest.raises(UpstreamClosed) as info:
            await no_deployment.open("", [])
        assert "404" in info.value.reason


async def test_xai_sends_its_flat_session_and_openai_refuses_it() -> None:
    voice = VoiceConfig(audio_out=AudioOut(voice="eve"), audio_in=AudioIn(rate=24000))
    async with serve_sim(SimConfig(flavor="xai", api_key=KEY)) as sim:
        up = XaiRealtime(base_url=sim.url, api_key=KEY)
        await up.open("Be brief.", [], voice=voice)
        sent = up.session_update("Be brief.", voice, None)
        assert sent.type is None and sent.voice == "eve"
        assert isinstance(sent.turn_detection, wire.TurnDetection)
        await hi(up)  # the session.update was handled before the turn's answer
        [connection] = sim.live()
        assert isinstance(connection, RealtimeConnection)
        session = connection.session
        assert session.audio is not None and session.audio.output is not None
        assert session.audio.output.voice == "eve"  # the flat voice was understood
        await up.close()
    async with serve_sim(SimConfig(flavor="openai")) as sim:
        flat = XaiRealtime(base_url=sim.url, api_key="k")
        await flat.open("", [], voice=voice)
        errors = await errors_of_a_turn(flat)
        await flat.close()
    assert any("session.type" in e or "session.voice" in e for e in errors), errors


async def test_openai_session_controls_reach_the_session() -> None:
    voice = VoiceConfig(
        audio_in=AudioIn(
            rate=24000, turn_detection="semantic_vad", eagerness="high", noise_reduction="far_field"
        )
    )
    options = ModelOptions(truncation=0.5, reasoning_effort="low")
    async with serve_sim(SimConfig(flavor="openai")) as sim:
        up = OpenAIRealtime(base_url=sim.url, api_key="k", model="gpt-realtime-2")
        await up.open("", [], voice=voice, options=options)
        await hi(up)
        [connection] = sim.live()
        assert isinstance(connection, RealtimeConnection)
        session = connection.session
        await up.close()
    assert session.audio is not None and session.audio.input is not None
    detection = session.audio.input.turn_detection
    assert isinstance(detection, wire.TurnDetection)
    assert (detection.type, detection.eagerness) == ("semantic_vad", "high")
    assert session.audio.input.noise_reduction == wire.NoiseReduction(type="far_field")
    assert session.truncation == wire.RetentionRatio(retention_ratio=0.5)
    assert session.reasoning == wire.Reasoning(effort="low")


@pytest.mark.parametrize(
    ("session", "param"),
    [
        (wire.Session(type="realtime", output_modalities=["text", "audio"]), "output_modalities"),
        (
            wire.Session(
                type="realtime",
                audio=wire.AudioConfig(
                    input=wire.AudioInput(
                        turn_detection=wire.TurnDetection(type="semantic_vad", idle_timeout_ms=5000)
                    )
                ),
            ),
            "idle_timeout_ms",
        ),
        (
            wire.Session(
                type="realtime",
                audio=wire.AudioConfig(
                    input=wire.AudioInput(
                        turn_detection=wire.TurnDetection(type="semantic_vad", eagerness="eager")
                    )
                ),
            ),
            "eagerness",
        ),
        (
            wire.Session(
                type="realtime",
                audio=wire.AudioConfig(
                    input=wire.AudioInput(noise_reduction=wire.NoiseReduction(type="loud"))
                ),
            ),
            "noise_reduction.type",
        ),
        (
            wire.Session(
                type="realtime",
                audio=wire.AudioConfig(input=wire.AudioInput(format=wire.AudioFormat(rate=16000))),
            ),
            "rate",
        ),
        (wire.Session(type="realtime", truncation="sometimes"), "truncation"),
        (
            wire.Session(type="realtime", truncation=wire.RetentionRatio(retention_ratio=1.5)),
            "retention_ratio",
        ),
        (wire.Session(type="realtime", reasoning=wire.Reasoning(effort="max")), "effort"),
    ],
)
def test_the_simulator_refuses_what_the_api_refuses(session: wire.Session, param: str) -> None:
    refused = session_refusal(session)
    assert refused is not None and refused[1].endswith(param), refused


def test_a_valid_session_is_taken() -> None:
    session = wire.Session(
        type="realtime",
        truncation="auto",
        reasoning=wire.Reasoning(effort="xhigh"),
        audio=wire.AudioConfig(
            input=wire.AudioInput(
                turn_detection=wire.TurnDetection(type="server_vad", idle_timeout_ms=6000)
            )
        ),
    )
    assert session_refusal(session) is None
