"""The Gemini Live adapter against the in-process Gemini simulator, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from gateway.config import load_config
from gateway.sim.model import SimConfig, sim_reply, simulated_usage_tokens
from gateway.sim.server import serve_sim
from gateway.upstream.base import (
    ResponseDone,
    Resumable,
    TextDelta,
    Thought,
    UpstreamClosed,
    UpstreamError,
    Woken,
)
from gateway.upstream.gemini import DEFAULT_MODEL, PROVIDER, GeminiLive
from protocol.assembly import Message, results_message
from protocol.events import Usage
from tests.support.redis_server import free_port

from .helpers import Turn, read_turn, read_until, recv

ECHO_HI = "<think>The user said something.</think>Echo: hi<end>"
TOOL = '/tool read {"file": "a.txt"}'
TOOL_CALL = (
    "<think>I should call read.</think>\n"
    '<execute>\n[{"name": "read", "args": {"file": "a.txt"}}]\n</execute>'
)
# What the session's parser accepts of TOOL_CALL, re-assembled (blocks joined by a blank line).
ACCEPTED = (
    "<think>I should call read.</think>\n\n"
    '<execute>\n[{"name": "read", "args": {"file": "a.txt"}}]\n</execute>'
)
LONG = "/raw " + "x" * 2000  # at 50 chunks/s of 1 char: 40 s, so always cut short
RESULTS = results_message('[{"tool": "read", "status": "success", "content": "x"}]')
ANSWER = "<think>The tool answered.</think>The tool returned success.<end>"


def gemini(**knobs: object) -> SimConfig:
    return SimConfig(flavor="gemini", **knobs)  # type: ignore[arg-type]


def adapter(url: str, **kwargs: object) -> GeminiLive:
    """An adapter on the simulator's own model, which writes text (today's Live models only
    speak: see test_gemini_models.py for them)."""
    kwargs.setdefault("model", "sim")
    return GeminiLive(base_url=url, api_key="test", **kwargs)  # type: ignore[arg-type]


async def turn(up: GeminiLive, text: str | Message) -> Turn:
    message = text if isinstance(text, Message) else Message(role="user", content=text)
    await up.add_message(message)
    await up.start_response()
    return await read_turn(up)


async def test_text_turn_with_usage() -> None:
    async with serve_sim(gemini(chunk_size=4)) as sim:
        up = adapter(sim.url)
        await up.open("You are a test.", [])
        result = await turn(up, "hi")
        await up.close()
    assert result.text == ECHO_HI
    assert all(len(d) <= 4 for d in result.deltas)
    assert result.errors == []
    assert result.done == ResponseDone(
        status="completed",
        usage=Usage(
            input=simulated_usage_tokens(len("You are a test.") + len("hi")),
            output=len(result.deltas),
        ),
    )


async def test_history_and_instructions_reach_the_sim_in_one_request() -> None:
    history = [
        Message(role="user", content="first question"),
        Message(role="assistant", content="<think>t</think>first answer\n<end>"),
        Message(role="system", content="note"),
        Message(role="user", content="hi"),
    ]
    async with serve_sim(gemini()) as sim:
        up = adapter(sim.url)
        await up.open("Be brief.", history)
        await up.start_response()
        result = await read_turn(up)
        [conversation] = sim.conversations()
        await up.close()
        assert sim.stats.responses_total == 1
    assert result.text == ECHO_HI  # it answered the last user message of the history
    assert conversation.instructions == "Be brief."
    # assistant → model; system → a user turn (Live has one instruction, fixed at setup).
    assert conversation.messages() == [
        ("user", "first question"),
        ("model", "<think>t</think>first answer\n<end>"),
        ("user", "note"),
        ("user", "hi"),
        ("model", ECHO_HI),
    ]
    chars = len("Be brief.") + sum(len(m.content) for m in history)
    assert result.done is not None
    assert result.done.usage == Usage(
        input=simulated_usage_tokens(chars), output=len(result.deltas)
    )


async def test_tool_turn_with_and_without_overrun() -> None:
    async with serve_sim(gemini()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        result = await turn(up, TOOL)
        await up.close()
    assert result.text.startswith(TOOL_CALL)
    assert "hallucinated" in result.text[len(TOOL_CALL) :]
    async with serve_sim(gemini(overrun=False)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        result = await turn(up, TOOL)
        await up.close()
    assert result.text == TOOL_CALL


async def test_results_message_gets_an_answer_quoting_the_status() -> None:
    async with serve_sim(gemini()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        ok = await turn(up, results_message('[{"tool": "read", "status": "failure"}]'))
        bad = await turn(up, results_message("[{not json"))
        await up.close()
    assert ok.text == "<think>The tool answered.</think>The tool returned failure.<end>"
    assert bad.text == "<think>The tool answered.</think>The results were unreadable.<end>"


async def test_cancel_mid_stream_abandons_the_turn_and_reconnects_for_the_next() -> None:
    async with serve_sim(gemini(tokens_per_second=50, chunk_size=1)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content=LONG))
        await up.start_response()
        first = await recv(up)
        assert isinstance(first, TextDelta)
        await up.cancel_response()
        cancelled = await read_turn(up)
        # The model keeps writing (Live has no cancel): the next request does
        # not interrupt it but starts over on a new connection with the transcript.
        result = await turn(up, "/raw bbb")
        [conversation] = sim.conversations()
        await up.close()
        assert sim.stats.connections_total == 2
    assert cancelled.deltas == []
    assert cancelled.done is not None
    assert cancelled.done.status == "cancelled"
    # Gemini reports no usage for an abandoned turn: it is estimated from characters.
    assert cancelled.done.estimated
    assert cancelled.done.usage is not None and cancelled.done.usage.output > 0
    assert "no cancel" in cancelled.done.detail
    assert result.text == "bbb"
    assert result.errors == []
    assert conversation.messages() == [
        ("user", LONG),
        ("model", first.text),  # what the session saw of the cancelled turn
        ("user", "/raw bbb"),
        ("model", "bbb"),
    ]


async def test_cancel_gives_up_after_the_grace_period() -> None:
    async with serve_sim(gemini(tokens_per_second=2, chunk_size=1)) as sim:
        up = adapter(sim.url, cancel_grace=0.05)
        await up.open("", [])
        await up.add_message(Message(role="user", content=LONG))
        await up.start_response()
        assert isinstance(await recv(up), TextDelta)
        await up.cancel_response()
        result = await read_turn(up)
        await up.close()
    assert result.deltas == []
    assert result.done is not None
    assert result.done.status == "cancelled"
    assert "did not end within 0.05s" in result.done.detail


async def test_cancel_at_execute_of_a_model_that_stops_keeps_the_connection() -> None:
    """The session's flow when the model ends its turn at ``</execute>``:
    the turn ends by itself, with usage, and the server's copy needs no fix."""
    call = f"/raw {ACCEPTED}"
    async with serve_sim(gemini(tokens_per_second=100, chunk_size=3)) as sim:
        up = adapter(sim.url, cancel_grace=10.0)
        await up.open("", [])
        await up.add_message(Message(role="user", content=call))
        await up.start_response()
        head = await read_until(up, "</execute>")
        await up.cancel_response()
        rest = await read_turn(up)
        await up.replace_response(ACCEPTED)
        answer = await turn(up, RESULTS)
        [conversation] = sim.conversations()
        await up.close()
        assert sim.stats.connections_total == 1
    assert head.text == ACCEPTED
    assert rest.deltas == []
    assert rest.done is not None
    assert rest.done.status == "completed"
    assert rest.done.usage is not None
    assert rest.done.usage.output == len(head.deltas)
    assert answer.text == ANSWER
    assert conversation.messages() == [
        ("user", call),
        ("model", ACCEPTED),
        ("user", RESULTS.content),
        ("model", ANSWER),
    ]


async def test_replace_response_after_overrun_reconnects_with_the_transcript() -> None:
    async with serve_sim(gemini()) as sim:
        up = adapter(sim.url)
        await up.open("Be brief.", [])
        await up.add_message(Message(role="user", content=TOOL))
        await up.start_response()
        head = await read_until(up, "</execute>")
        await up.cancel_response()
        rest = await read_turn(up)
        assert rest.done is not None
        assert rest.done.status == "cancelled"
        await up.replace_response(ACCEPTED)
        answer = await turn(up, RESULTS)
        [conversation] = sim.conversations()
        await up.close()
        assert sim.stats.connections_total == 2
    assert head.text.startswith(TOOL_CALL)
    assert answer.text == ANSWER
    # The new connection's context is the history's: no overrun, the accepted text.
    assert conversation.instructions == "Be brief."
    assert conversation.messages() == [
        ("user", TOOL),
        ("model", ACCEPTED),
        ("user", RESULTS.content),
        ("model", ANSWER),
    ]


async def test_replace_response_of_a_completed_turn_with_other_text_reconnects() -> None:
    async with serve_sim(gemini(overrun=False)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        first = await turn(up, TOOL)
        assert first.text == TOOL_CALL
        await up.replace_response(ACCEPTED)  # the parser's blocks: "\n" became "\n\n"
        answer = await turn(up, RESULTS)
        [conversation] = sim.conversations()
        await up.close()
        assert sim.stats.connections_total == 2
    assert answer.text == ANSWER
    assert conversation.messages()[:2] == [("user", TOOL), ("model", ACCEPTED)]


async def test_replace_response_with_the_same_text_changes_nothing() -> None:
    async with serve_sim(gemini(overrun=False)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await turn(up, TOOL)
        await up.replace_response(TOOL_CALL)
        await turn(up, RESULTS)
        await up.close()
        assert sim.stats.connections_total == 1


async def test_text_sink_takes_the_turn_and_the_transcript_still_holds_it() -> None:
    """``stream_text_to``: the running turn's text goes to the sink in order;
    the adapter's copy of the turn includes it, so replacing it with the same
    text needs no reconnect, and a sink asking to act wakes ``recv()``."""
    async with serve_sim(gemini(overrun=False, tokens_per_second=200, chunk_size=3)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        text: list[str] = []  # in arrival order, from the sink and from recv()
        taken = 0

        def sink(delta: str) -> bool:
            nonlocal taken
            taken += 1
            text.append(delta)
            return "<execute>" in "".join(text)  # mid-turn: the rest comes from recv()

        assert up.stream_text_to(sink)
        await up.add_message(Message(role="user", content=TOOL))
        await up.start_response()
        while not isinstance(event := await recv(up), Woken):
            assert isinstance(event, TextDelta)
            text.append(event.text)
        up.stream_text_to(None)
        rest = await read_turn(up)
        await up.replace_response(TOOL_CALL)
        answer = await turn(up, RESULTS)
        await up.close()
        assert sim.stats.connections_total == 1
    assert "".join(text) + rest.text == TOOL_CALL
    assert taken > 5
    assert answer.text == ANSWER


async def test_replace_response_without_output_just_adds_the_text() -> None:
    async with serve_sim(gemini()) as sim:
        up = adapter(sim.url)
        await up.open("", [Message(role="user", content="q")])
        await up.replace_response("<think>resumed</think>")
        result = await turn(up, "hi")
        [conversation] = sim.conversations()
        await up.close()
        assert sim.stats.connections_total == 1
    assert result.text == ECHO_HI
    assert conversation.messages() == [
        ("user", "q"),
        ("model", "<think>resumed</think>"),
        ("user", "hi"),
        ("model", ECHO_HI),
    ]


async def test_a_failed_background_reconnect_surfaces_at_the_next_request() -> None:
    async with serve_sim(gemini()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content=TOOL))
        await up.start_response()
        await read_until(up, "</execute>")
        await up.cancel_response()
        await read_turn(up)
        await sim.close()
        await up.replace_response(ACCEPTED)
        await up.add_message(RESULTS)
        with pytest.raises(UpstreamClosed):
            await up.start_response()
            await recv(up)
        await up.close()


async def test_a_second_start_response_while_running_is_refused() -> None:
    async with serve_sim(gemini(tokens_per_second=50, chunk_size=1)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content=LONG))
        await up.start_response()
        assert isinstance(await recv(up), TextDelta)
        await up.start_response()
        error = await recv(up)
        assert isinstance(error, UpstreamError)
        assert error.code == "active_response"
        assert isinstance(await recv(up), TextDelta)  # the running turn goes on
        await up.cancel_response()
        result = await read_turn(up)
        await up.close()
        assert sim.stats.responses_total == 1
    assert result.done is not None
    assert result.done.status == "cancelled"


async def test_go_away_reconnects_between_turns() -> None:
    async with serve_sim(gemini(go_away_after=2)) as sim:
        up = adapter(sim.url)
        await up.open("Be brief.", [])
        first = await turn(up, "hi")  # goAway mid-turn; the sim closes after the turn
        second = await turn(up, "again")
        [conversation] = sim.conversations()
        await up.close()
        assert sim.stats.connections_total == 2
    assert first.text == ECHO_HI
    assert second.text == sim_reply("again")
    assert conversation.messages() == [
        ("user", "hi"),
        ("model", ECHO_HI),
        ("user", "again"),
        ("model", second.text),
    ]


async def test_a_close_after_go_away_names_it() -> None:
    async with serve_sim(gemini(chunk_size=1, go_away_after=1, drop_after=3)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content="hi"))
        await up.start_response()
        deltas = [await recv(up) for _ in range(3)]
        with pytest.raises(UpstreamClosed) as info:
            await recv(up)
        await up.close()
    assert deltas == [TextDelta("<"), TextDelta("t"), TextDelta("h")]
    assert "1006" in info.value.reason
    assert "goAway (timeLeft=10s)" in info.value.reason


async def test_drop_after_raises_upstream_closed() -> None:
    async with serve_sim(gemini(chunk_size=1, drop_after=3)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content="hi"))
        await up.start_response()
        deltas = [await recv(up) for _ in range(3)]
        with pytest.raises(UpstreamClosed) as info:
            await recv(up)
        await up.close()
    assert deltas == [TextDelta("<"), TextDelta("t"), TextDelta("h")]
    assert "1006" in info.value.reason


async def test_sim_closing_raises_upstream_closed_with_the_code() -> None:
    async with serve_sim(gemini()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await sim.close()
        with pytest.raises(UpstreamClosed) as info:
            await recv(up)
        await up.close()
    assert "1001" in info.value.reason


async def test_api_key_is_checked() -> None:
    async with serve_sim(gemini(api_key="sekret")) as sim:
        with pytest.raises(UpstreamClosed) as info:
            await GeminiLive(base_url=sim.url, api_key="wrong", model="sim").open("", [])
        assert "code 1007: API key not valid" in info.value.reason
        assert "GEMINI_API_KEY" in info.value.reason
        with pytest.raises(UpstreamClosed) as info:
            await GeminiLive(base_url=sim.url, api_key="", model="sim").open("", [])
        assert "code 1008" in info.value.reason
        assert "GEMINI_API_KEY" in info.value.reason
        up = GeminiLive(base_url=sim.url, api_key="sekret", model="sim")
        await up.open("", [])
        result = await turn(up, "hi")
        await up.close()
    assert result.text == ECHO_HI
    assert "sekret" not in up.url  # the key travels in a header, never in the URL


async def test_the_key_reaches_the_adapter_through_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "from-env")
    assert GeminiLive(base_url="ws://unused").api_key == ""  # adapters read no environment
    async with serve_sim(gemini(api_key="from-env")) as sim:
        config = load_config({"gemini_base_url": sim.url}, env={"GEMINI_API_KEY": "from-env"})
        assert PROVIDER.factory(config.upstream("gemini")).model == DEFAULT_MODEL
        factory = PROVIDER.factory(config.upstream("gemini"), "sim")
        up = factory.create()
        assert isinstance(up, GeminiLive)
        await up.open("", [])
        result = await turn(up, "hi")
        await up.close()
    assert result.text == ECHO_HI


def test_model_names_get_the_models_prefix() -> None:
    assert GeminiLive(model="m1", api_key="k").model_name == "models/m1"
    assert GeminiLive(model="models/m1", api_key="k").model_name == "models/m1"
    assert GeminiLive(api_key="k").url == (
        "wss://generativelanguage.googleapis.com/ws/"
        "google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
    )


async def test_an_unknown_model_is_a_refusal_with_advice() -> None:
    async with serve_sim(gemini()) as sim:
        with pytest.raises(UpstreamClosed) as info:
            await adapter(sim.url, model="tuned/x").open("", [])
    assert "code 1008" in info.value.reason
    assert "not found" in info.value.reason
    assert "check the model name" in info.value.reason


async def test_unreachable_server_raises_upstream_closed() -> None:
    up = GeminiLive(base_url=f"ws://127.0.0.1:{free_port()}", api_key="x")
    with pytest.raises(UpstreamClosed) as info:
        await up.open("", [])
    assert "cannot connect" in info.value.reason


async def test_wrong_api_version_gives_the_http_status() -> None:
    async with serve_sim(gemini()) as sim:
        with pytest.raises(UpstreamClosed) as info:
            await adapter(sim.url, api_version="v1").open("", [])
    assert "HTTP 404" in info.value.reason
    assert "v1beta" in info.value.reason


# --- scripted servers: frames the simulator never sends ------------------------------

SETUP_COMPLETE = '{"setupComplete": {}}'


@contextlib.asynccontextmanager
async def scripted(frames: Sequence[str]) -> AsyncIterator[tuple[str, list[int]]]:
    """A server that answers each connection's first two client messages
    (setup, then a request) with ``frames[0]``, then the rest; yields its URL
    and a one-item list counting connections."""
    connections = [0]

    async def handler(ws: ServerConnection) -> None:
        connections[0] += 1
        with contextlib.suppress(ConnectionClosed):  # the adapter may leave at any point
            await ws.recv()
            await ws.send(frames[0])
            await ws.recv()
            for frame in frames[1:]:
                await ws.send(frame)
            async for _ in ws:
                pass

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}", connections


async def test_no_setup_complete_times_out() -> None:
    async with scripted(['{"sessionResumptionUpdate": {}}']) as (url, _):
        with pytest.raises(UpstreamClosed) as info:
            await adapter(url, open_timeout=0.2).open("", [])
    assert "setupComplete" in info.value.reason


async def test_unknown_frames_are_skipped_and_broken_ones_reported() -> None:
    usage = {"promptTokenCount": 7, "candidatesTokenCount": 2, "totalTokenCount": 9}
    frames = [
        SETUP_COMPLETE,
        '{"voiceActivity": {"voiceActivityType": "ACTIVITY_START"}}',
        '{"sessionResumptionUpdate": {"newHandle": "h", "resumable": true}}',
        '{"serverContent": {"modelTurn": {"parts": [{"text": "hmm", "thought": true}]}}}',
        '{"serverContent": {"modelTurn": {"parts": [{"text": "a"}, {"inlineData": {}}, '
        '{"text": "b"}]}}}',
        '{"serverContent": {"modelTurn": {"parts": "x"}}}',
        "not json",
        '{"error": {"code": 400, "message": "bad thing", "status": "INVALID_ARGUMENT"}}',
        json.dumps({"serverContent": {"turnComplete": True}, "usageMetadata": usage}),
    ]
    async with scripted(frames) as (url, _):
        up = adapter(url)
        await up.open("", [])
        await up.start_response()
        events = [await asyncio.wait_for(up.recv(), 10) for _ in range(8)]
        await up.close()
    # A resumption handle and a thought are news for the session; the rest is skipped.
    assert events[:4] == [Resumable("h"), Thought("hmm"), TextDelta("a"), TextDelta("b")]
    assert isinstance(events[4], UpstreamError)
    assert events[4].code == "upstream_protocol"
    assert isinstance(events[5], UpstreamError)
    assert events[5].code == "upstream_protocol"
    assert events[6] == UpstreamError(code="INVALID_ARGUMENT", message="bad thing")
    assert events[7] == ResponseDone(status="completed", usage=Usage(input=7, output=2))


async def test_an_interrupted_turn_ends_cancelled_and_the_next_request_reconnects() -> None:
    frames = [
        SETUP_COMPLETE,
        '{"serverContent": {"modelTurn": {"parts": [{"text": "par"}]}}}',
        '{"serverContent": {"interrupted": true}}',
        '{"serverContent": {"turnComplete": true}}',  # ignored: the turn already ended
    ]
    async with scripted(frames) as (url, connections):
        up = adapter(url)
        await up.open("", [])
        await up.start_response()
        result = await read_turn(up)
        await up.start_response()
        second = await read_turn(up)
        await up.close()
    assert result.text == "par"
    assert result.done == ResponseDone(
        status="cancelled",
        usage=Usage(input=0, output=1),  # "par": 3 characters, about one token
        detail="Gemini Live interrupted the turn",
        estimated=True,
    )
    assert second.done is not None
    assert connections == [2]


async def test_close_is_idempotent_and_recv_after_close_raises() -> None:
    async with serve_sim(gemini()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.close()
        await up.close()
        with pytest.raises(UpstreamClosed):
            await up.recv()
        with pytest.raises(UpstreamClosed):
            await up.start_response()
        with pytest.raises(RuntimeError):
            await up.open("", [])
    await GeminiLive(base_url="ws://unused", api_key="x").close()  # never opened


async def test_many_concurrent_sessions() -> None:
    async with serve_sim(gemini(tokens_per_second=200, chunk_size=2)) as sim:

        async def one(n: int) -> str:
            up = adapter(sim.url)
            await up.open("", [])
            result = await turn(up, f"message {n}")
            await up.close()
            return result.text

        texts = await asyncio.gather(*(one(n) for n in range(50)))
        assert sim.stats.connections_total == 50
        assert sim.stats.responses_total == 50
    assert texts == [sim_reply(f"message {n}") for n in range(50)]
