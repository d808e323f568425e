"""A small test client for the gateway's client protocol (real WebSocket)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import orjson
from websockets.asyncio.client import ClientConnection, connect

from protocol.events import Event, Session, decode_event

__all__ = ["GatewayClient", "text_of"]


class GatewayClient:
    """One client connection: the session frame, then events; helpers to run turns."""

    def __init__(self, ws: ClientConnection, session: Session) -> None:
        self.ws = ws
        self.session = session
        self.events: list[Event] = []

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        session_id: str | None = None,
        after: int | None = None,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> GatewayClient:
        query: dict[str, str] = {}
        if session_id is not None:
            query["session_id"] = session_id
        if after is not None:
            query["after"] = str(after)
        target = f"{url}?{urlencode(query)}" if query else url
        # Unread events do not stop the socket being read (websockets' default queue of 16
        # does): a client closed with more unread waited 10 s for the server's close frame
        # it had stopped reading. A test of a slow client passes its own ``max_queue``.
        kwargs.setdefault("max_queue", None)
        ws = await connect(target, additional_headers=headers, max_size=None, **kwargs)
        first = decode_event(await ws.recv())
        assert isinstance(first, Session), f"first frame must be session, got {first!r}"
        return cls(ws, first)

    @property
    def sid(self) -> str:
        return self.session.session_id

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else self.session.seq

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        if isinstance(message, dict):
            await self.ws.send(orjson.dumps(message).decode())
        else:
            await self.ws.send(message)

    async def user(self, text: str) -> None:
        await self.send({"type": "user", "content": text})

    async def next(self, timeout: float = 20.0) -> Event:
        frame = await asyncio.wait_for(self.ws.recv(), timeout)
        event = decode_event(frame)
        self.events.append(event)
        return event

    async def until(self, pred: Callable[[Event], bool], timeout: float = 30.0) -> list[Event]:
        """Events up to and including the first one matching ``pred``."""
        got: list[Event] = []

        async def run() -> None:
            while True:
                ev = await self.next(timeout)
                got.append(ev)
                if pred(ev):
                    return

        await asyncio.wait_for(run(), timeout)
        return got

    async def until_type(self, kind: str, timeout: float = 30.0) -> list[Event]:
        return await self.until(lambda e: _type(e) == kind, timeout)

    async def turn(self, text: str, timeout: float = 30.0) -> list[Event]:
        """Send a user message and collect events through the turn's metric after end."""
        await self.user(text)
        got = await self.until_type("end", timeout)
        got += await self.until_type("metric", timeout)
        return got

    async def close(self) -> None:
        await self.ws.close()


def _type(event: Event) -> str:
    return type(event).__struct_config__.tag  # type: ignore[return-value]


def text_of(events: list[Event], kind: str) -> str:
    """Concatenated content of the events of one type (think/respond chunks)."""
    return "".join(getattr(e, "content", "") for e in events if _type(e) == kind)
