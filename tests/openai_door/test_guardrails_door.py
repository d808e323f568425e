"""Guardrails through the OpenAI door (issue 41), with the ``openai`` SDK's realtime client.

A user message an input rule blocks is refused as OpenAI refuses a bad request:
an ``error`` event (``invalid_request_error``, code ``guardrail_blocked``) naming
the client's ``event_id`` of the ``response.create`` that sent it; the model
never sees it. A spoken answer with a card number is cut where the number
starts: ``response.output_audio_transcript.delta`` up to there and
``[redacted]``, ``response.output_audio.delta`` of the words before it only, and
a cancelled ``response.done``.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from openai.types.realtime import RealtimeErrorEvent

from tests.openai_door.conftest import SERVER_EVENT
from tests.support.guardrail_checker import Checker, running_checker
from tests.support.guardrail_rules import PASSWORDS_AND_CARDS
from tests.voice.conftest import voice_gateway

pytestmark = pytest.mark.timeout(60)

MODEL = "gpt-realtime-2.1"
MS_PER_CHAR = 60
RULES = PASSWORDS_AND_CARDS


@contextlib.asynccontextmanager
async def door(tmp_path: Path) -> AsyncIterator[tuple[AsyncRealtimeConnection, Any]]:
    """The SDK's realtime connection to the door of a gateway with ``RULES``, and the
    simulator (4-character chunks, each spoken at 60 ms a character)."""
    rules = tmp_path / "guardrails.toml"
    rules.write_text(RULES)
    async with voice_gateway(
        "openai",
        tmp_path,
        gateway_settings={"guardrails": str(rules)},
        chunk_size=4,
        tokens_per_second=40,
        audio_ms_per_char=MS_PER_CHAR,
    ) as gw:
        base = gw.url.replace("/v1/realtime", "/openai/v1")
        client = AsyncOpenAI(
            api_key="unused", base_url=base.replace("ws://", "http://"), websocket_base_url=base
        )
        async with client.realtime.connect(model=MODEL) as conn:
            yield conn, gw.sim


async def until(conn: AsyncRealtimeConnection, kind: str, got: list[dict[str, Any]]) -> None:
    """Read server events (each checked against the SDK's union) through the next ``kind``."""
    while True:
        event = (await conn.recv()).model_dump(exclude_unset=True)
        SERVER_EVENT.validate_python(event)
        got.append(event)
        if event["type"] == kind:
            return


async def say(conn: AsyncRealtimeConnection, text: str, event_id: str) -> None:
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create(event_id=event_id)


def _shown_only_as_its_own_item(got: list[dict[str, Any]], secret: str) -> None:
    """The blocked text came back only in the item its client created (as OpenAI's
    service shows a created item), and that item was deleted with the block."""
    showing = [e for e in got if secret in str(e)]
    assert {e["type"] for e in showing} == {"conversation.item.added", "conversation.item.done"}
    [shown] = {e["item"]["id"] for e in showing}
    assert [e for e in got if e.get("item_id") == shown] == [
        {"type": "conversation.item.deleted", "event_id": ANY, "item_id": shown}
    ]


async def test_a_blocked_message_is_an_error_naming_the_event_that_sent_it(
    tmp_path: Path,
) -> None:
    got: list[dict[str, Any]] = []
    async with door(tmp_path) as (conn, sim):
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await until(conn, "session.updated", got)
        await say(conn, "hi, my password is hunter2", "evt_client_1")
        await until(conn, "error", got)
        # The session takes the next message, and the model never got the blocked one.
        await say(conn, "hello", "evt_client_2")
        await until(conn, "response.done", got)
        responses = sim.stats.responses_total
    [error] = [RealtimeErrorEvent.model_validate(e) for e in got if e["type"] == "error"]
    assert error.error.type == "invalid_request_error"
    assert error.error.code == "guardrail_blocked"
    assert error.error.event_id == "evt_client_1"
    assert "no-passwords" in error.error.message
    _shown_only_as_its_own_item(got, "hunter2")
    texts = [e["delta"] for e in got if e["type"] == "response.output_text.delta"]
    assert "".join(texts) == "Echo: hello"
    assert responses == 1  # no response to the blocked message was asked for


async def test_a_spoken_card_is_cut_from_the_transcript_and_the_audio(tmp_path: Path) -> None:
    before = "Your card is "
    got: list[dict[str, Any]] = []
    async with door(tmp_path) as (conn, sim):
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {"output": {"voice": "alloy"}},
            }
        )
        await until(conn, "session.updated", got)
        await say(conn, f"/raw {before}4242 4242 4242 4242, thanks!", "evt_card")
        await until(conn, "response.done", got)
        truncations = sim.stats.truncations
    transcript = "".join(
        e["delta"] for e in got if e["type"] == "response.output_audio_transcript.delta"
    )
    assert transcript == before + "[redacted]"
    pcm = b"".join(
        base64.b64decode(e["delta"]) for e in got if e["type"] == "response.output_audio.delta"
    )
    heard = len(pcm) * 500 / 24000
    assert 0 < heard <= len(before) * MS_PER_CHAR  # none of the number was spoken
    [done] = [e for e in got if e["type"] == "response.done"]
    assert done["response"]["status"] == "cancelled"
    assert truncations == [int(heard)]  # the model remembers what was heard


@pytest.fixture
async def checker() -> AsyncIterator[Checker]:
    async with running_checker() as seen:
        yield seen


async def test_a_message_an_http_checker_blocks_is_the_same_error(
    tmp_path: Path, checker: Checker
) -> None:
    rules = tmp_path / "guardrails.toml"
    rules.write_text(
        f'[[rule]]\nname = "app-check"\non = "input"\naction = "block"\ncheck_url = "{checker.url}"\n'
    )
    got: list[dict[str, Any]] = []
    async with voice_gateway("openai", tmp_path, gateway_settings={"guardrails": str(rules)}) as gw:
        base = gw.url.replace("/v1/realtime", "/openai/v1")
        client = AsyncOpenAI(
            api_key="unused", base_url=base.replace("ws://", "http://"), websocket_base_url=base
        )
        async with client.realtime.connect(model=MODEL) as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await until(conn, "session.updated", got)
            await say(conn, "the launch codes are 0000", "evt_client_1")
            await until(conn, "error", got)
            await say(conn, "hello", "evt_client_2")
            await until(conn, "response.done", got)
            responses = gw.sim.stats.responses_total
    [error] = [RealtimeErrorEvent.model_validate(e) for e in got if e["type"] == "error"]
    assert (error.error.code, error.error.event_id) == ("guardrail_blocked", "evt_client_1")
    assert "app-check" in error.error.message
    _shown_only_as_its_own_item(got, "0000")
    texts = [e["delta"] for e in got if e["type"] == "response.output_text.delta"]
    assert "".join(texts) == "Echo: hello"
    assert responses == 1
    assert [a["kind"] for a in checker.asked] == ["user", "user"]
