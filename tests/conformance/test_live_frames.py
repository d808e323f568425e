"""Every GPT-Live frame the gateway sends validates against the ``openai`` SDK's types.

A real gateway (``--provider openai --model gpt-live-1.1``) runs a text turn,
a client-delegation tool turn and a voice turn against the simulator's live
flavour; every frame the gateway sent to ``/v1/live/sessions`` must parse as
the SDK's ``openai.types.live.ClientEvent`` of its ``type``, with no field
the SDK does not know (the service refuses unknown fields), and every frame
the simulator sent back as the SDK's ``ServerEvent``.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest
from openai.types.live import ClientEvent, ServerEvent

from gateway.sim.live import LiveConnection
from gateway.upstream import live_wire
from tests.gateway.test_gpt_live import DELEGATE, live_gateway
from tests.voice.conftest import VoiceClient, utterance, voice_gateway

CLIENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ClientEvent)
SERVER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ServerEvent)


def _tags(union: Any) -> set[str]:
    models = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0] for m in models}


def extras(value: Any, path: str = "$") -> list[str]:
    """Fields of ``value`` (a parsed SDK model) that the SDK's models do not declare."""
    found: list[str] = []
    if isinstance(value, pydantic.BaseModel):
        for name in value.model_extra or {}:
            found.append(f"{path}.{name}")
        for name in type(value).model_fields:
            found += extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += extras(item, f"{path}[{index}]")
    return found


class Frames:
    """The frames of every live connection, both ways (the simulator's hooks wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[bytes] = []  # by the gateway
        self.received: list[bytes] = []  # by the gateway, from the simulator
        dispatch, send = LiveConnection._dispatch, LiveConnection._send

        async def recording_dispatch(conn: LiveConnection, data: bytes) -> None:
            self.sent.append(data)
            await dispatch(conn, data)

        async def recording_send(conn: LiveConnection, event: live_wire.ServerEvent) -> None:
            self.received.append(live_wire.encode(event))
            await send(conn, event)

        monkeypatch.setattr(LiveConnection, "_dispatch", recording_dispatch)
        monkeypatch.setattr(LiveConnection, "_send", recording_send)

    def check(self) -> set[str]:
        for raw in self.sent:
            event = CLIENT.validate_json(raw)
            assert not extras(event), (raw[:300], extras(event))
        for raw in self.received:
            event = SERVER.validate_json(raw)
            assert not extras(event), (raw[:300], extras(event))
        return {live_wire.event_type(raw) for raw in self.sent}


async def test_the_gateways_frames_are_the_sdks_client_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames = Frames(monkeypatch)
    async with live_gateway(tmp_path / "text") as (client, _):
        await client.turn("hello")
        await client.send({"type": "configure", "tools": [DELEGATE]})
        await client.until_type("configured")
        await client.user("/tool look it up")
        calls = await client.until_type("call")
        call_id = getattr(calls[-1], "id", "")
        await client.send(
            {"type": "tool_result", "id": call_id, "status": "success", "content": "ok"}
        )
        await client.until_type("end")
    live = {"model": "gpt-live-1.1"}
    async with voice_gateway("openai", tmp_path / "voice", gateway_settings=live) as gw:
        voice = await VoiceClient.connect(gw.url)
        await voice.configure(input_audio={"rate": 24000}, output="audio")
        await voice.stream(utterance(0.6, 24000), 24000)
        await voice.turn_end()
        await voice.close()
    kinds = frames.check()
    assert {
        "session.start",
        "session.commentary.append",
        "session.input_audio.append",
    } <= kinds
    assert kinds <= _tags(ClientEvent)
