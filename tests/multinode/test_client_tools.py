"""Client-side tools across nodes (issue 14): real node processes sharing one Redis.

The call is driven on node A; the answer comes through a client on node B
(forwarded like ``user``/``cancel``). A takeover while the gateway waits
finishes the batch from the journal: the call keeps its id, and the client's
answer to it (sent again after the ``interrupt``) is the call's one result.
"""

from __future__ import annotations

import asyncio
import contextlib

import orjson
from websockets.exceptions import ConnectionClosed

from protocol.events import Call, Configured, End, Error, Execute, Interrupt, Result
from tests.multinode.conftest import NodeFactory, SimFactory
from tests.support.client import GatewayClient

CONFIRM = {
    "name": "confirm",
    "description": "Ask the user a yes/no question.",
    "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
}


async def client_call(client: GatewayClient) -> Call:
    got = await client.until(lambda e: isinstance(e, Call) and e.runs_on == "client")
    call = got[-1]
    assert isinstance(call, Call)
    return call


async def test_a_call_driven_on_a_is_answered_through_b(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim()
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await GatewayClient.connect(a.url)
    await first.send({"type": "configure", "tools": [CONFIRM]})
    await first.until(lambda e: isinstance(e, Configured))
    await first.user('/tool confirm {"question": "from b?"}')
    call = await client_call(first)
    second = await GatewayClient.connect(b.url, session_id=first.sid, after=0)
    assert (await client_call(second)).id == call.id  # B follows the log A writes
    await second.send({"type": "tool_result", "id": call.id, "status": "success", "content": "B"})
    for client in (first, second):
        got = await client.until(lambda e: isinstance(e, Result))
        result = got[-1]
        assert isinstance(result, Result)
        assert orjson.loads(result.content) == [
            {"tool": "confirm", "status": "success", "content": "B"}
        ]
    # A second answer through B is refused by A, and the reply comes back to B.
    await second.send({"type": "tool_result", "id": call.id, "status": "success", "content": 1})
    got = await second.until(lambda e: isinstance(e, Error) and e.code == "unknown_call")
    assert "already answered" in got[-1].content  # type: ignore[union-attr]
    await asyncio.gather(first.close(), second.close())


async def test_a_takeover_while_waiting_keeps_the_call_and_its_id(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim()
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await GatewayClient.connect(a.url)
    await first.send({"type": "configure", "tools": [CONFIRM]})
    await first.until(lambda e: isinstance(e, Configured))
    await first.user('/tool confirm {"question": "survive?"}')
    old = await client_call(first)
    await first.until(lambda e: isinstance(e, Execute))
    a.kill()
    with contextlib.suppress(ConnectionClosed, asyncio.TimeoutError):
        while True:
            await first.next(timeout=10)
    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    # B takes the session over once A's lease expires, and waits for the same call.
    await second.until(lambda e: isinstance(e, Interrupt), timeout=30)
    await second.send({"type": "tool_result", "id": old.id, "status": "success", "content": 1})
    got = await second.until(lambda e: isinstance(e, Result))
    assert got[-1].id == old.id  # type: ignore[union-attr]
    assert orjson.loads(got[-1].content)[0]["content"] == 1  # type: ignore[union-attr]
    await second.until(lambda e: isinstance(e, End))
    assert not any(isinstance(e, Call) for e in second.events)  # the model was not asked again
    await second.close()
