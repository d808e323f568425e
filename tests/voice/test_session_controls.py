"""Session controls through the gateway: semantic VAD, the idle timeout, and a
provider that lacks a control saying so.

A client sets them in ``input_audio`` (``turn_detection``, ``eagerness``,
``idle_timeout_ms``, ``noise_reduction``) and at the top (``truncation``,
``reasoning_effort``); the OpenAI adapter sends them in its ``session.update``
and the simulator acts on them as the API documents (docs/providers.md).
"""

from __future__ import annotations

from pathlib import Path

from gateway.common.pcm import silence
from gateway.sim.model import Sim
from gateway.sim.openai import RealtimeConnection
from gateway.upstream import openai_wire as wire
from protocol.events import Configured, Error, User
from tests.voice.conftest import VoiceClient, kind, utterance, voice_gateway

RATE = 24000


def the_session(sim: Sim) -> wire.Session:
    """The session the simulator's one live connection was configured with."""
    [connection] = sim.live()
    assert isinstance(connection, RealtimeConnection)
    return connection.session


async def test_semantic_vad_hears_the_user_out_and_answers(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(
            input_audio={
                "rate": RATE,
                "turn_detection": "semantic_vad",
                "eagerness": "high",
                "noise_reduction": "near_field",
            },
            truncation=0.6,
            reasoning_effort="low",
        )
        await client.stream(utterance(0.6, RATE), RATE)
        events = await client.turn_end()
        session = the_session(gw.sim)
        await client.close()
    names = [kind(e) for e in events]
    assert "speech_started" in names and "speech_stopped" in names and "end" in names
    assert session.audio is not None and session.audio.input is not None
    detection = session.audio.input.turn_detection
    assert isinstance(detection, wire.TurnDetection)
    assert (detection.type, detection.eagerness) == ("semantic_vad", "high")
    assert session.audio.input.noise_reduction == wire.NoiseReduction(type="near_field")
    assert session.truncation == wire.RetentionRatio(retention_ratio=0.6)
    assert session.reasoning == wire.Reasoning(effort="low")


async def test_silence_after_an_answer_makes_the_model_speak_again(tmp_path: Path) -> None:
    """``idle_timeout_ms``: the user said nothing for that long; the model follows up
    by itself, and the client sees why (a transcript of the silence)."""
    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE, "idle_timeout_ms": 1000})
        await client.stream(utterance(0.5, RATE), RATE)
        await client.turn_end()  # the answer to the speech
        follow_up = await client.turn_end()  # nobody spoke for a second
        await client.close()
    transcripts = [e for e in follow_up if isinstance(e, User)]
    assert [t.content for t in transcripts] == ["(no speech for 1 s)"]
    assert kind(follow_up[-2]) == "end"


async def test_a_control_its_provider_lacks_is_refused_with_what_to_do(tmp_path: Path) -> None:
    async with voice_gateway("gemini", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.send({"type": "configure", "input_audio": {"turn_detection": "semantic_vad"}})
        refused = await client.until("error")
        # What it has is taken: Gemini thinks at a level.
        configured = await client.configure(reasoning_effort="high")
        await client.close()
    error = refused[-1]
    assert isinstance(error, Error) and error.code == "bad_frame"
    assert "semantic_vad" in error.content and "provider gemini" in error.content
    assert "leave it out" in error.content
    assert isinstance(configured, Configured) and configured.config.reasoning_effort == "high"


async def test_settings_that_contradict_each_other_are_refused(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.send(
            {"type": "configure", "input_audio": {"turn_detection": "none", "eagerness": "low"}}
        )
        [*_, error] = await client.until("error")
        await client.close()
    assert isinstance(error, Error) and error.code == "bad_frame"
    assert "eagerness applies to turn_detection semantic_vad only" in error.content


async def test_server_vad_tuning_reaches_the_provider_and_is_refused_where_it_cannot(
    tmp_path: Path,
) -> None:
    """``threshold``, ``prefix_padding_ms`` and ``silence_duration_ms`` go in OpenAI's
    ``turn_detection``; with another turn detection they contradict it."""
    tuned = {"rate": RATE, "threshold": 0.7, "prefix_padding_ms": 200, "silence_duration_ms": 900}
    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        configured = await client.configure(input_audio=tuned)
        # The 0.9 s of silence the session asked for ends the turn (0.8 s did not).
        await client.stream(utterance(0.5, RATE) + silence(0.4, RATE), RATE)
        await client.turn_end()
        session = the_session(gw.sim)
        await client.send(
            {"type": "configure", "input_audio": {**tuned, "turn_detection": "semantic_vad"}}
        )
        [*_, contradiction] = await client.until("error")
        await client.send({"type": "configure", "input_audio": {"threshold": 1.5}})
        [*_, out_of_range] = await client.until("error")
        await client.close()
    assert isinstance(configured, Configured) and configured.config.input_audio is not None
    assert configured.config.input_audio.silence_duration_ms == 900
    assert session.audio is not None and session.audio.input is not None
    detection = session.audio.input.turn_detection
    assert isinstance(detection, wire.TurnDetection)
    assert (detection.threshold, detection.prefix_padding_ms, detection.silence_duration_ms) == (
        0.7,
        200,
        900,
    )
    assert isinstance(contradiction, Error) and contradiction.code == "bad_frame"
    assert "threshold applies to turn_detection server_vad only" in contradiction.content
    assert isinstance(out_of_range, Error) and "threshold" in out_of_range.content


async def test_a_faster_voice_speaks_the_same_answer_in_less_audio(tmp_path: Path) -> None:
    """``speed`` (OpenAI's ``audio.output.speed``, 0.25-1.5) was not a setting at all; a
    provider without it (Gemini) refuses it by name."""

    async def spoken(client: VoiceClient) -> int:
        before = len(client.audio)
        await client.send({"type": "user", "content": "the same words"})
        await client.turn_end()
        return sum(len(pcm) for _, pcm in client.audio[before:])

    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(output="audio")
        normal = await spoken(client)
        configured = await client.configure(speed=1.5)
        fast = await spoken(client)
        session = the_session(gw.sim)
        await client.send({"type": "configure", "speed": 2})
        [*_, out_of_range] = await client.until("error")
        await client.close()
    assert isinstance(configured, Configured) and configured.config.speed == 1.5
    assert session.audio is not None and session.audio.output is not None
    assert session.audio.output.speed == 1.5
    assert 0 < fast < normal * 0.75  # 1/1.5 of it, give or take a frame
    assert isinstance(out_of_range, Error) and "speed" in out_of_range.content
    async with voice_gateway("gemini", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        normal = await client.configure(output="audio", speed=1.0)  # every provider's pace
        await client.send({"type": "configure", "output": "audio", "speed": 1.2})
        [*_, refused] = await client.until("error")
        await client.close()
    assert isinstance(normal, Configured)
    assert isinstance(refused, Error) and "provider gemini" in refused.content
    assert "speed" in refused.content
