"""The Python client's voice API and ``loadtest --audio`` against a real gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.client.client import Client, event_kind
from gateway.client.loadtest import LoadTest, LoadTestConfig
from gateway.common.pcm import silence, tone
from protocol.events import User
from tests.voice.conftest import voice_gateway

RATE = 16000


async def test_client_speak_yields_the_spoken_turn(tmp_path: Path) -> None:
    heard: list[tuple[int, int]] = []
    speech = silence(0.2, RATE) + tone(0.6, RATE) + silence(0.8, RATE)
    async with voice_gateway("openai", tmp_path, audio_ms_per_char=5) as gw:
        client = Client(gw.url, on_audio=lambda seq, pcm: heard.append((seq, len(pcm))))
        async with client as c:
            await c.configure(input_audio={"rate": RATE}, output="audio")
            events = [e async for e in c.speak(speech, RATE)]
    kinds = [event_kind(e) for e in events]
    assert kinds[:3] == ["speech_started", "speech_stopped", "user"]
    assert kinds[-2:] == ["end", "metric"]
    user = events[2]
    assert isinstance(user, User) and user.source == "audio"
    assert heard and all(size > 0 for _, size in heard)


@pytest.mark.parametrize("trailing", [0.0, 1.5], ids=["cut", "with-silence"])
@pytest.mark.parametrize("provider", ["openai", "gemini"])
async def test_loadtest_audio_reports_speech_to_respond(
    provider: str, trailing: float, tmp_path: Path
) -> None:
    """Timed from the end of the speech, also in a recording whose silence after
    it outlasts the VAD's (the answer then comes before the file is sent)."""
    speech = silence(0.1, RATE) + tone(0.5, RATE) + silence(trailing, RATE)
    async with voice_gateway(provider, tmp_path) as gw:
        config = LoadTestConfig(url=gw.url, sessions=3, audio=speech, audio_rate=RATE)
        report = await LoadTest(config).run()
    assert report.turns_ok == 3 and not report.errors
    assert report.speech_to_respond.count == 3
    assert report.events_by_type["speech_stopped"] == 3
    # The simulator's VAD waits 500 ms of silence: the time counts from the speech.
    assert report.speech_to_respond.p50_ms >= 500
