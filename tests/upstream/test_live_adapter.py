"""``GPTLive``, the adapter's socket shell, against a GPT-Live server of the test's own
(a websockets server in its own thread, so the test's loop runs the adapter alone): what
the service receives, and what sending it costs the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from websockets.sync.server import Server, ServerConnection, serve

from gateway.upstream import live_wire as wire
from gateway.upstream.live import GPTLive
from gateway.upstream.live_conversation import APPEND_CHARS, TYPED_PREFIX
from protocol.assembly import Message
from tests.support.stall import LoopSteps

pytestmark = pytest.mark.timeout(30)

HEAD = "The start of the caller's typed message: "


class Service:
    """Answers ``session.start`` and keeps every other command received, in order."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.asked = threading.Event()  # a session.commentary.append came

    def handler(self, ws: ServerConnection) -> None:
        for frame in ws:
            event = msgspec.json.decode(frame)
            if event["type"] == "session.start":
                session = wire.SessionResource(id="sess_1", expires_at=0, model="gpt-live-1.1")
                started = wire.SessionStarted(event_id="e_1", session=session)
                ws.send(wire.encode(started).decode())
                continue
            if not self.asked.is_set():  # what came for the turn (not the close after it)
                self.received.append(event)
            if event["type"] == "session.commentary.append":
                self.asked.set()


@pytest.fixture
def service() -> Iterator[tuple[Service, str]]:
    service = Service()
    server: Server = serve(service.handler, "127.0.0.1", 0, max_size=None, compression=None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield service, f"ws://127.0.0.1:{server.socket.getsockname()[1]}/v1"
    finally:
        server.shutdown()
        thread.join(5)


async def test_a_900_kb_typed_message_reaches_gpt_live_whole_in_order_without_holding_the_loop(
    service: tuple[Service, str],
) -> None:
    got, url = service
    live = GPTLive(base_url=url, model="gpt-live-1.1")
    await live.open("", [])
    try:
        text = "".join(f"{n} words " for n in range(100_000))  # ~990 KB: 660 appends
        await live.add_message(Message(role="user", content=text))
        async with LoopSteps() as steps:
            await live.start_response()
            await asyncio.sleep(0.05)  # a tick after the request went
        assert await asyncio.to_thread(got.asked.wait, 10)
    finally:
        await live.close()
    *thinking, ask = got.received
    assert {e["type"] for e in thinking} == {"session.thinking.append"}
    assert all(len(e["content"]) <= APPEND_CHARS for e in got.received)
    head = "".join(e["content"] for e in thinking)
    assert head.startswith(HEAD) and ask["content"].startswith(TYPED_PREFIX)
    assert head.removeprefix(HEAD) + ask["content"].removeprefix(TYPED_PREFIX) == text
    # No step holds the loop near the 100 ms a health check may wait (measured: a
    # write per append 7-19 ms of CPU, one write 6-9 ms). The one write itself is
    # pinned by tests/wsfast/test_write.py; this bound leaves a loaded machine room.
    print(f"\nlongest loop step (CPU) sending 990 KB: {steps.longest_cpu * 1000:.1f} ms")
    assert steps.longest_cpu < 0.05, steps.longest_cpu
