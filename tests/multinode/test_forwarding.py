"""Commands sent through a node that only follows the session (issue 13.3).

A client on node B follows a session that node A drives; its `user` and
`cancel` go to A over pub/sub. These tests kill or freeze A at the worst
moment and check what the user would notice: the message they sent gets its
turn exactly once, whether A was dead, frozen, or alive after all.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

import pytest
import redis
from websockets.exceptions import ConnectionClosed

from protocol.events import Cancelled, End, Error, Event, Interrupt, Metric, Respond, User
from tests.multinode.conftest import LEASE_TTL, NodeFactory, SimFactory
from tests.support.client import GatewayClient, text_of
from tests.support.procs import NodeProcess
from tests.support.redis_server import RedisServer

# A dead driver's lease expires within LEASE_TTL; the follower then takes over
# and runs the message. The margin covers a loaded 2-core machine.
TAKEOVER_WITHIN = LEASE_TTL + 8.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def users(events: list[Event]) -> list[str]:
    return [e.content for e in events if isinstance(e, User)]


def logged_users(redis_url: str, sid: str) -> list[str]:
    """The `user` events in the session's log (what really ran)."""
    from protocol.events import decode_event

    r = redis.Redis.from_url(redis_url)
    try:
        entries = r.xrange(f"rtgw:{{{sid}}}:log")
    finally:
        r.close()
    return users([decode_event(fields[b"d"]) for _, fields in entries])


async def idle_session_driven_by(
    node: NodeProcess, follower: NodeProcess
) -> tuple[GatewayClient, GatewayClient]:
    """A session driven by ``node`` (its client stays attached, so it stays
    there) after one turn ("first"), and a second client attached through
    ``follower``, which follows it."""
    on_driver = await GatewayClient.connect(node.url)
    await on_driver.turn("first")  # a session is stored at its first turn
    on_follower = await GatewayClient.connect(
        follower.url, session_id=on_driver.sid, after=on_driver.last_seq
    )
    return on_driver, on_follower


async def turn_of(client: GatewayClient, text: str, timeout: float) -> list[Event]:
    """The events of the turn started by ``text``: from its `user` event through its metric."""
    got = await client.until(lambda e: isinstance(e, User) and e.content == text, timeout)
    got += await client.until(lambda e: isinstance(e, End), timeout)
    got += await client.until(lambda e: isinstance(e, Metric), timeout)
    return got


async def test_a_message_sent_right_after_the_idle_driver_is_killed_gets_its_turn(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    sim = start_sim("--tokens-per-second", "200")
    b = start_node(sim, "node-b")
    for round_no in range(5):
        a = start_node(sim, f"node-a{round_no}")
        on_a, on_b = await idle_session_driven_by(a, b)
        a.kill()  # SIGKILL, while the session is idle and A still holds its lease
        text = f"round {round_no}: are you there?"
        await on_b.user(text)
        events = await turn_of(on_b, text, TAKEOVER_WITHIN)
        assert text_of(events, "respond") == f"Echo: {text}"
        assert not any(isinstance(e, Error) for e in on_b.events), on_b.events
        assert logged_users(durable_redis.url, on_b.sid) == ["first", text]
        # The session goes on from node B.
        again = await on_b.turn("and then?")
        assert text_of(again, "respond") == "Echo: and then?"
        await on_b.close()
        with contextlib.suppress(ConnectionClosed):
            await on_a.close()


async def test_a_message_forwarded_to_a_live_driver_runs_once(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    sim = start_sim("--tokens-per-second", "200")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    on_a, on_b = await idle_session_driven_by(a, b)
    await on_b.user("hello from b")
    seen_on_b = await turn_of(on_b, "hello from b", 20)
    seen_on_a = await turn_of(on_a, "hello from b", 20)
    assert users(seen_on_a) == users(seen_on_b) == ["hello from b"]
    assert logged_users(durable_redis.url, on_a.sid) == ["first", "hello from b"]
    await on_a.close()
    await on_b.close()


async def test_a_forwarded_command_is_answered_by_its_id_across_nodes(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    """The driving node's refusal and the logged event reach the other node's client
    with the command's ``id`` as ``reply_to``."""
    sim = start_sim("--tokens-per-second", "200")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    on_a, on_b = await idle_session_driven_by(a, b)
    await on_b.send({"type": "cancel", "id": "c-1"})  # no turn runs on A
    refused = (await on_b.until(lambda e: isinstance(e, Error), 20))[-1]
    assert isinstance(refused, Error) and (refused.code, refused.reply_to) == ("no_turn", "c-1")
    await on_b.send({"type": "user", "content": "named", "id": "m-1"})
    seen_on_b = await turn_of(on_b, "named", 20)
    seen_on_a = await turn_of(on_a, "named", 20)
    for seen in (seen_on_a, seen_on_b):  # every client of the session sees whose it is
        assert [e.reply_to for e in seen if isinstance(e, User)] == ["m-1"]
    await on_a.close()
    await on_b.close()


async def test_a_frozen_driver_that_wakes_up_runs_the_message_once(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    # A long lease: A is frozen (SIGSTOP) past the wait for its answer, so B
    # sends the command again, but A keeps the session; on waking A reads both
    # copies and runs one.
    sim = start_sim("--tokens-per-second", "200")
    a = start_node(sim, "node-a", "--lease-ttl", "8")
    b = start_node(sim, "node-b", "--lease-ttl", "8")
    on_a, on_b = await idle_session_driven_by(a, b)
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    try:
        await on_b.user("wake up")
        await asyncio.sleep(2.5)  # the frozen time itself is the test's input
    finally:
        a.proc.send_signal(signal.SIGCONT)
    events = await turn_of(on_b, "wake up", 20)
    assert text_of(events, "respond") == "Echo: wake up"
    again = await on_b.turn("next")  # a second turn proves no rerun or copy is pending
    assert users(again) == ["next"]
    assert logged_users(durable_redis.url, on_a.sid) == ["first", "wake up", "next"]
    assert not any(isinstance(e, Error) for e in on_b.events), on_b.events
    await on_a.close()
    await on_b.close()


async def test_a_driver_frozen_past_its_lease_loses_the_session_and_the_message_runs_once(
    start_sim: SimFactory, start_node: NodeFactory, durable_redis: RedisServer
) -> None:
    # A is frozen while holding the session: its lease expires and B takes
    # over and runs the message. When A wakes, it still has the command
    # (Redis queued it on A's open socket) but can no longer write the log.
    sim = start_sim("--tokens-per-second", "200")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    on_a, on_b = await idle_session_driven_by(a, b)
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    try:
        await on_b.user("still there?")
        events = await turn_of(on_b, "still there?", TAKEOVER_WITHIN)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert text_of(events, "respond") == "Echo: still there?"
    # A's client is told the session moved.
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        while True:
            await on_a.next(timeout=10)
    assert on_a.ws.close_code == 1012
    again = await on_b.turn("one more")
    assert users(again) == ["one more"]
    assert logged_users(durable_redis.url, on_b.sid) == ["first", "still there?", "one more"]
    await on_b.close()


async def test_a_cancel_sent_after_the_driver_died_stops_the_rerun(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    # The driver dies mid-turn; the user cancels through B before A's lease
    # expires. The turn is not lost and not rerun to the end against the
    # user's wish: B takes over, announces the rerun (interrupt) and cancels it.
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    on_a, on_b = await idle_session_driven_by(a, b)
    await on_a.user("a long story, please, told slowly")
    await on_b.until(lambda e: isinstance(e, Respond))
    a.kill()
    await on_b.send({"type": "cancel"})
    got = await on_b.until(lambda e: isinstance(e, Cancelled), TAKEOVER_WITHIN)
    assert any(isinstance(e, Interrupt) for e in got)
    assert not any(isinstance(e, Error) for e in on_b.events), on_b.events
    again = await on_b.turn("short one")
    assert text_of(again, "respond") == "Echo: short one"
    await on_b.close()
