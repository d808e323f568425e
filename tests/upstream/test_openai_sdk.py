"""The official ``openai`` SDK talks to the simulator.

The SDK builds its event models without validation (``construct``), so a
missing required field would pass unnoticed there. Every raw frame is also
validated strictly with pydantic against the SDK's ``RealtimeServerEvent``
union and must come out as the model of its ``type``.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import AsyncIterator
from typing import Any

import pydantic
import pytest
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent

from gateway.sim.model import Sim, SimConfig
from gateway.sim.server import serve_sim

from .helpers import STEP_TIMEOUT


def _models_by_type() -> dict[str, type[pydantic.BaseModel]]:
    union = typing.get_args(RealtimeServerEvent)[0]  # strip Annotated[..., PropertyInfo]
    models: dict[str, type[pydantic.BaseModel]] = {}
    for model in typing.get_args(union):
        (tag,) = typing.get_args(model.model_fields["type"].annotation)
        models[tag] = model
    return models


MODELS = _models_by_type()
STRICT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RealtimeServerEvent)


class Recorder:
    """Keeps the raw frames the SDK parses, to validate them strictly."""

    def __init__(self) -> None:
        self.frames: list[str | bytes] = []

    def install(self, conn: Any) -> None:
        parse = conn.parse_event

        def recording_parse(data: str | bytes) -> Any:
            self.frames.append(data)
            return parse(data)

        conn.parse_event = recording_parse

    def check(self, events: list[Any]) -> None:
        assert len(self.frames) == len(events)
        for raw, event in zip(self.frames, events, strict=True):
            strict = STRICT.validate_json(raw)  # raises on a missing required field
            expected = MODELS[strict.type]
            assert type(strict) is expected, (strict.type, type(strict))
            assert type(event) is expected, (event, expected)


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    async with serve_sim(SimConfig(chunk_size=5)) as running:
        yield running


def client(sim: Sim) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="test", websocket_base_url=sim.url, max_retries=0)


async def test_sdk_text_turn(sim: Sim) -> None:
    recorder = Recorder()
    events: list[Any] = []
    deltas: list[str] = []
    async with client(sim).realtime.connect(model="gpt-realtime") as conn:
        recorder.install(conn)
        await conn.session.update(
            session={"type": "realtime", "output_modalities": ["text"], "instructions": "Be brief."}
        )
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hello sdk"}],
            }
        )
        await conn.response.create()
        async for event in _bounded(conn):
            events.append(event)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type == "response.done":
                break
        [conversation] = sim.conversations()
    assert "".join(deltas) == "<think>The user said something.</think>Echo: hello sdk<end>"
    recorder.check(events)
    types = [e.type for e in events]
    assert types[:4] == [
        "session.created",
        "session.updated",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert events[1].session.instructions == "Be brief."
    assert events[-1].response.status == "completed"
    assert events[-1].response.usage.output_tokens == len(deltas)
    assert conversation.instructions == "Be brief."
    assert conversation.messages()[0] == ("user", "hello sdk")


async def test_sdk_cancel_delete_and_errors() -> None:
    recorder = Recorder()
    events: list[Any] = []
    async with (
        serve_sim(SimConfig(tokens_per_second=50, chunk_size=1)) as sim,
        client(sim).realtime.connect(model="gpt-realtime") as conn,
    ):
        recorder.install(conn)
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "/raw " + "z" * 1000}],
            }
        )
        await conn.response.create()
        sent_cancel = False
        async for event in _bounded(conn):
            events.append(event)
            if event.type == "response.output_text.delta" and not sent_cancel:
                sent_cancel = True
                await conn.response.create()  # refused: a response is active
                await conn.response.cancel()
            if event.type == "response.done":
                item_id = event.response.output[0].id
                await conn.conversation.item.delete(item_id=item_id)
                await conn.conversation.item.delete(item_id=item_id)  # gone: error
            if event.type == "error" and event.error.code == "item_delete_invalid_item_id":
                break
    recorder.check(events)
    types = {e.type for e in events}
    assert {"response.done", "conversation.item.deleted", "error"} <= types
    [done] = [e for e in events if e.type == "response.done"]
    assert done.response.status == "cancelled"
    codes = [e.error.code for e in events if e.type == "error"]
    assert codes == ["conversation_already_has_active_response", "item_delete_invalid_item_id"]


async def _bounded(conn: Any) -> AsyncIterator[Any]:
    """``async for event in conn`` with a per-event timeout."""
    iterator = conn.__aiter__()
    while True:
        async with asyncio.timeout(STEP_TIMEOUT):
            event = await iterator.__anext__()
        yield event
