"""``input_audio_buffer.clear`` through the door: the audio appended before it is not
heard (the simulator's transcript is the length of the speech it holds), on a provider
whose API can discard it (OpenAI's flavour); one that cannot (Gemini's) says so."""

from __future__ import annotations

import base64

import pytest

from tests.openai_door.conftest import RawClient
from tests.support.procs import NodeProcess
from tests.voice.conftest import utterance

pytestmark = pytest.mark.timeout(60)
RATE = 24000
MANUAL = {
    "type": "realtime",
    "output_modalities": ["text"],
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None}},
}


async def _append(client: RawClient, pcm: bytes) -> None:
    size = RATE // 10 * 2  # 100 ms pieces: no pacing needed without VAD
    for at in range(0, len(pcm), size):
        audio = base64.b64encode(pcm[at : at + size]).decode()
        await client.send(type="input_audio_buffer.append", audio=audio)


async def test_cleared_audio_is_not_heard(node: NodeProcess) -> None:
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model=gpt-realtime-2.1")
    try:
        await client.send(type="session.update", session=MANUAL)
        await client.until("session.updated")
        await _append(client, utterance(0.8, RATE))
        await client.send(type="input_audio_buffer.clear", event_id="c_clear")
        await client.until("input_audio_buffer.cleared")
        await _append(client, utterance(0.4, RATE))
        await client.send(type="input_audio_buffer.commit")
        events = await client.until("response.done")
    finally:
        await client.close()
    assert not any(e["type"] == "error" for e in client.events), client.events
    heard = next(
        e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"
    )
    assert heard["transcript"] == "(speech 0.4 s)"  # the 0.8 s before the clear is gone


async def test_a_provider_that_cannot_discard_audio_says_so(node: NodeProcess) -> None:
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model=gemini-3.8-live")
    try:
        # Nothing heard yet: nothing to discard, as OpenAI's service answers.
        await client.send(type="input_audio_buffer.clear")
        await client.until("input_audio_buffer.cleared")
        await client.send(type="session.update", session=MANUAL)
        await client.until("session.updated")
        await _append(client, utterance(0.4, RATE))
        await client.send(type="input_audio_buffer.clear", event_id="c_clear")
        error = (await client.until("error"))[-1]["error"]
    finally:
        await client.close()
    assert error["event_id"] == "c_clear"
    assert "cannot discard audio" in error["message"] and "gemini" in error["message"]
