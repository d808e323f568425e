"""``UpstreamLink``: how a session's connection is opened, resumed, told and let go."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from gateway.metrics import Metrics
from gateway.pricing import PriceTable
from gateway.sessions.observer import TurnObserver
from gateway.sessions.resumption import META_KEY, ResumePoint, decode_resume_point
from gateway.sessions.upstream_link import OpenRequest, SilenceWatch, UpstreamLink
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from gateway.tracing import Tracing
from gateway.upstream.base import (
    AudioOut,
    ResponseDone,
    Resumable,
    Resume,
    Upstream,
    UpstreamFactory,
    VoiceConfig,
)
from protocol.assembly import HistoryItem, assemble
from protocol.events import Respond, User
from protocol.prompt import native_prompt
from tests.sessions.fakes import ScriptedFactory, ScriptedUpstream, Spawned
from tests.sessions.sims import SimFactory

pytestmark = pytest.mark.timeout(10)

NOW = 5000.0
SPEAKING = VoiceConfig(audio_out=AudioOut(voice="", to_client=False))


class Remembered:
    def __init__(self) -> None:
        self.fields: list[dict[str, str]] = []

    async def __call__(self, fields: dict[str, str]) -> None:
        self.fields.append(fields)


def link(
    history: list[HistoryItem],
    *,
    context_tokens: int = 0,
    resume: ResumePoint | None = None,
) -> tuple[UpstreamLink, TurnObserver, Spawned, Remembered]:
    observer = TurnObserver(
        Tracing.off(), PriceTable(), Metrics(), sid="sid", provider="node", model="node-model"
    )
    spawned, remembered = Spawned(), Remembered()
    made = UpstreamLink(
        "sid",
        history,
        observer=observer,
        context_tokens=context_tokens,
        spawn=spawned,
        remember=remembered,
        clock=lambda: NOW,
        resume=resume,
    )
    return made, observer, spawned, remembered


def request(factory: UpstreamFactory, voice: VoiceConfig | None = None) -> OpenRequest:
    return OpenRequest(factory, "THE TEXT PROTOCOL", "be brief", voice, lambda: SPEAKING)


async def answered(upstream: Upstream) -> None:
    """Ask for a response and read it to its end: the simulator has taken all sent before."""
    await upstream.start_response()
    async with asyncio.timeout(10):
        while not isinstance(await upstream.recv(), ResponseDone):
            pass


async def test_a_text_model_is_told_the_protocol_and_given_the_history() -> None:
    history: list[HistoryItem] = [User(content="hi"), Respond(content="hello"), User(content="?")]
    async with serve_sim(SimConfig()) as sim:
        factory = SimFactory(sim)
        made, observer, _, _ = link(history)
        upstream, voiced = await made.open(request(factory))
        assert upstream is made.upstream
        assert not voiced and made.opened_as == made.opening_as(request(factory))
        await answered(upstream)
        [conversation] = sim.conversations()
        await made.close()
    assert conversation.instructions == "THE TEXT PROTOCOL"
    # The history as the text protocol assembles it (the model's turns end with <end>).
    assert conversation.messages()[:-1] == [(m.role, m.content) for m in assemble(history)]
    # Priced and traced as the provider that answers.
    assert (observer.provider, observer.model, made.provider) == ("openai", "sim", "openai")


async def test_a_model_that_only_speaks_gets_the_spoken_voice_and_no_text_protocol() -> None:
    async with serve_sim(SimConfig(flavor="gemini")) as sim:
        factory = SimFactory(sim, provider="gemini", model="gemini-3.8-live")
        made, *_ = link([User(content="hi")])
        upstream, voiced = await made.open(request(factory))
        await answered(upstream)
        [conversation] = sim.conversations()
        await made.close()
    assert voiced
    assert conversation.instructions == native_prompt("be brief")
    assert conversation.messages()[0] == ("user", "hi")


async def test_the_history_given_is_cut_to_the_context_budget() -> None:
    long = "word " * 400  # about 570 tokens each
    history: list[HistoryItem] = []
    for n in range(6):
        history += [User(content=f"question {n} {long}"), Respond(content=f"answer {n}")]
    history.append(User(content="the last question"))
    async with serve_sim(SimConfig()) as sim:
        made, *_ = link(history, context_tokens=1500)
        upstream, _ = await made.open(request(SimFactory(sim)))
        await answered(upstream)
        [conversation] = sim.conversations()
        await made.close()
    given = conversation.messages()[:-1]  # less the answer
    assert 0 < len(given) < len(history)
    assert given[-1] == ("user", "the last question")  # the one being answered is always kept


async def test_a_handle_of_the_same_model_is_resumed_and_new_handles_map_to_history() -> None:
    history: list[HistoryItem] = [
        User(content="one"),
        Respond(content="first"),
        User(content="two"),
    ]
    point = ResumePoint("scripted", "live", "h-1", items=2, at=NOW - 60)
    factory = ScriptedFactory(model="live")
    made, _, spawned, remembered = link(history, resume=point)

    def resuming() -> ScriptedUpstream:
        upstream = ScriptedUpstream(resumes=True)
        factory.made.append(upstream)
        return upstream

    factory.create = resuming  # type: ignore[method-assign]
    upstream, _ = await made.open(request(factory))
    assert isinstance(upstream, ScriptedUpstream) and upstream.opened_with is not None
    assert upstream.opened_with[3] == Resume("h-1", tuple(assemble(history[2:])))

    # A handle given at the position the connection opened at covers the handle's items.
    made.resumable(Resumable(handle="h-2", position=0))
    await spawned.done()
    kept = decode_resume_point(remembered.fields[-1][META_KEY])
    assert kept is not None and (kept.handle, kept.items, kept.at) == ("h-2", 2, NOW)

    # At a turn's end the position holds the whole history; a handle between two
    # steps of a turn (a position never seen at an end) is not kept.
    history += [Respond(content="second")]
    upstream._position = 1
    made.turn_ended()
    made.resumable(Resumable(handle="h-3", position=1))
    made.resumable(Resumable(handle="h-mid-turn", position=7))
    await spawned.done()
    kept = decode_resume_point(remembered.fields[-1][META_KEY])
    assert kept is not None and (kept.handle, kept.items) == ("h-3", 4)
    assert len(remembered.fields) == 2


async def test_a_handle_of_another_model_is_not_offered() -> None:
    point = ResumePoint("scripted", "old-model", "h-1", items=1, at=NOW)
    made, *_ = link([User(content="one")], resume=point)
    factory = ScriptedFactory(model="new-model")
    assert made.resume_for(factory) is None
    upstream, _ = await made.open(request(factory))
    assert isinstance(upstream, ScriptedUpstream) and upstream.opened_with is not None
    assert upstream.opened_with[3] is None


async def test_positions_kept_are_bounded() -> None:
    made, *_ = link([User(content="one")])
    upstream, _ = await made.open(request(ScriptedFactory()))
    assert isinstance(upstream, ScriptedUpstream)
    for position in range(40):
        upstream._position = position
        made.turn_ended()
    assert len(made._positions) == 16 and max(made._positions) == 39


async def test_a_dropped_connection_is_stopped_and_closed_in_the_background() -> None:
    made, _, spawned, _ = link([User(content="one")])
    assert made.drop(stop=True) is None  # nothing to let go
    upstream, _ = await made.open(request(ScriptedFactory()))
    assert made.drop(stop=True) is upstream and made.upstream is None
    await spawned.done()
    assert isinstance(upstream, ScriptedUpstream)
    assert upstream.calls[-2:] == ["cancel_response", "close"]

    again, _ = await made.open(request(ScriptedFactory()))
    made.drop(stop=False)
    await spawned.done()
    assert isinstance(again, ScriptedUpstream) and again.calls[-1] == "close"
    assert "cancel_response" not in again.calls

    last, _ = await made.open(request(ScriptedFactory()))
    await made.close()
    assert isinstance(last, ScriptedUpstream) and last.closed and made.upstream is None


class _SlowUpstream:
    """``recv`` answers when ``answer`` is set (a provider that may go quiet)."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[ResponseDone] = asyncio.get_running_loop().create_future()

    async def recv(self) -> ResponseDone:
        return await asyncio.shield(self.answer)

    def upstream(self) -> Upstream:
        return cast(Upstream, self)


async def test_a_read_that_hears_nothing_for_the_stall_timeout_returns_none() -> None:
    watch = SilenceWatch(0.05)
    quiet = _SlowUpstream()
    assert await asyncio.wait_for(watch.recv(quiet.upstream()), 5) is None
    # The watch serves the next read as fresh: an answer in time is returned.
    quiet.answer.set_result(ResponseDone(status="completed"))
    assert await asyncio.wait_for(watch.recv(quiet.upstream()), 5) == ResponseDone(
        status="completed"
    )
    watch.close()


async def test_output_heard_outside_the_read_keeps_it_waiting() -> None:
    """The text fast path's deltas (``heard``) are not silence: the read goes on."""
    watch = SilenceWatch(0.2)
    slow = _SlowUpstream()
    read = asyncio.ensure_future(watch.recv(slow.upstream()))
    loop = asyncio.get_running_loop()
    until = loop.time() + 0.6  # three stall timeouts of deltas taken by the fast path
    while loop.time() < until:
        watch.heard += 1
        await asyncio.sleep(0.02)
    assert not read.done()
    slow.answer.set_result(ResponseDone(status="completed"))
    assert await asyncio.wait_for(read, 5) == ResponseDone(status="completed")
    watch.close()


async def test_a_read_cancelled_by_someone_else_stays_cancelled() -> None:
    watch = SilenceWatch(30)
    read = asyncio.ensure_future(watch.recv(_SlowUpstream().upstream()))
    await asyncio.sleep(0)
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
    watch.close()
