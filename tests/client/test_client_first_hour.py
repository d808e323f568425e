"""What the Python client does for its caller (issue 30): speak() ends the spoken
turn itself, configure() answers or raises, played() is quiet, several URLs fail over."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import msgspec
import pytest

from gateway.client import Client, ClientError, Refused
from gateway.client.client import CommandRefused, ConfigureRefused, event_kind
from gateway.common.pcm import silence, tone
from gateway.edge.auth import hash_key
from protocol.events import Configured, Context, Error, Replying, Respond
from tests.gateway.conftest import GatewayFactory
from tests.support.redis_server import free_port
from tests.voice.conftest import voice_gateway

RATE = 16000


async def test_speak_ends_the_turn_without_the_caller_padding_silence(tmp_path: Path) -> None:
    speech = silence(0.2, RATE) + tone(0.6, RATE)  # the audio stops with the speech
    async with voice_gateway("openai", tmp_path) as gw, Client(gw.url) as c:
        await c.configure(input_audio={"rate": RATE})
        async with asyncio.timeout(20):
            events = [e async for e in c.speak(speech, RATE)]
    kinds = [event_kind(e) for e in events]
    assert kinds[:3] == ["speech_started", "speech_stopped", "user"]
    assert kinds[-2:] == ["end", "metric"]


async def test_speak_with_commit_when_the_client_detects_turns(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw, Client(gw.url) as c:
        await c.configure(input_audio={"rate": RATE, "turn_detection": "none"})
        async with asyncio.timeout(20):
            events = [e async for e in c.speak(tone(0.5, RATE), RATE, commit=True)]
    kinds = [event_kind(e) for e in events]
    assert kinds[0] == "user" and kinds[-2:] == ["end", "metric"]


async def test_speak_says_so_when_no_speech_is_heard(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw, Client(gw.url) as c:
        await c.configure(input_audio={"rate": RATE})
        with pytest.raises(ClientError, match="no spoken turn started"):
            async with asyncio.timeout(20):
                [e async for e in c.speak(silence(0.3, RATE), RATE, end_timeout=1.0)]


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_configure_returns_the_answer_and_raises_a_refusal(
    gateway_factory: GatewayFactory, store_kind: str
) -> None:
    async with gateway_factory() as gw, Client(gw.url) as c:
        answer = await c.configure(instructions="Be brief.")
        assert isinstance(answer, Configured) and answer.config.instructions == "Be brief."
        with pytest.raises(ConfigureRefused) as refused:
            await c.configure(tools=[{"name": "bad", "parameters": {"type": "string"}}])
        assert refused.value.code == "bad_frame" and "object" in refused.value.content
        # The refusal was configure's: the next turn is not refused by it.
        events = [e async for e in c.send("hello")]
        assert "".join(e.content for e in events if isinstance(e, Respond)) == "Echo: hello"
        assert not [e for e in events if isinstance(e, Error)]


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_context_and_reply_add_to_the_conversation_and_answer_it(
    gateway_factory: GatewayFactory, store_kind: str
) -> None:
    async with gateway_factory() as gw, Client(gw.url) as c:
        [e async for e in c.send("hello")]
        added = await c.context("Greet them again.", timeout=10)
        assert isinstance(added, Context) and added.role == "system"
        events = [e async for e in c.reply()]
        assert isinstance(events[0], Replying) and event_kind(events[-1]) == "metric"
        assert "".join(e.content for e in events if isinstance(e, Respond)) == "Echo: hello"
        with pytest.raises(CommandRefused) as refused:
            await c.context("x", "tool")  # type: ignore[arg-type]
        assert refused.value.code == "bad_frame"


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_a_client_token_is_refused_configure(
    gateway_factory: GatewayFactory, store_kind: str, tmp_path: Path
) -> None:
    key = "rtgw_first-hour"
    keys = tmp_path / "keys"
    keys.write_text(f"alice:{hash_key(key)}\n")
    async with gateway_factory(api_keys_file=str(keys), api_port=0) as gw:
        request = urllib.request.Request(
            f"{gw.api_url}/v1/sessions",
            data=b"{}",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            method="POST",
        )
        made = json.loads(
            await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=10).read())
        )
        async with Client(gw.url, token=made["client_token"]) as c:
            with pytest.raises(ConfigureRefused) as refused:
                await c.configure(instructions="x")
            assert refused.value.code == "forbidden"
        # Deleted, its token's 404 speaks of the token's session, not of a session_id.
        delete = urllib.request.Request(
            f"{gw.api_url}/v1/sessions/{made['session_id']}",
            headers={"Authorization": f"Bearer {key}"},
            method="DELETE",
        )
        await asyncio.to_thread(lambda: urllib.request.urlopen(delete, timeout=10).read())
        with pytest.raises(Refused) as gone:
            await Client(gw.url, token=made["client_token"]).connect()
        assert gone.value.status == 404
        assert "this client token opens was deleted" in gone.value.message
        assert "session_id" not in gone.value.message


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_played_is_sent_and_a_gateway_that_does_not_know_it_is_not_an_error(
    gateway_factory: GatewayFactory, store_kind: str
) -> None:
    async with gateway_factory() as gw, Client(gw.url) as c:
        await c.played(1, 120)
        events = [e async for e in c.send("hello")]
        assert not [e for e in events if isinstance(e, Error)]
    # An older gateway answers unknown_type: taken silently, and played() stops,
    # whether the reply names the frame (reply_to) or not; never by its wording.
    for ref in ("played", msgspec.UNSET):
        quiet = Client("ws://127.0.0.1:1/v1/realtime")
        reply = Error(code="unknown_type", content="reworded", seq=0, reply_to=ref)
        assert quiet._answers_own_frame(reply)
        assert not quiet._played_supported
    other = Client("ws://127.0.0.1:1/v1/realtime")
    assert not other._answers_own_frame(Error(code="unknown_type", content="x", reply_to="m-1"))


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_several_urls_fail_over_to_the_one_that_answers(
    gateway_factory: GatewayFactory, store_kind: str
) -> None:
    dead = f"ws://127.0.0.1:{free_port()}/v1/realtime"
    tried: list[str] = []
    async with gateway_factory() as gw:
        client = Client([dead, gw.url], on_retry=lambda problem: tried.append(str(problem)))
        async with client as c:
            assert c.url == gw.url
            events = [e async for e in c.send("hello")]
            assert "".join(e.content for e in events if isinstance(e, Respond)) == "Echo: hello"
        assert tried and "nothing is listening" in tried[0]
    with pytest.raises(ClientError, match="nothing is listening"):
        async with Client([dead, dead]):
            pass
