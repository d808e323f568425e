"""One contract for every provider's adapter: each row of the table, against its flavour.

What the session relies on of any ``Upstream``, whatever its wire: a turn's
text and usage, the read callback's text sink and ``Woken``, a cancel that
ends the response and leaves the next one working, the frames a recorder
taps, a refused key named by the row's variable, a lost connection as
``UpstreamClosed``. Each adapter is made as the node makes it (the row's
settings and factory), so a new row is tested here without a line added.
The adapters' own rules (stale responses, Gemini's reconnects) are in their
own files.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from gateway.sim.model import Sim, SimConfig
from gateway.sim.server import serve_sim
from gateway.upstream import providers
from gateway.upstream.base import ResponseDone, TextDelta, Upstream, UpstreamClosed, Woken
from gateway.upstream.provider import Provider
from protocol.assembly import Message

from .helpers import read_turn, recv

ROWS = [pytest.param(row, id=row.name) for row in providers.PROVIDERS]
KEY = "contract-key"
ECHO_HI = "<think>The user said something.</think>Echo: hi<end>"
LONG = "/raw " + "x" * 2000  # at 50 deltas/s of 1 char: 40 s, so always cut short


def adapter(row: Provider, sim: Sim, key: str = KEY) -> Upstream:
    """The row's adapter as the node makes it, on the simulator's text model."""
    return row.factory(row.settings(base_url=sim.url, api_key=key), "sim").create()


@pytest.fixture(params=ROWS)
def row(request: pytest.FixtureRequest) -> Provider:
    chosen: Provider = request.param
    return chosen


@contextlib.asynccontextmanager
async def opened(row: Provider, **knobs: object) -> AsyncIterator[tuple[Sim, Upstream]]:
    config = SimConfig(flavor=row.name, api_key=KEY, **knobs)  # type: ignore[arg-type]
    async with serve_sim(config) as sim:
        up = adapter(row, sim)
        await up.open("You are a test.", [])
        try:
            yield sim, up
        finally:
            await up.close()


async def ask(up: Upstream, text: str) -> None:
    await up.add_message(Message(role="user", content=text))
    await up.start_response()


async def test_a_turn_streams_its_text_and_ends_with_usage(row: Provider) -> None:
    async with opened(row, chunk_size=4) as (_sim, up):
        await ask(up, "hi")
        result = await read_turn(up)
    assert result.text == ECHO_HI and result.errors == []
    assert result.done is not None and result.done.status == "completed"
    assert result.done.usage is not None
    assert result.done.usage.input > 0 and result.done.usage.output > 0


async def test_the_text_sink_takes_deltas_and_wakes_the_session(row: Provider) -> None:
    # 20 deltas a second: the reader waits between them, so they reach the sink.
    async with opened(row, tokens_per_second=20, chunk_size=1) as (_sim, up):
        taken: list[str] = []

        def sink(text: str) -> bool:
            taken.append(text)
            return True  # the session must act: recv() returns Woken

        assert up.stream_text_to(sink)
        await ask(up, "hi")
        while not isinstance(event := await recv(up), Woken):
            assert isinstance(event, TextDelta)  # one that came while recv() was not waiting
            taken.append(event.text)
        up.stream_text_to(None)
        rest = await read_turn(up)
    # Nothing lost or repeated between the sink and recv().
    assert "".join(taken) + rest.text == ECHO_HI


async def test_a_cancel_ends_the_response_and_the_next_one_works(row: Provider) -> None:
    async with opened(row, tokens_per_second=50, chunk_size=1) as (_sim, up):
        await ask(up, LONG)
        first = await recv(up)
        assert isinstance(first, TextDelta)
        await up.cancel_response()
        cancelled = await read_turn(up)
        await up.replace_response(first.text + cancelled.text)
        await ask(up, "/raw done<end>")
        after = await read_turn(up)
    assert cancelled.done is not None and cancelled.done.status == "cancelled"
    assert set(first.text + cancelled.text) <= {"x"}
    assert after.text == "done<end>" and after.errors == []


async def test_a_recorder_sees_the_frames_both_ways(row: Provider) -> None:
    sent: list[bytes] = []
    received: list[bytes] = []

    class Tap:
        def sent(self, data: bytes, audio: bool) -> None:
            sent.append(data)

        def received(self, data: bytes) -> None:
            received.append(data)

    # The whole answer in one frame, so that a frame holds "Echo".
    async with serve_sim(SimConfig(flavor=row.name, api_key=KEY, chunk_size=100)) as sim:
        up = adapter(row, sim)
        assert up.tap_frames(Tap())
        try:
            await up.open("", [])
            await ask(up, "hi")
            result = await read_turn(up)
        finally:
            await up.close()
    assert result.text == ECHO_HI
    assert any(b"hi" in frame for frame in sent)
    assert any(b"Echo" in frame for frame in received)


async def test_a_refused_key_names_the_rows_variable(row: Provider) -> None:
    async with serve_sim(SimConfig(flavor=row.name, api_key=KEY)) as sim:
        up = adapter(row, sim, key="wrong")
        with pytest.raises(UpstreamClosed) as info:
            await up.open("", [])
        await up.close()
    assert row.key_variable in info.value.reason


async def test_a_lost_connection_is_upstream_closed_and_close_is_final(row: Provider) -> None:
    async with opened(row, chunk_size=1, drop_after=3) as (_sim, up):
        await ask(up, "hi")
        with pytest.raises(UpstreamClosed):
            while not isinstance(await recv(up), ResponseDone):
                pass
        await up.close()
        await up.close()
        with pytest.raises(UpstreamClosed):
            await up.recv()
