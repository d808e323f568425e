"""Guardrails on a spoken answer (issue 41), through a real gateway on the simulator.

The simulator speaks ``/raw`` text back, each 4-character chunk as its audio
(60 ms a character) and then its transcript, as OpenAI's wire does. An output
rule that redacts card numbers cuts the answer where the number starts: the
client gets the transcript up to there and ``[redacted]``, the audio of the
words before the number and nothing after, a ``guardrail`` event and the
turn's ``cancelled``; the provider's item is truncated to the audio sent (the
model remembers what was heard). Neither the export nor the recording holds
the number.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.app import running_gateway
from gateway.config import load_config
from gateway.edge.server import Gateway
from gateway.sim.model import Sim, SimConfig
from gateway.sim.server import serve_sim
from protocol.audio import OUTPUT_RATE
from protocol.events import Cancelled, Guardrail, Respond
from tests.support.recorded import recording_of
from tests.voice.conftest import KEY, VoiceClient

pytestmark = pytest.mark.timeout(60)

RULES = """
[[rule]]
name = "no-cards"
on = "output"
action = "redact"
detect = "card"
"""
CARD = "4242 4242 4242 4242"
MS_PER_CHAR = 60


@contextlib.asynccontextmanager
async def guarded(
    tmp_path: Path, provider: str, rules: str = RULES, tokens_per_second: float = 40
) -> AsyncIterator[tuple[Gateway, Sim]]:
    """A recording gateway with ``rules`` (and its HTTP API) on a ``provider`` simulator."""
    path = tmp_path / "guardrails.toml"
    path.write_text(rules)
    sim_config = SimConfig(
        flavor=provider,
        api_key=KEY,
        chunk_size=4,
        tokens_per_second=tokens_per_second,
        audio_ms_per_char=MS_PER_CHAR,
    )
    async with serve_sim(sim_config) as sim:
        settings: dict[str, Any] = {
            "provider": provider,
            f"{provider}_base_url": sim.url,
            f"{provider}_api_key": KEY,
            "model": "sim",
            "port": 0,
            "api_port": 0,
            "record": True,
            "guardrails": str(path),
            "workspace_root": str(tmp_path / "ws"),
        }
        async with running_gateway(load_config(settings, env={})) as gw:
            yield gw, sim


def audio_ms(client: VoiceClient) -> float:
    return sum(len(pcm) for _, pcm in client.audio) * 500 / OUTPUT_RATE


async def export(gw: Gateway, sid: str) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{gw.api_url}/v1/sessions/{sid}/events?after=0") as r,
    ):
        assert r.status == 200
        page = await r.json()
    assert not page["has_more"]
    return list(page["events"])


@pytest.mark.parametrize("provider", ["openai", "gemini"])
async def test_a_spoken_card_is_cut_from_the_transcript_the_audio_and_every_record(
    provider: str, tmp_path: Path
) -> None:
    before = "Your card is "
    asked = f"/raw {before}{CARD}, thanks!"
    async with guarded(tmp_path, provider) as (gw, sim):
        client = await VoiceClient.connect(gw.url)
        sid = client.session.session_id
        await client.configure(output="audio")
        await client.send({"type": "user", "content": asked})
        turn = await client.turn_end()
        # The next turn is whole again: the cut ended one answer, not the session's audio.
        await client.send({"type": "user", "content": "/raw All good."})
        after = await client.turn_end()
        await client.close()
        exported = await export(gw, sid)
        recording = await recording_of(gw, sid, "")

    said = "".join(e.content for e in turn if isinstance(e, Respond))
    assert said == before + "[redacted]"
    trips = [(e.rule, e.action, e.on) for e in turn if isinstance(e, Guardrail)]
    assert trips == [("no-cards", "redact", "output")]
    assert isinstance(turn[-2], Cancelled)
    assert "".join(e.content for e in after if isinstance(e, Respond)) == "All good."
    # The audio of the words before the number went out, none of the number's: at most
    # "Your card is" (its space is spoken with the number's first digits).
    spoken = audio_ms(client) - len("All good.") * MS_PER_CHAR
    assert 0 < spoken <= len(before) * MS_PER_CHAR
    if provider == "openai":
        # The provider keeps the audio that was sent: its memory is what was heard.
        assert sim.stats.truncations == [int(spoken)]
    # The user's own message holds the number (a rule on the input could stop it); what
    # the model said holds it nowhere.
    lines = [orjson.loads(line) for line in recording.splitlines()]
    recorded = [line["event"] for line in lines if line["kind"] == "event"]
    for events in (exported, recorded):
        told = [e.get("content", "") for e in events if e["type"] != "user"]
        assert told and not any("42" in str(content) for content in told)
        logged = "".join(e["content"] for e in events if e["type"] == "respond")
        assert logged == before + "[redacted]All good."
    assert CARD.encode() not in recording.replace(asked.encode(), b"")
    frames = [line for line in lines if line["kind"] == "upstream"]
    assert frames and all(f.get("elided") in ("guardrails", "audio") for f in frames)


async def test_a_blocked_message_s_guardrail_event_names_it(tmp_path: Path) -> None:
    rules = RULES + '\n[[rule]]\nname = "no-pw"\non = "input"\naction = "block"\npattern = "pw:"\n'
    async with guarded(tmp_path, "openai", rules) as (gw, _):
        client = await VoiceClient.connect(gw.url)
        await client.send({"type": "user", "content": "my pw: hunter2", "id": "m-1"})
        [trip] = await client.until("guardrail")
        await client.send({"type": "user", "content": "hello", "id": "m-2"})
        turn = await client.turn_end()
        await client.close()
    assert isinstance(trip, Guardrail)
    assert (trip.rule, trip.action, trip.on, trip.reply_to) == ("no-pw", "block", "input", "m-1")
    assert "".join(e.content for e in turn if isinstance(e, Respond)) == "Echo: hello"


async def test_a_card_that_ends_a_fast_spoken_answer_is_cut_before_its_turn_ends(
    tmp_path: Path,
) -> None:
    """The whole answer comes at once and ends with the number: it is judged when the
    response is complete, while the turn still runs, so the provider's item is still
    truncated to what was sent."""
    before = "Your card is "
    async with guarded(tmp_path, "openai", tokens_per_second=0) as (gw, sim):
        client = await VoiceClient.connect(gw.url)
        await client.configure(output="audio")
        await client.send({"type": "user", "content": f"/raw {before}{CARD}"})
        turn = await client.turn_end()
        await client.close()
    assert "".join(e.content for e in turn if isinstance(e, Respond)) == before + "[redacted]"
    cancelled = turn[-2]
    assert isinstance(cancelled, Cancelled) and cancelled.content == "stopped by a guardrail"
    spoken = audio_ms(client)
    assert 0 < spoken <= len(before) * MS_PER_CHAR
    assert sim.stats.truncations == [int(spoken)]
