"""The Python client's hooks as a new user writes them (issue 38): set as attributes,
told what arrives outside a turn, and enough to make a barge-in say what was heard."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from gateway.client import Client
from gateway.client.client import HOOK_NAMES, event_kind
from gateway.client.hooks import Hook
from protocol.events import Call, Cancelled, Event, Respond, Result
from tests.conftest import LoggedTracebacks
from tests.gateway.conftest import GatewayFactory
from tests.voice.conftest import utterance, voice_gateway

RATE = 24000


async def test_on_audio_set_as_an_attribute_is_told_and_a_barge_in_says_what_was_heard(
    tmp_path: Path,
) -> None:
    async with voice_gateway(
        "openai", tmp_path, tokens_per_second=20, chunk_size=2, audio_ms_per_char=60
    ) as gw:
        c = Client(gw.url)
        frames: list[int] = []
        played = 0
        reports: set[asyncio.Task[None]] = set()

        def play(seq: int, pcm: bytes) -> None:  # a player: plays it, reports how far
            nonlocal played
            frames.append(seq)
            played += len(pcm) // (2 * RATE // 1000)
            report = asyncio.ensure_future(c.played(seq, played))
            reports.add(report)
            report.add_done_callback(reports.discard)

        c.on_audio = play  # after the constructor, as attributes usually are
        assert c.on_audio is play
        async with c:
            await c.configure(input_audio={"rate": RATE}, output="audio")
            events: list[Event] = []
            talked = False
            async with asyncio.timeout(30):
                async for event in c.send("/raw " + "z" * 200):
                    events.append(event)
                    if isinstance(event, Respond) and len(frames) > 5 and not talked:
                        talked = True
                        # The answer is being spoken: the user talks over it.
                        await asyncio.sleep(0.3)
                        for at in range(0, len(speech := utterance(0.5, RATE)), 960):
                            await c.send_audio(speech[at : at + 960])
                            await asyncio.sleep(0.02)
    assert frames, "the model's speech never reached on_audio"
    [cancelled] = [e for e in events if isinstance(e, Cancelled)]
    assert cancelled.reason == "barge_in"
    assert isinstance(cancelled.heard_ms, int) and 0 < cancelled.heard_ms <= played


def test_a_hook_that_is_not_a_function_is_refused_at_once() -> None:
    c = Client("ws://127.0.0.1:1/v1/realtime")
    with pytest.raises(TypeError, match="on_event takes a function"):
        c.on_event = "print"  # type: ignore[assignment]
    c.on_event = None
    assert c.on_event is None
    with pytest.raises(AttributeError, match="Client has no hook 'on_events': its hooks are"):
        c.on_events = print  # a typo is not silently ignored either
    hooks = {n for n in vars(Client) if isinstance(inspect.getattr_static(Client, n), Hook)}
    assert hooks == set(HOOK_NAMES)


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_a_background_result_after_the_turn_reaches_on_event(
    gateway_factory: GatewayFactory, store_kind: str
) -> None:
    outside: list[Event] = []
    answered = asyncio.Event()

    def seen(event: Event) -> None:
        outside.append(event)
        if event_kind(event) == "metric" and any(isinstance(e, Result) for e in outside):
            answered.set()

    release = asyncio.Event()
    async with gateway_factory() as gw, Client(gw.url) as c:
        c.on_event = seen

        @c.tool
        async def report(args: dict[str, object]) -> str:
            await release.wait()  # done only after its turn has ended
            return "42 pages"

        await c.configure(
            tools=[{"name": "report", "parameters": {"type": "object"}, "background": True}]
        )
        async with asyncio.timeout(30):
            turn = [e async for e in c.send("/tool report {}")]
            [call] = [e for e in turn if isinstance(e, Call)]
            assert call.background is True
            assert event_kind(turn[-1]) == "metric"  # the turn ended without the result
            # The model was told it started, and says so (not that it returned).
            answer = "".join(e.content for e in turn if isinstance(e, Respond))
            assert answer == "The tool started in the background; its result comes later."
            assert not [e for e in turn if isinstance(e, Result) and e.id == call.id]
            release.set()
            await answered.wait()
    [result] = [e for e in outside if isinstance(e, Result)]
    assert result.id == call.id and "42 pages" in result.content
    said = "".join(e.content for e in outside if isinstance(e, Respond))
    assert "The tool returned success" in said  # the model's answer to it, told too
    # Each event went one way: nothing send() yielded is told again.
    assert not {e.seq for e in turn} & {e.seq for e in outside}


@pytest.mark.logs_traceback
@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_a_hook_that_raises_is_logged_and_the_client_goes_on(
    gateway_factory: GatewayFactory, store_kind: str, logged_tracebacks: LoggedTracebacks
) -> None:

    def broken(event: Event) -> None:
        raise RuntimeError("the app's bug")

    async with gateway_factory() as gw, Client(gw.url, on_event=broken) as c:
        await c.configure(instructions="Be brief.")  # its event comes outside a turn
        events = [e async for e in c.send("hello")]
    assert "".join(e.content for e in events if isinstance(e, Respond)) == "Echo: hello"
    assert "broken raised" in logged_tracebacks.report()
