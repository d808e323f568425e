"""Fuzzing a live in-process gateway: fixtures and the checks every example ends with.

Each test runs one gateway (memory store, real sockets, the simulator) and
hypothesis throws many examples at it. After every example the session must
still answer a plain ``hello`` turn, and at the end no ERROR record with a
traceback may have been logged by the gateway or by websockets: an exception
that escaped a handler is a bug even if the client saw a clean close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from gateway.app import running_gateway
from gateway.config import load_config
from gateway.edge.server import Gateway
from protocol.events import Cancelled, End, Error, Metric, Respond, User
from tests.support.client import GatewayClient

__all__ = ["answers_hello", "crash_log", "fuzz_gateway", "settings_for"]


class CrashLog(logging.Handler):
    """Collects ERROR records that carry a traceback, from gateway.* and websockets."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.name.split(".")[0] in ("gateway", "websockets"):
            self.records.append(record)

    def report(self) -> str:
        return "\n\n".join(
            f"{r.name}: {r.getMessage()}\n{logging.Formatter().formatException(r.exc_info)}"  # type: ignore[arg-type]
            for r in self.records
        )


@pytest.fixture
def crash_log() -> Iterator[CrashLog]:
    handler = CrashLog()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
    assert not handler.records, "unhandled exceptions were logged:\n" + handler.report()


def settings_for(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "port": 0,
        "workspace_root": str(tmp_path / "workspaces"),
        "max_frame": 64 * 1024,
        "lease_ttl": 3.0,
    }
    settings.update(overrides)
    return settings


@pytest.fixture
async def fuzz_gateway(tmp_path: Path, crash_log: CrashLog) -> AsyncIterator[Gateway]:
    async with running_gateway(load_config(settings_for(tmp_path), env={})) as gw:
        yield gw


async def answers_hello(client: GatewayClient, timeout: float = 30.0) -> None:
    """The session runs a normal turn: ``hello`` → ``Echo: hello``.

    First a marker frame of an unknown type: the gateway handles a
    connection's frames in order and queues its replies in order, so once the
    marker's ``unknown_type`` reply is here, every frame of the example has
    been handled. From then on a ``turn_active`` reply answers ``hello``: wait
    for the running turn to finish and ask again.
    """
    marker = f"sync-{uuid.uuid4().hex[:12]}"
    async with asyncio.timeout(timeout):
        await client.send({"type": marker})
        await client.until(lambda e: isinstance(e, Error) and marker in e.content, timeout)
        while True:
            await client.user("hello")
            while True:
                event = await client.next(timeout)
                if isinstance(event, User) and event.content == "hello":
                    turn = await client.until(lambda e: isinstance(e, Metric), timeout)
                    text = "".join(e.content for e in turn if isinstance(e, Respond))
                    assert text == "Echo: hello", turn
                    return
                if isinstance(event, Error) and event.code == "turn_active":
                    # The running turn is over at its next end, cancelled or
                    # metric (after a model's <end> it still waits for the
                    # step's usage; without <end> the metric comes first).
                    await client.until(lambda e: isinstance(e, End | Cancelled | Metric), timeout)
                    break


async def reconnect_answers_hello(gw: Gateway, client: GatewayClient) -> GatewayClient:
    """After the server closed a connection: a fresh one to the same session works."""
    with contextlib.suppress(ConnectionClosed):
        await client.ws.close()
    again = await GatewayClient.connect(gw.url, session_id=client.sid, after=client.last_seq)
    await answers_hello(again)
    return again
