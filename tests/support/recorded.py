"""A recorded session, made the way a user makes one: a tool call, then a cancelled turn.

``record_session`` drives a gateway with the product's client (``gateway.client``)
over a real WebSocket: configure (``record: true``), a turn that calls the
``list`` server tool, then a long answer cancelled after its first words.
``recording_of`` reads the recording from the HTTP API once the session's
runtime has let it go (its last lines are then written).
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

from gateway.client import Client
from gateway.client.recording import fetch_recording
from gateway.client.replay_plan import PlanError, plan_replay
from gateway.edge.server import Gateway
from protocol.events import Metric, Respond, User
from protocol.recording import Record, read_records
from tests.support.procs import NodeProcess

__all__ = [
    "TOOL_TURN",
    "exported",
    "gateway_cli",
    "record_session",
    "recording_of",
    "records",
    "serve",
]

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


_API = re.compile(r"HTTP API:\s+(\S+)/v1/sessions")


def serve(tmp_path: Path, *args: str) -> NodeProcess:
    """``gateway serve`` on free ports with its HTTP API (the README's command, plus ports)."""
    return NodeProcess(
        [
            "serve",
            "--port",
            "0",
            "--api-port",
            "0",
            "--sim-tokens-per-second",
            "400",
            "--workspace-root",
            str(tmp_path / "workspaces"),
            *args,
        ]
    )


def api_of(node: NodeProcess) -> str:
    found = _API.search(node.log)
    assert found, node.log
    return found.group(1)


async def gateway_cli(*args: str) -> tuple[int, str, str]:
    """``gateway ARGS…`` as a user runs it: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def complete_recording(api: str, sid: str, turns: int) -> None:
    """Until the node has written the session's last turn (its closing metric)."""
    async with asyncio.timeout(20):
        while True:
            try:
                plan = plan_replay(await fetch_recording(api, sid))
            except PlanError:  # nothing to replay yet: its events are not written yet
                await asyncio.sleep(0.05)
                continue
            users = sum(1 for _, e in plan.events if isinstance(e, User))
            if users == turns and isinstance(plan.events[-1][1], Metric):
                return
            await asyncio.sleep(0.05)


async def exported(node: NodeProcess, tmp_path: Path) -> Path:
    """A recorded session (a tool call, a cancel, /instructions), exported to a file."""
    sid = await record_session(node.url, None)
    await complete_recording(api_of(node), sid, turns=3)
    path = tmp_path / "session.jsonl"
    code, out, err = await gateway_cli(
        "recording", "get", "-o", str(path), "--api", api_of(node), "--", sid
    )
    assert code == 0, out + err
    return path
