"""A recorded session, made the way a user makes one: a tool call, then a cancelled turn.

``record_session`` drives a gateway with the product's client (``gateway.client``)
over a real WebSocket: configure (``record: true``), a turn that calls the
``list`` server tool, then a long answer cancelled after its first words.
``recording_of`` reads the recording from the HTTP API once the session's
runtime has let it go (its last lines are then written).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.client import Client
from gateway.client.recording import fetch_recording
from gateway.edge.server import Gateway
from protocol.events import Respond
from protocol.recording import Record, read_records

__all__ = ["TOOL_TURN", "record_session", "recording_of", "records"]

TOOL_TURN = '/tool list {"path": "."}'
LONG_TURN = "/long 40"


async def record_session(url: str, key: str | None, *, instructions: str = "") -> str:
    """A recorded session on the gateway at ``url`` (a tool call, a cancel); its id."""
    async with Client(url, token=key) as client:
        fields: dict[str, Any] = {"record": True}
        if instructions:
            fields["instructions"] = instructions
        await client.configure(**fields)
        async for _ in client.send(TOOL_TURN):
            pass
        cancelled = False
        async for event in client.send(LONG_TURN):
            if isinstance(event, Respond) and not cancelled:
                cancelled = True
                await client.cancel()
        async for _ in client.send("/instructions"):
            pass
        return client.session_id


async def recording_of(gateway: Gateway, sid: str, key: str) -> bytes:
    """The session's whole recording, read from ``gateway``'s HTTP API once its node
    let the session go (its client left): the runtime writes its last lines first."""
    async with asyncio.timeout(15):
        while sid in gateway.node.runtimes:  # noqa: ASYNC110 - no event to await
            await asyncio.sleep(0.02)
    return await fetch_recording(gateway.api_url, sid, token=key)


def records(data: bytes) -> list[Record]:
    found = list(read_records(data))
    bad = [r for r in found if isinstance(r, str)]
    assert not bad, bad
    return [r for r in found if not isinstance(r, str)]
