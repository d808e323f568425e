"""GPT-Live behind the OpenAI door: an app written for the Realtime protocol talks to
``?model=gpt-live-1.1`` unchanged, the gateway translating GPT-Live's own wire
(``/v1/live/sessions``, served by the simulator's GPT-Live flavour) both ways."""

from __future__ import annotations

import pytest

from tests.openai_door.conftest import RawClient, sdk_client
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(60)

MODEL = "gpt-live-1.1"


async def test_the_openai_sdk_has_a_spoken_text_turn_with_gpt_live(node: NodeProcess) -> None:
    client = sdk_client(node)
    async with client.realtime.connect(model=MODEL) as conn:
        # GPT-Live answers aloud only: the text comes as the audio's transcript.
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hello"}],
            }
        )
        await conn.response.create()
        transcript: list[str] = []
        audio = 0
        async for event in conn:
            assert event.type != "error", event
            if event.type == "response.output_audio.delta":
                audio += 1
            if event.type == "response.output_audio_transcript.delta":
                transcript.append(event.delta)
            if event.type == "response.done":
                assert event.response.status == "completed"
                break
        assert "Echo: hello" in "".join(transcript)
        assert audio > 0  # the answer was spoken


async def test_every_event_of_a_gpt_live_turn_is_the_sdks(node: NodeProcess) -> None:
    client = await RawClient.open(f"{node.base}/openai/v1/realtime?model={MODEL}")
    try:
        await client.send(
            type="session.update", session={"type": "realtime", "output_modalities": ["audio"]}
        )
        await client.say("hello")
        events = await client.until("response.done")  # each validated as it arrived
        kinds = [e["type"] for e in events]
        assert kinds[0] == "session.created"
        assert "response.output_audio_transcript.done" in kinds
        assert events[-1]["response"]["status"] == "completed"
    finally:
        await client.close()
