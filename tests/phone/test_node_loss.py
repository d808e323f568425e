"""Calls and node loss, with real processes: two ``gateway serve`` nodes on one Redis.

A carrier cannot move a call's media stream to another node: a draining
node (SIGTERM) keeps its call until the caller hangs up; a node that dies
(kill -9) ends its call, and the session (history, transcript, usage) is
there for the app on any other node, and for a call back.
tests/bench/phone_node_loss_bench.py measures both.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.client.carrier import CallSetup, SimulatedCall
from protocol.events import PhoneCall, Respond, SpeechStopped, User, decode_event
from tests.support.carrier import AUTH_TOKEN, espeak
from tests.support.procs import NodeProcess
from tests.support.redis_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LEASE_TTL = 2.0


class PhoneNode:
    def __init__(self, proc: NodeProcess, api_port: int) -> None:
        self.proc = proc
        self.api = f"http://127.0.0.1:{api_port}"

    @property
    def stream_url(self) -> str:
        return f"{self.proc.base}/v1/phone/twilio"

    def call(self, **parameters: str) -> SimulatedCall:
        return SimulatedCall(
            CallSetup(
                url=self.stream_url,
                auth_token=AUTH_TOKEN,
                parameters=parameters,
                webhook_url=f"{self.api}/v1/phone/twilio/voice",
            )
        )

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.api + path, timeout=10) as response:
            return msgspec.json.decode(response.read())

    def post(self, path: str, body: Any) -> Any:
        request = urllib.request.Request(
            self.api + path,
            data=msgspec.json.encode(body),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return msgspec.json.decode(response.read())


@pytest.fixture
def nodes(redis_url: str, tmp_path: Path) -> Iterator[list[PhoneNode]]:
    procs: list[NodeProcess] = []
    made: list[PhoneNode] = []
    for name in ("node-a", "node-b"):
        api_port = free_port()
        proc = NodeProcess(
            [
                "serve",
                "--port",
                "0",
                "--api-port",
                str(api_port),
                "--redis",
                redis_url,
                "--node-id",
                name,
                "--lease-ttl",
                str(LEASE_TTL),
                "--workspace-root",
                str(tmp_path / "workspaces"),
                "--sim-tokens-per-second",
                "10",  # an answer streams for about half a second: a kill lands mid-turn
            ],
            env={"GATEWAY_PHONE_TWILIO_AUTH_TOKEN": AUTH_TOKEN},
        ).start()
        procs.append(proc)
        made.append(PhoneNode(proc, api_port))
    yield made
    for proc in procs:
        proc.kill()


def session_of(node: PhoneNode) -> str:
    node.proc.wait_for_lines(r"phone call \S+ \(twilio\) on session")
    line = next(line for line in node.proc.output if "(twilio) on session" in line)
    return line.split("on session ")[1].split()[0]


async def test_sigterm_keeps_the_call_until_the_caller_hangs_up(nodes: list[PhoneNode]) -> None:
    a, _ = nodes
    call = a.call()
    await call.dial()
    await asyncio.to_thread(session_of, a)
    a.proc.terminate()
    await asyncio.to_thread(a.proc.wait_for_lines, "draining: 1 phone calls go on")
    await call.say(espeak("Are you still there?"))
    await call.answered()
    assert a.proc.proc is not None and a.proc.proc.poll() is None  # still serving the call
    await call.hang_up()
    assert await asyncio.to_thread(a.proc.wait, 30) == 0
    assert call.closed == (1000, "call ended")


async def test_a_dead_node_ends_its_call_and_the_session_stays(nodes: list[PhoneNode]) -> None:
    a, b = nodes
    call = a.call()
    await call.dial()
    sid = await asyncio.to_thread(session_of, a)
    await call.say(espeak("Hello, I am calling about my order."))
    await call.answered()
    a.proc.kill()  # mid-answer: the node that takes the session over reruns the turn
    code, _ = await call.wait_closed()
    assert code == 1006  # the carrier saw the socket die: the call ends

    # The app reads the session on another node: the call and the caller's turn are there
    # (the answer's text was cut with the node: its audio is sent before its text is logged).
    page = await asyncio.to_thread(b.get, f"/v1/sessions/{sid}/events")
    events = [decode_event(msgspec.json.encode(e)) for e in page["events"]]
    assert any(isinstance(e, SpeechStopped) for e in events)
    assert [e.status for e in events if isinstance(e, PhoneCall)] == ["started"]

    # …and calls back into it through the other node, once the dead node's lease expired:
    # the rerun of the cut answer is sent first, the caller's speech then barges in.
    minted = await asyncio.to_thread(b.post, "/v1/phone/tokens", {"session_id": sid})
    back = b.call(token=minted["stream_token"])
    await back.dial()
    await back.say(espeak("Hello again."))
    await back.answered()
    await back.hang_up()
    statuses: list[str] = []
    async with asyncio.timeout(10):
        while len(statuses) < 3:  # the call's end is logged as it closes
            page = await asyncio.to_thread(b.get, f"/v1/sessions/{sid}/events")
            statuses = [e["status"] for e in page["events"] if e["type"] == "phone_call"]
    assert statuses == ["started", "started", "ended"]
    events = [decode_event(msgspec.json.encode(e)) for e in page["events"]]
    spoken = [e for e in events if isinstance(e, User) and e.source == "audio"]
    assert len(spoken) >= 2  # the first call's turn and the call back's
    assert any(isinstance(e, Respond) for e in events)
