"""Sessions that survive: node crash, drain, upstream loss, Redis restart.

Each test runs real processes (see conftest) and checks what a user would
notice: every event arrives exactly once with contiguous seqs, the broken turn
finishes (rerun after an `interrupt` when needed), and the next turn works.
"""

from __future__ import annotations

import asyncio
import contextlib

import redis
from websockets.exceptions import ConnectionClosed

from protocol.events import (
    Configured,
    End,
    Error,
    Event,
    Interrupt,
    Metric,
    Respond,
    decode_event,
)
from tests.multinode.conftest import NodeFactory, SimFactory
from tests.support.client import GatewayClient, text_of
from tests.support.redis_server import RedisServer
from tests.support.redis_topologies import wait_until

MESSAGE = "please echo this whole sentence back to me, slowly and carefully"

_REPLIES = {"bad_frame", "unknown_type", "turn_active", "no_turn", "store"}


def logged(events: list[Event]) -> list[Event]:
    """The events that are log entries (not replies or notices to one connection)."""
    return [e for e in events if not (isinstance(e, Error) and e.code in _REPLIES)]


def assert_contiguous(events: list[Event]) -> None:
    seqs = [e.seq for e in logged(events)]
    assert seqs == list(range(1, len(seqs) + 1)), seqs


async def drain_connection(client: GatewayClient) -> None:
    """Read what is left until the server side is gone."""
    with contextlib.suppress(ConnectionClosed, asyncio.TimeoutError):
        while True:
            await client.next(timeout=10)


def final_answer(events: list[Event]) -> str:
    """The respond text of the last attempt (after the last interrupt)."""
    last_interrupt = max((i for i, e in enumerate(events) if isinstance(e, Interrupt)), default=-1)
    return text_of(events[last_interrupt + 1 :], "respond")


async def test_kill_9_of_the_driving_node_mid_turn(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await GatewayClient.connect(a.url)
    await first.user(MESSAGE)
    await first.until(lambda e: isinstance(e, Respond))
    a.kill()
    await drain_connection(first)

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    assert second.session.resumed
    await second.until_type("end")
    await second.until_type("metric")
    events = first.events + second.events
    assert_contiguous(events)
    assert any(isinstance(e, Interrupt) for e in second.events)
    assert final_answer(events) == f"Echo: {MESSAGE}"

    again = await second.turn("and once more")
    assert text_of(again, "respond") == "Echo: and once more"
    assert_contiguous(first.events + second.events)
    await second.close()


async def test_kill_9_after_an_answers_end_but_before_its_usage_reruns_nothing(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    # The model writes on past <end> (the gateway ignores it), so the response's usage
    # comes seconds after the client saw the turn's end: the node dies in between.
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await GatewayClient.connect(a.url)
    await first.user("/raw Done.<end>" + " and the model writes on" * 10)
    await first.until_type("end")
    a.kill()
    await drain_connection(first)

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    again = await second.turn("and once more")
    # The finished turn is not run again: no interrupt, no second answer before this one.
    assert not any(isinstance(e, Interrupt) for e in second.events), second.events
    assert text_of(again, "respond") == "Echo: and once more"
    assert text_of(first.events, "respond") == "Done."
    # Its usage died with node A: node B gives it its metric, estimated, before anything
    # else (every turn ends with one), and the session's total goes on from it.
    events = logged(first.events + second.events)
    assert_contiguous(events)
    closing = next(i for i, e in enumerate(events) if isinstance(e, End))
    lost = events[closing + 1]
    assert isinstance(lost, Metric) and lost.estimated is True, events[closing:]
    assert lost.step.output > 0  # "Done." was billed, if not reported
    last = [e for e in again if isinstance(e, Metric)][-1]
    assert last.total.output == lost.total.output + last.step.output
    await second.close()


async def test_the_sessions_usage_total_goes_on_after_a_kill_9(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await GatewayClient.connect(a.url)
    [before] = [e for e in await first.turn("hello there") if isinstance(e, Metric)]
    assert before.total.input > 0
    a.kill()
    await drain_connection(first)

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    [after] = [e for e in await second.turn("and once more") if isinstance(e, Metric)]
    # The total a client was shown is where the next turn's starts, on any node.
    assert after.total.input == before.total.input + after.step.input, (before, after)
    assert after.total.output == before.total.output + after.step.output, (before, after)
    assert after.cost.total >= before.cost.total
    await second.close()


async def test_sigterm_drains_the_turn_then_the_client_moves(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a", "--drain-timeout", "20")
    b = start_node(sim, "node-b")
    first = await GatewayClient.connect(a.url)
    await first.user(MESSAGE)
    await first.until(lambda e: isinstance(e, Respond))
    a.terminate()
    # The running turn finishes on the draining node…
    await first.until_type("metric")
    assert text_of(first.events, "respond") == f"Echo: {MESSAGE}"
    # …then it closes the client with 1012 so it reconnects elsewhere.
    await drain_connection(first)
    assert first.ws.close_code == 1012
    assert a.wait(20) == 0

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    again = await second.turn("next question")
    assert text_of(again, "respond") == "Echo: next question"
    assert not any(isinstance(e, Interrupt) for e in first.events + second.events)
    assert_contiguous(first.events + second.events)
    await second.close()


async def test_upstream_drop_mid_turn_is_rerun_on_a_new_connection(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    # The first turn takes ~11 deltas; the second (~16 deltas) is cut at
    # delta 20 of the connection and rerun on a fresh upstream connection.
    sim = start_sim("--tokens-per-second", "50", "--drop-after", "20")
    a = start_node(sim, "node-a")
    client = await GatewayClient.connect(a.url)
    one = await client.turn("hi")
    assert text_of(one, "respond") == "Echo: hi"
    two = await client.turn(MESSAGE[:20])
    assert any(isinstance(e, Interrupt) for e in two)
    assert final_answer(two) == f"Echo: {MESSAGE[:20]}"
    assert not any(isinstance(e, Error) for e in two)
    assert_contiguous(client.events)
    await client.close()


async def test_redis_restart_mid_session_loses_nothing(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    client = await GatewayClient.connect(a.url)
    await client.user(MESSAGE)
    await client.until(lambda e: isinstance(e, Respond))
    await asyncio.to_thread(durable_redis.restart)
    await client.until(lambda e: isinstance(e, Metric))
    assert final_answer(client.events) == f"Echo: {MESSAGE}"
    again = await client.turn("after the restart")
    assert text_of(again, "respond") == "Echo: after the restart"
    assert_contiguous(client.events)
    # Every event the client received is in the log, byte for byte.
    r = redis.Redis.from_url(durable_redis.url)
    entries = r.xrange(f"rtgw:{{{client.sid}}}:log")
    r.close()
    assert [decode_event(fields[b"d"]) for _, fields in entries] == logged(client.events)
    assert isinstance(logged(client.events)[-1], Metric)
    assert any(isinstance(e, End) for e in client.events)
    await client.close()


async def test_a_configure_made_while_redis_is_down_is_stored_once_it_is_back(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    # The client is sent `configured` when the store is back; the meta, which a node
    # loading the session reads, must get it too, not keep the configuration before it.
    sim = start_sim()
    a = start_node(sim, "node-a", "--lease-ttl", "10")
    b = start_node(sim, "node-b", "--lease-ttl", "10")
    first = await GatewayClient.connect(a.url)
    await first.turn("hello")  # the session is stored
    await asyncio.to_thread(durable_redis.stop)
    await first.send({"type": "configure", "instructions": "Talk like a pirate."})
    await asyncio.to_thread(a.wait_for_lines, "configuration not stored", 1, 30)
    await asyncio.to_thread(durable_redis.start)
    got = await first.until(lambda e: isinstance(e, Configured), timeout=30)
    assert "pirate" in got[-1].config.instructions  # type: ignore[union-attr]

    def stored() -> bool:
        r = redis.Redis.from_url(durable_redis.url)
        try:
            return b"pirate" in (r.hget(f"rtgw:{{{first.sid}}}:meta", "config") or b"")
        finally:
            r.close()

    await asyncio.to_thread(wait_until, stored, "the configuration stored", 30)
    a.kill()
    await drain_connection(first)
    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    quoted = text_of(await second.turn("/instructions", 60), "respond")
    assert "pirate" in quoted, quoted
    await second.close()


async def test_a_client_that_moves_mid_turn_follows_it_then_drives_on_the_new_node(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = await GatewayClient.connect(a.url)
    await first.user(MESSAGE)
    await first.until(lambda e: isinstance(e, Respond))
    await first.close()  # the client's network moved; node A is fine

    second = await GatewayClient.connect(b.url, session_id=first.sid, after=first.last_seq)
    await second.until_type("metric")
    events = first.events + second.events
    # Node A finished the turn; B followed its log: no interrupt, no rerun.
    assert not any(isinstance(e, Interrupt) for e in events)
    assert text_of(events, "respond") == f"Echo: {MESSAGE}"
    again = await second.turn("now from node b")
    assert text_of(again, "respond") == "Echo: now from node b"
    assert_contiguous(first.events + second.events)
    await second.close()


async def test_commands_from_a_second_node_reach_the_driving_node(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    on_a = await GatewayClient.connect(a.url)
    # A session is stored at its first turn; from then on any node can join it.
    await on_a.turn("hello", timeout=60)
    on_b = await GatewayClient.connect(b.url, session_id=on_a.sid, after=0)
    await on_b.until(lambda e: e.seq == on_a.last_seq)  # the replay of that turn
    # A user message sent on B starts the turn on A; both clients see it.
    await on_b.user(MESSAGE)
    await on_a.until(lambda e: isinstance(e, Respond))
    await on_b.until(lambda e: isinstance(e, Respond))
    # A second message while the turn runs is refused, and the refusal reaches B.
    await on_b.user("too soon")
    refusal = await on_b.until(lambda e: isinstance(e, Error))
    assert refusal[-1].code == "turn_active"  # type: ignore[union-attr]
    # Cancel from B stops the turn on A.
    await on_b.send({"type": "cancel"})
    await on_a.until_type("cancelled")
    await on_b.until_type("cancelled")
    assert logged(on_a.events) == logged(on_b.events)
    assert_contiguous(on_a.events)
    await on_a.close()
    await on_b.close()
