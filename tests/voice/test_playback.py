"""Playback reports: a barge-in tells the provider and the log what the user heard.

A client playing the model's spoken answer reports how much of it it played
(``{"type": "played", "seq": N, "ms": M}``). When the user's speech cuts the
answer, the OpenAI adapter truncates the provider's item at the newest report
(``conversation.item.truncate`` with that ``audio_end_ms``), so the model's
memory is what was heard, and the ``cancelled`` event keeps it (``heard_ms``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.sim.model import Sim
from protocol.events import Cancelled
from tests.voice.conftest import VoiceClient, utterance, voice_gateway

RATE = 24000


async def report_playback(client: VoiceClient, every_ms: int, stop: asyncio.Event) -> int:
    """Report playback as a player would: the audio received so far, as it plays."""
    played = 0
    while not stop.is_set():
        await asyncio.sleep(every_ms / 1000)
        if client.audio:
            played += every_ms
            seq = client.audio[-1][0]
            await client.send({"type": "played", "seq": seq, "ms": played})
    return played


async def test_a_barge_in_truncates_the_spoken_answer_where_the_client_stopped(
    tmp_path: Path,
) -> None:
    async with voice_gateway(
        "openai", tmp_path, tokens_per_second=20, chunk_size=2, audio_ms_per_char=60
    ) as gw:
        sim: Sim = gw.sim
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio")
        await client.send({"type": "user", "content": "/raw " + "z" * 200})
        await client.until("respond")  # the answer is being spoken
        stop = asyncio.Event()
        player = asyncio.create_task(report_playback(client, 100, stop))
        await asyncio.sleep(0.35)  # the user hears a bit of it...
        stop.set()
        heard = await player  # ...the player stops, its last report is final
        await client.stream(utterance(0.5, RATE), RATE)  # and talks over it
        cut = await client.until("cancelled")
        await client.turn_end()
        await client.close()
    cancelled = cut[-1]
    assert isinstance(cancelled, Cancelled) and cancelled.reason == "barge_in"
    assert heard > 0
    assert cancelled.heard_ms == heard
    assert sim.stats.truncations == [heard]


async def test_a_played_report_needs_no_voice_and_is_not_an_error(tmp_path: Path) -> None:
    """A report with nothing to cut (a text session) is taken and changes nothing."""
    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.send({"type": "played", "seq": 0, "ms": 10})
        await client.send({"type": "user", "content": "hi"})
        events = await client.turn_end()
        await client.close()
    assert not [e for e in events if type(e).__name__ == "Error"]
