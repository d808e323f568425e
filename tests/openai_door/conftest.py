"""A node started as the README says (``gateway serve``, its embedded defaults: the
simulator, no keys, the in-process store, uvloop), shared by the module's tests, and a
raw client of the OpenAI door that validates every server event against the
``openai`` SDK's ``RealtimeServerEvent`` union."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.asyncio.client import ClientConnection, connect

from tests.support.procs import NodeProcess

MODELS = ("gpt-realtime-2.1", "gemini-3.8-live")
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


def _node(tmp_path_factory: pytest.TempPathFactory, *flags: str) -> Iterator[NodeProcess]:
    workspaces: Path = tmp_path_factory.mktemp("workspaces")
    proc = NodeProcess(
        ["serve", "--port", "0", "--workspace-root", str(workspaces), *flags],
        env={"REDIS_URL": "", "GATEWAY_API_KEYS_FILE": ""},
    )
    proc.start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    yield from _node(tmp_path_factory)


@pytest.fixture(scope="module")
def paced_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node whose simulator writes 200 chunks a second: an answer is still being
    written when a test's next frame arrives, however loaded the machine (unpaced, a
    whole answer can be through before the door reads that frame)."""
    yield from _node(tmp_path_factory, "--sim-tokens-per-second", "200")


class RawClient:
    """The door's wire as is: every server event is validated as it arrives."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, url: str, **kwargs: Any) -> RawClient:
        return cls(await connect(url, **kwargs))

    async def send(self, **event: Any) -> None:
        await self.ws.send(json.dumps(event))

    async def next(self, timeout: float = 30.0) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        event = json.loads(raw)
        SERVER_EVENT.validate_python(event)  # the SDK's contract, or the test fails
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while True:
            event = await self.next(timeout)
            got.append(event)
            if event["type"] == kind:
                return got

    async def text_session(self) -> list[dict[str, Any]]:
        """Answers in text (OpenAI's default, and a new door session's, is audio), as a
        text app asks; the events through its ``session.updated``."""
        await self.send(
            type="session.update", session={"type": "realtime", "output_modalities": ["text"]}
        )
        return await self.until("session.updated")

    async def user(self, text: str) -> None:
        """A user message created (held until a response.create)."""
        await self.send(
            type="conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            },
        )

    async def say(self, text: str) -> None:
        await self.user(text)
        await self.send(type="response.create")

    async def close(self) -> None:
        await self.ws.close()


def sdk_client(node: NodeProcess) -> AsyncOpenAI:
    """The ``openai`` SDK pointed at ``node``'s door (its key unused: auth is off)."""
    return AsyncOpenAI(
        api_key="unused",
        base_url=f"{node.http}/openai/v1",
        websocket_base_url=f"{node.base}/openai/v1",
    )


async def sdk_until(conn: Any, kind: str) -> list[dict[str, Any]]:
    """The SDK connection's events through the next of ``kind``, each checked against
    the SDK's types; an ``error`` fails the test."""
    seen: list[dict[str, Any]] = []
    while True:
        event: dict[str, Any] = json.loads(await conn.recv_bytes())
        SERVER_EVENT.validate_python(event)  # the SDK's contract
        assert event["type"] != "error", event
        seen.append(event)
        if event["type"] == kind:
            return seen
