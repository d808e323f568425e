"""A call runs once across a takeover (issue 28): real nodes, one Redis, ``kill -9``.

The tool is an HTTP endpoint that counts its executions per
``Idempotency-Key`` (``tests.support.counting_tool``). The driving node is
killed while a call runs, and after the calls returned but before the model
answered; each time the node that takes over finishes the turn, every
logical call reaches the tool with one key, and the session's replay shows
one ``call`` and one ``result`` per call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from protocol.events import Approval, ApprovalRequired, Call, End, Error, Event, Interrupt, Result
from tests.multinode.conftest import NodeFactory, SimFactory
from tests.support.client import GatewayClient, text_of
from tests.support.counting_tool import CountingTool, counting_tool


@pytest.fixture
def tool() -> Iterator[CountingTool]:
    with counting_tool() as server:
        yield server


@pytest.fixture
def tools_file(tool: CountingTool, tmp_path: Path) -> str:
    path = tmp_path / "tools.toml"
    path.write_text(tool.tools_file())
    return str(path)


@pytest.fixture
def approval_tools_file(tool: CountingTool, tmp_path: Path) -> str:
    path = tmp_path / "approval-tools.toml"
    path.write_text(tool.tools_file() + "require_approval = true\n")
    return str(path)


async def drain(client: GatewayClient) -> None:
    with contextlib.suppress(ConnectionClosed, asyncio.TimeoutError):
        while True:
            await client.next(timeout=10)


async def replay(url: str, sid: str, through: int = 0) -> list[Event]:
    """The session's log from its start, through the first turn's end (or seq ``through``)."""
    client = await GatewayClient.connect(url, session_id=sid, after=0)
    if through:
        events = await client.until(lambda e: e.seq >= through, timeout=30)
    else:
        events = await client.until(lambda e: isinstance(e, End), timeout=30)
    await client.close()
    return events


def one_result_per_call(events: list[Event]) -> dict[str, dict[str, object]]:
    """Each call's one result (asserting there is exactly one of each), by label."""
    calls = [e for e in events if isinstance(e, Call)]
    results = [e for e in events if isinstance(e, Result)]
    assert sorted(r.id for r in results) == sorted(c.id for c in calls), (calls, results)  # type: ignore[type-var]
    by_label: dict[str, dict[str, object]] = {}
    for result in results:
        [outcome] = orjson.loads(result.content)
        assert outcome["status"] == "success", outcome
        by_label[outcome["content"]["label"]] = outcome["content"]
    return by_label


async def test_kill_9_while_a_call_runs_reuses_the_finished_and_reruns_the_other(
    start_sim: SimFactory, start_node: NodeFactory, tool: CountingTool, tools_file: str
) -> None:
    sim = start_sim()
    a = start_node(sim, "node-a", "--tools", tools_file)
    b = start_node(sim, "node-b", "--tools", tools_file)
    first = await GatewayClient.connect(a.url)
    batch = (
        '<execute>[{"name": "count", "args": {"label": "quick"}}, '
        '{"name": "count", "args": {"label": "slow", "seconds": 6}}]</execute>'
    )
    await first.user("/raw " + batch)
    # The quick call's outcome is logged while the slow one still runs: then A dies.
    await first.until(lambda e: isinstance(e, Result), timeout=30)
    await asyncio.to_thread(tool.wait_requests, 2)
    a.kill()
    await drain(first)

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    await second.until(lambda e: isinstance(e, End), timeout=60)
    await second.close()

    # Each logical call reached the tool with one key; the quick one was not rerun.
    assert len(tool.keys_of("quick")) == 1 and len(tool.keys_of("slow")) == 1
    assert tool.keys_of("quick") != tool.keys_of("slow")
    assert [args["label"] for _, args in tool.requests].count("quick") == 1
    assert set(tool.executions.values()) == {1}  # the tool did each call's work once
    events = await replay(b.url, first.sid)
    assert any(isinstance(e, Interrupt) for e in events)
    by_label = one_result_per_call(events)
    assert set(by_label) == {"quick", "slow"}
    assert len([e for e in events if isinstance(e, Call)]) == 2  # not asked of the model again


async def test_kill_9_after_the_call_returned_before_the_model_answered(
    start_sim: SimFactory, start_node: NodeFactory, tool: CountingTool, tools_file: str
) -> None:
    # A slow model: the answer after the results takes seconds to stream.
    sim = start_sim("--tokens-per-second", "4")
    a = start_node(sim, "node-a", "--tools", tools_file)
    b = start_node(sim, "node-b", "--tools", tools_file)
    first = await GatewayClient.connect(a.url)
    await first.user('/tool count {"label": "once"}')
    await first.until(lambda e: isinstance(e, Result), timeout=30)
    a.kill()
    await drain(first)
    assert not any(isinstance(e, End) for e in first.events)

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    got = await second.until(lambda e: isinstance(e, End), timeout=60)
    await second.close()
    assert "The tool returned success." in text_of(got, "respond")

    assert len(tool.requests) == 1  # the call was not run again
    events = await replay(b.url, first.sid)
    assert set(one_result_per_call(events)) == {"once"}


async def test_a_pending_approval_survives_a_kill_9_and_runs_once_when_approved(
    start_sim: SimFactory,
    start_node: NodeFactory,
    tool: CountingTool,
    approval_tools_file: str,
) -> None:
    tools_file = approval_tools_file
    sim = start_sim()
    a = start_node(sim, "node-a", "--tools", tools_file)
    b = start_node(sim, "node-b", "--tools", tools_file)
    first = await GatewayClient.connect(a.url)
    await first.user('/tool count {"label": "approved"}')
    got = await first.until(lambda e: isinstance(e, ApprovalRequired), timeout=30)
    pending = got[-1]
    assert isinstance(pending, ApprovalRequired)
    a.kill()
    await drain(first)

    # A client that resumes from the start sees the pending approval in its replay.
    second = await GatewayClient.connect(b.url, session_id=first.sid, after=0)
    replayed = await second.until(lambda e: isinstance(e, ApprovalRequired), timeout=30)
    assert replayed[-1] == pending
    await second.until(lambda e: isinstance(e, Interrupt), timeout=30)  # B took over
    approve = {"type": "approve", "id": pending.id, "digest": pending.digest}
    await second.send({**approve, "decision": "allow"})
    await second.until(lambda e: isinstance(e, End), timeout=30)
    await second.send({**approve, "decision": "allow"})
    again = await second.until(lambda e: isinstance(e, Error), timeout=30)
    assert again[-1].code == "unknown_call"  # type: ignore[union-attr]
    await second.close()
    assert len(tool.requests) == 1
    events = await replay(b.url, first.sid)
    assert [e.decision for e in events if isinstance(e, Approval)] == ["allow"]
    assert set(one_result_per_call(events)) == {"approved"}


@pytest.fixture
def background_tools_file(tool: CountingTool, tmp_path: Path) -> str:
    path = tmp_path / "background-tools.toml"
    path.write_text(tool.tools_file() + "background = true\n")
    return str(path)


async def test_a_background_call_lets_the_answer_stream_and_its_result_comes_after(
    start_sim: SimFactory,
    start_node: NodeFactory,
    tool: CountingTool,
    background_tools_file: str,
) -> None:
    sim = start_sim()
    a = start_node(sim, "node-a", "--tools", background_tools_file)
    client = await GatewayClient.connect(a.url)
    await client.user('/tool count {"label": "later", "seconds": 5}')
    first = await client.until(lambda e: isinstance(e, End), timeout=30)
    [call] = [e for e in first if isinstance(e, Call)]
    assert call.background is True
    assert not any(isinstance(e, Result) for e in first)  # the answer did not wait for it
    # Then the call's one result, and the model's next step with it, in the same session.
    later = await client.until(lambda e: isinstance(e, End), timeout=30)
    [result] = [e for e in later if isinstance(e, Result)]
    assert result.id == call.id and result.seq > first[-1].seq
    assert orjson.loads(result.content)[0]["content"]["label"] == "later"
    assert "The tool returned success." in text_of(later, "respond")
    await client.close()
    assert len(tool.requests) == 1


async def test_a_background_call_running_at_a_kill_9_runs_on_with_its_key(
    start_sim: SimFactory,
    start_node: NodeFactory,
    tool: CountingTool,
    background_tools_file: str,
) -> None:
    sim = start_sim()
    a = start_node(sim, "node-a", "--tools", background_tools_file)
    b = start_node(sim, "node-b", "--tools", background_tools_file)
    first = await GatewayClient.connect(a.url)
    await first.user('/tool count {"label": "survives", "seconds": 4}')
    await first.until(lambda e: isinstance(e, End), timeout=30)
    await asyncio.to_thread(tool.wait_requests, 1)
    a.kill()
    await drain(first)
    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    got = await second.until(lambda e: isinstance(e, End), timeout=60)
    await second.close()
    assert "The tool returned success." in text_of(got, "respond")
    assert len(tool.keys_of("survives")) == 1  # one logical call, one key
    assert set(tool.executions.values()) == {1}
    events = await replay(b.url, first.sid, got[-1].seq)
    assert set(one_result_per_call(events)) == {"survives"}
