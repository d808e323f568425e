"""``TurnDriver``: the turn machine's actions performed against an upstream.

The upstream is the in-process simulator through the real OpenAI adapter, or,
for what no provider can be made to do on cue, a ``ScriptedUpstream`` (see
``tests/sessions/fakes.py``); the log is written by the real ``LogWriter`` to
the memory store, and a ``Subscriber`` records what a client would be sent.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.config import load_config
from gateway.metrics import Metrics
from gateway.pricing import PriceTable
from gateway.sessions.driver import TurnDriver
from gateway.sessions.limits import Limits
from gateway.sessions.logwriter import LogWriter
from gateway.sessions.observer import TurnObserver
from gateway.sessions.session_log import SessionLog
from gateway.sessions.setup import SessionServices, SessionSetup
from gateway.sessions.upstream_link import UpstreamLink
from gateway.sessions.voice import VoiceInput
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from gateway.store.memory import MemoryStore
from gateway.tracing import Tracing
from gateway.upstream.base import UpstreamClosed, UpstreamFactory, VoiceConfig
from protocol.assembly import Message
from protocol.configuration import SessionConfig
from protocol.events import (
    Cancelled,
    End,
    Error,
    Event,
    Interrupt,
    Metric,
    Respond,
    Result,
    Think,
    Usage,
    User,
)
from protocol.turn import TurnMachine
from protocol.turn_events import Cancel, TextDelta, UserMessage
from tests.sessions.fakes import ScriptedFactory, ScriptedUpstream, Spawned, Subscriber, reply
from tests.sessions.sims import SimFactory
from tests.support.client import text_of
from tools.base import Tool, ToolContext
from tools.executor import Executor
from tools.registry import Registry

pytestmark = pytest.mark.timeout(20)

CALL_WAIT = '<execute>\n[{"name": "wait", "args": {}}]\n</execute>'
ECHO_HI = "<think>The user said something.</think>Echo: hi<end>"


class Session:
    """The runtime as the driver reads it (``DrivenSession``): a text session."""

    def __init__(self, setup: SessionSetup) -> None:
        self.setup = setup
        self.voice: VoiceConfig | None = None
        self.listening = False
        self.closed = False
        self.stopped = asyncio.Event()

    def speaking_voice(self) -> VoiceConfig | None:
        return None

    def driver_stopped(self) -> None:
        self.stopped.set()


class WaitArgs(msgspec.Struct, frozen=True):
    pass


class WaitTool(Tool[WaitArgs]):
    """A tool that runs until it is cancelled, and says when it started and ended."""

    name = "wait"
    description = "waits"
    args_type = WaitArgs

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self, args: WaitArgs, ctx: ToolContext) -> Any:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


NODE = "node-1"


async def harness(factory: UpstreamFactory, workspace: Path, *tools: Tool[Any]) -> Harness:
    """A driven session on a memory store whose lease this node holds."""
    store = MemoryStore()
    assert await store.acquire_lease("sid", NODE, 60.0)
    return Harness(factory, workspace, store, *tools)


class Harness:
    """One driven session: the driver and everything it talks to."""

    def __init__(
        self, factory: UpstreamFactory, workspace: Path, store: MemoryStore, *tools: Tool[Any]
    ) -> None:
        self.factory = factory
        self.store = store
        config = load_config({"upstream_retries": 2}, env={})
        self.metrics = Metrics()
        self.client = Subscriber()
        self.spawned = Spawned()
        self.log = SessionLog(
            "sid",
            last_seq=0,
            history=[],
            writer=LogWriter(store, NODE),
            metrics=self.metrics,
            retry_delay=0.01,
            clock=time.time,
            on_lost=lambda reason: None,
        )
        self.log.subscribers.add(self.client)
        setup = SessionSetup(SessionConfig(), "THE PROMPT", factory)
        self.session = Session(setup)
        observer = TurnObserver(
            Tracing.off(), PriceTable(), self.metrics, sid="sid", provider="p", model="m"
        )
        services = SessionServices(
            config=config,
            metrics=self.metrics,
            log_writer=self.log._writer,
            limits=Limits(config, store, self.metrics),
            executor=Executor(Registry(tools), timeout=10.0),
            upstream_factory=factory,
            system_prompt="THE PROMPT",
            tool_context=lambda sid: ToolContext(workspace=workspace, session_id=sid),
            store=store,
            prices=PriceTable(),
            tracing=Tracing.off(),
            session_setup=lambda *args: setup,
        )
        link = UpstreamLink(
            "sid",
            self.log.history,
            observer=observer,
            context_tokens=0,
            spawn=self.spawned,
            remember=self._remember,
            clock=time.time,
        )
        self.machine = TurnMachine(
            total=Usage(input=0, output=0),
            max_steps=config.max_steps,
            upstream_retries=config.upstream_retries,
            client_tools=setup.client_tools,
            call_number=0,
        )
        self.driver = TurnDriver(
            self.session,
            self.machine,
            self.log,
            link,
            VoiceInput("sid", None),
            services,
            observer,
            spawn=self.spawned,
            remember=self._remember,
        )

    async def _remember(self, fields: dict[str, str]) -> None:
        pass

    def user(self, text: str) -> None:
        self.session.stopped.clear()
        assert (
            self.driver.command(self.machine.feed(UserMessage(content=text)), interrupt=False)
            is None
        )

    async def turn(self, text: str) -> list[Event]:
        """Run one turn to its end; the events it logged."""
        before = len(self.client.entries)
        self.user(text)
        await self.ended()
        return self.client.events[before:]

    async def ended(self) -> None:
        await asyncio.wait_for(self.session.stopped.wait(), 10)
        await self.log.flushed()
        await self.spawned.done()
        assert self.machine.idle and self.driver.task is None
        # What the client was sent is what the store holds, in order.
        stored = await self.store.read_log("sid", 0, 10_000)
        assert [e.data for e in stored] == [e.data for e in self.client.entries]

    def errors_counted(self) -> float:
        return self.metrics.registry.get_sample_value("rtgw_upstream_errors_total") or 0.0


def kinds(events: list[Event]) -> list[type]:
    """The event types in order, runs of one type as one."""
    out: list[type] = []
    for event in events:
        if not out or out[-1] is not type(event):
            out.append(type(event))
    return out


async def test_a_text_turn_opens_the_upstream_asks_and_logs_the_answer(tmp_path: Path) -> None:
    async with serve_sim(SimConfig()) as sim:
        run = await harness(SimFactory(sim), tmp_path)
        events = await run.turn("hi")
        assert kinds(events) == [User, Think, Respond, End, Metric]
        assert text_of(events, "respond") == "Echo: hi"
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        # A fresh connection: the prompt, and the history that already holds the message.
        [conversation] = sim.conversations()
        assert conversation.instructions == "THE PROMPT"
        assert conversation.messages() == [("user", "hi"), ("assistant", ECHO_HI)]
        metric = events[-1]
        assert isinstance(metric, Metric) and metric.total.output > 0

        # The next turn goes on the open connection.
        events = await run.turn("and again")
        assert text_of(events, "respond") == "Echo: and again"
        [conversation] = sim.conversations()
        assert conversation.messages()[2] == ("user", "and again")
        assert sim.stats.connections_total == 1 and sim.stats.responses_total == 2


async def test_a_cancel_supersedes_the_awaits_the_driver_had_not_performed(
    tmp_path: Path,
) -> None:
    """After ``</execute>`` the driver replaces the response's text, then runs the
    tools: a cancel during the first await interrupts it, and the tools never run."""

    class SlowReplace(ScriptedUpstream):
        def __init__(self) -> None:
            super().__init__([[TextDelta(CALL_WAIT)]])
            self.replacing = asyncio.Event()

        async def replace_response(self, text: str, *, heard_ms: int | None = None) -> None:
            self.calls.append("replace_response")
            self.replacing.set()
            await asyncio.Event().wait()  # the provider does not answer

    upstream = SlowReplace()
    factory = ScriptedFactory()
    factory.create = lambda: upstream  # type: ignore[assignment,method-assign,return-value]
    tool = WaitTool()
    run = await harness(factory, tmp_path, tool)
    run.user("/tool wait")
    await asyncio.wait_for(upstream.replacing.wait(), 10)
    assert run.driver.command(run.machine.feed(Cancel()), interrupt=True) is None
    await run.ended()
    assert kinds(run.client.events)[-2:] == [Cancelled, Metric]
    assert not tool.started.is_set()  # RunTools was superseded
    # The interrupted call left the connection in a state nobody knows: let go, stopped.
    assert upstream.closed and upstream.calls[-2:] == ["cancel_response", "close"]


async def test_a_cancel_while_tools_run_cancels_them_and_asks_nothing_more(
    tmp_path: Path,
) -> None:
    """Cancelled while its tool runs: the tool is cancelled, its result never logged,
    and the step that would have followed it is never requested."""
    async with serve_sim(SimConfig()) as sim:
        tool = WaitTool()
        run = await harness(SimFactory(sim), tmp_path, tool)
        run.user("/tool wait {}")
        await asyncio.wait_for(tool.started.wait(), 10)
        assert run.driver.command(run.machine.feed(Cancel()), interrupt=True) is None
        await run.ended()
        events = run.client.events
        assert kinds(events)[-2:] == [Cancelled, Metric]
        assert not any(isinstance(e, Result) for e in events)
        assert tool.cancelled
        # </execute> stopped the response and its text replaced the overrun; no more.
        [conversation] = sim.conversations()
        assert conversation.messages() == [
            ("user", "/tool wait {}"),
            ("assistant", "<think>I should call wait.</think>\n" + CALL_WAIT),
        ]
        assert sim.stats.responses_total == 1
    # A cancel with no turn running is refused, not queued.
    refused = run.machine.feed(Cancel())
    assert run.driver.command(refused, interrupt=True) == Error(
        code="no_turn", content="no turn is running; nothing to cancel"
    )


async def test_a_lost_upstream_is_fed_as_upstream_lost_and_the_step_rerun(
    tmp_path: Path,
) -> None:
    secret = "wss://provider.example/v1?key=sk-SECRET closed 1006"
    factory = ScriptedFactory(
        [[TextDelta("<think>Half a thought"), UpstreamClosed(secret)]],
        [reply("Whole answer<end>")],
    )
    run = await harness(factory, tmp_path)
    events = await run.turn("hi")
    assert kinds(events) == [User, Think, Interrupt, Respond, End, Metric]
    interrupt = next(e for e in events if isinstance(e, Interrupt))
    assert "connection failed" in interrupt.content and "SECRET" not in interrupt.content
    assert interrupt.context == "rebuilt"  # no resumption handle: from history
    assert text_of(events, "respond") == "Whole answer"
    first, second = factory.made
    assert first.closed  # let go in the background
    # The partial step is not history: the new connection is given the message only.
    assert second.opened_with is not None and second.opened_with[1] == [Message("user", "hi")]
    assert factory.failures == [("scripted", False)]
    assert run.errors_counted() == 1


async def test_a_refusal_without_a_fallback_fails_the_turn_at_once(tmp_path: Path) -> None:
    async with serve_sim(SimConfig(api_key="the-right-key")) as sim:
        factory = SimFactory(sim, key="a-wrong-key")
        run = await harness(factory, tmp_path)
        events = await run.turn("hi")
    assert kinds(events) == [User, Error, End, Metric]
    error = next(e for e in events if isinstance(e, Error))
    assert error.code == "upstream" and "refused the request" in error.content
    assert "a-wrong-key" not in error.content and "401" not in error.content  # log only
    assert factory.failures == [("openai", True)] and sim.stats.connections_total == 0


@pytest.mark.logs_traceback
async def test_a_failure_inside_the_driver_ends_the_turn_with_an_internal_error(
    tmp_path: Path, logged_tracebacks: Any
) -> None:
    class Broken(ScriptedUpstream):
        async def start_response(self) -> None:
            raise RuntimeError("a bug in an adapter")

    factory = ScriptedFactory()
    factory.create = lambda: Broken()  # type: ignore[assignment,method-assign,return-value]
    run = await harness(factory, tmp_path)
    events = await run.turn("hi")
    assert kinds(events) == [User, Error, End, Metric]
    error = next(e for e in events if isinstance(e, Error))
    assert error.code == "internal" and "RuntimeError" in error.content
    [record] = logged_tracebacks.records
    assert record.getMessage() == "session sid: turn failed"
