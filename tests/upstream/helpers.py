"""Helpers for the upstream tests: read an adapter's events, scripted servers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from websockets.asyncio.server import ServerConnection, serve

from gateway.upstream.base import (
    ResponseDone,
    Resumable,
    TextDelta,
    Upstream,
    UpstreamError,
    UpstreamEvent,
)

# Fail a test fast (with a clear timeout) instead of waiting for pytest's 60 s.
STEP_TIMEOUT = 10.0


class Turn:
    """What one response produced, as the session would see it."""

    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.errors: list[UpstreamError] = []
        self.done: ResponseDone | None = None

    @property
    def text(self) -> str:
        return "".join(self.deltas)


async def recv(upstream: Upstream) -> UpstreamEvent:
    """The next event, resumption handles skipped (Gemini gives one after each turn)."""
    async with asyncio.timeout(STEP_TIMEOUT):
        while True:
            event = await upstream.recv()
            if not isinstance(event, Resumable):
                return event


async def read_turn(upstream: Upstream, turn: Turn | None = None) -> Turn:
    """Read events until ``ResponseDone``."""
    turn = turn or Turn()
    while True:
        event = await recv(upstream)
        if isinstance(event, Resumable):
            continue  # a resumption handle (Gemini's) is not part of the turn
        if isinstance(event, TextDelta):
            turn.deltas.append(event.text)
        elif isinstance(event, UpstreamError):
            turn.errors.append(event)
        else:
            turn.done = event
            return turn


async def read_until(upstream: Upstream, needle: str) -> Turn:
    """Read deltas until their text contains ``needle`` (fails on anything else)."""
    turn = Turn()
    while needle not in turn.text:
        event = await recv(upstream)
        if isinstance(event, Resumable):
            continue
        assert isinstance(event, TextDelta), event
        turn.deltas.append(event.text)
    return turn


@contextlib.asynccontextmanager
async def scripted_server(frames: Sequence[str], *, close: bool = False) -> AsyncIterator[str]:
    """A WebSocket server at ``/v1/realtime`` that sends ``frames`` then idles (or closes).

    Yields the base URL for ``OpenAIRealtime(base_url=...)``.
    """

    async def handler(ws: ServerConnection) -> None:
        for frame in frames:
            await ws.send(frame)
        if close:
            return
        async for _ in ws:
            pass

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1"


SESSION_CREATED = (
    '{"type": "session.created", "event_id": "e1", '
    '"session": {"type": "realtime", "id": "sess_1", "object": "realtime.session"}}'
)
