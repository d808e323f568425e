"""The OpenAI Realtime adapter against the in-process simulator, over real sockets."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.config import load_config
from gateway.sim.model import SimConfig, sim_reply
from gateway.sim.server import serve_sim
from gateway.upstream.base import (
    ResponseDone,
    TextDelta,
    UpstreamClosed,
    UpstreamError,
    Woken,
)
from gateway.upstream.openai import PROVIDER, OpenAIRealtime
from protocol.assembly import Message, results_message
from protocol.events import Usage
from tests.support.redis_server import free_port

from .helpers import (
    SESSION_CREATED,
    Turn,
    read_turn,
    read_until,
    recv,
    scripted_server,
)

ECHO_HI = "<think>The user said something.</think>Echo: hi<end>"
TOOL = '/tool read {"file": "a.txt"}'
TOOL_CALL = (
    "<think>I should call read.</think>\n"
    '<execute>\n[{"name": "read", "args": {"file": "a.txt"}}]\n</execute>'
)
LONG = "/raw " + "x" * 2000  # at 50 deltas/s of 1 char: 40 s, so always cut short


def adapter(url: str, **kwargs: object) -> OpenAIRealtime:
    return OpenAIRealtime(base_url=url, api_key="test", **kwargs)  # type: ignore[arg-type]


async def turn(up: OpenAIRealtime, text: str | Message) -> Turn:
    message = text if isinstance(text, Message) else Message(role="user", content=text)
    await up.add_message(message)
    await up.start_response()
    return await read_turn(up)


async def test_text_turn() -> None:
    async with serve_sim(SimConfig(chunk_size=4)) as sim:
        up = adapter(sim.url)
        await up.open("You are a test.", [])
        result = await turn(up, "hi")
        await up.close()
    assert result.text == ECHO_HI
    assert all(len(d) <= 4 for d in result.deltas)
    assert result.errors == []
    instructions_and_items = len("You are a test.") + len("hi")
    assert result.done == ResponseDone(
        status="completed",
        usage=Usage(input=instructions_and_items // 4, output=len(result.deltas)),
    )


async def test_tool_turn_with_and_without_overrun() -> None:
    async with serve_sim(SimConfig()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        result = await turn(up, TOOL)
        await up.close()
    assert result.text.startswith(TOOL_CALL)
    assert "hallucinated" in result.text[len(TOOL_CALL) :]
    async with serve_sim(SimConfig(overrun=False)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        result = await turn(up, TOOL)
        await up.close()
    assert result.text == TOOL_CALL


async def test_results_message_gets_an_answer_quoting_the_status() -> None:
    async with serve_sim(SimConfig()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        ok = await turn(
            up, results_message('[{"tool": "read", "status": "failure", "content": 1}]')
        )
        bad = await turn(up, results_message("[{not json"))
        await up.close()
    assert ok.text == "<think>The tool answered.</think>The tool returned failure.<end>"
    assert bad.text == "<think>The tool answered.</think>The results were unreadable.<end>"


async def test_cancel_mid_stream() -> None:
    async with serve_sim(SimConfig(tokens_per_second=50, chunk_size=1)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content=LONG))
        await up.start_response()
        first = await recv(up)
        assert isinstance(first, TextDelta)
        await up.cancel_response()
        result = await read_turn(up)
        # Every delta the sim sent before it saw the cancel reaches us, and the
        # sim's item holds exactly the text that was sent.
        [conversation] = sim.conversations()
        await up.close()
    assert result.done is not None
    assert result.done.status == "cancelled"
    assert result.done.detail == "client_cancelled"
    received = first.text + result.text
    assert 0 < len(received) < 2000
    assert result.done.usage is not None
    assert result.done.usage.output == len(received)
    assert conversation.items[-1].role == "assistant"
    assert conversation.items[-1].text == received
    assert conversation.items[-1].status == "incomplete"


async def test_replace_response_after_completed_overrun() -> None:
    async with serve_sim(SimConfig()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        first = await turn(up, TOOL)
        assert first.text != TOOL_CALL  # the overrun is there
        await up.replace_response(TOOL_CALL)
        results = results_message('[{"tool": "read", "status": "success", "content": "x"}]')
        answer = await turn(up, results)
        [conversation] = sim.conversations()
        await up.close()
    assert answer.text == "<think>The tool answered.</think>The tool returned success.<end>"
    assert conversation.messages() == [
        ("user", TOOL),
        ("assistant", TOOL_CALL),
        ("user", results.content),
        ("assistant", answer.text),
    ]


@pytest.mark.parametrize(
    ("overrun", "status"),
    [
        # ~110 characters of made-up results follow at 100 a second: the cancel, sent as
        # ``</execute>`` arrives, has 1.1 s to reach the simulator (it takes milliseconds).
        (True, "cancelled"),
        # The reply ends at ``</execute>``: the cancel comes after the response completed.
        (False, "completed"),
    ],
)
async def test_replace_response_after_cancel_at_execute(overrun: bool, status: str) -> None:
    """The session's flow: cancel as soon as ``</execute>`` arrives, then replace."""
    config = SimConfig(tokens_per_second=100, chunk_size=1, overrun=overrun)
    async with serve_sim(config) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content=TOOL))
        await up.start_response()
        head = await read_until(up, "</execute>")
        await up.cancel_response()
        rest = await read_turn(up)
        assert rest.done is not None
        assert rest.done.status == status
        assert (head.text + rest.text).startswith(TOOL_CALL)
        assert "I made that up" not in rest.text
        await up.replace_response(TOOL_CALL)
        answer = await turn(up, "next")
        [conversation] = sim.conversations()
        await up.close()
    assert answer.text == "<think>The user said something.</think>Echo: next<end>"
    assert conversation.messages()[:3] == [
        ("user", TOOL),
        ("assistant", TOOL_CALL),
        ("user", "next"),
    ]


async def test_replace_response_without_output_item_just_adds_the_text() -> None:
    async with serve_sim(SimConfig()) as sim:
        up = adapter(sim.url)
        await up.open("", [Message(role="user", content="q")])
        await up.replace_response("<think>resumed</think>")
        result = await turn(up, "hi")
        [conversation] = sim.conversations()
        await up.close()
    assert result.text == ECHO_HI
    assert conversation.messages()[:3] == [
        ("user", "q"),
        ("assistant", "<think>resumed</think>"),
        ("user", "hi"),
    ]


async def test_second_response_create_is_refused_and_the_first_goes_on() -> None:
    async with serve_sim(SimConfig(tokens_per_second=50, chunk_size=1)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content=LONG))
        await up.start_response()
        assert isinstance(await recv(up), TextDelta)
        await up.start_response()
        while True:  # deltas of the running response may come first
            event = await recv(up)
            if isinstance(event, UpstreamError):
                break
            assert isinstance(event, TextDelta)
        assert event.code == "conversation_already_has_active_response"
        # The refused create did not hide the running response: it still reaches us.
        assert isinstance(await recv(up), TextDelta)
        await up.cancel_response()
        result = await read_turn(up)
        await up.close()
    assert result.done is not None
    assert result.done.status == "cancelled"


async def test_stale_deltas_of_a_cancelled_response_are_dropped() -> None:
    async with serve_sim(SimConfig(tokens_per_second=50, chunk_size=1)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.add_message(Message(role="user", content=LONG))
        await up.start_response()
        assert isinstance(await recv(up), TextDelta)
        # Without waiting for the cancelled response's end, start the next one:
        # whatever of the first is still in flight must not reach the session.
        await up.cancel_response()
        await up.add_message(Message(role="user", content="/raw bbb"))
        await up.start_response()
        result = await read_turn(up)
        await up.close()
    assert result.text == "bbb"
    assert result.done is not None
    assert result.done.status == "completed"
    assert result.errors == []


async def test_text_sink_takes_the_deltas_that_arrive_while_recv_waits() -> None:
    """``stream_text_to``: the running response's text goes to the sink, in
    order and whole, and ``recv()`` returns what the sink does not take."""
    async with serve_sim(SimConfig(tokens_per_second=200, chunk_size=3)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        text: list[str] = []  # in arrival order, from the sink and from recv()
        taken = 0

        def sink(delta: str) -> bool:
            nonlocal taken
            taken += 1
            text.append(delta)
            return False

        assert up.stream_text_to(sink)
        await up.add_message(Message(role="user", content="hi"))
        await up.start_response()
        while not isinstance(event := await recv(up), ResponseDone):
            assert isinstance(event, TextDelta)
            text.append(event.text)
        up.stream_text_to(None)
        await up.close()
    assert "".join(text) == ECHO_HI
    assert taken > 5  # paced deltas arrive while recv() waits: the sink has them
    assert event.status == "completed"


async def test_text_sink_asking_to_act_makes_recv_return_woken() -> None:
    # 40 deltas a second: after "Echo" the reader waits for one at least (at 200 a
    # loaded machine's recv() could read them all, and the sink never got to act).
    async with serve_sim(SimConfig(tokens_per_second=40, chunk_size=3)) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        taken: list[str] = []

        def sink(text: str) -> bool:
            taken.append(text)
            return "Echo" in "".join(taken)  # act once the answer begins

        up.stream_text_to(sink)
        await up.add_message(Message(role="user", content="hi"))
        await up.start_response()
        while not isinstance(event := await recv(up), Woken):
            assert isinstance(event, TextDelta)  # one that came while recv() was not waiting
            taken.append(event.text)
        assert "Echo" in "".join(taken)
        # Stopped: the rest comes from recv() again, nothing lost or repeated.
        up.stream_text_to(None)
        rest = await read_turn(up)
        await up.close()
    assert "".join(taken) + rest.text == ECHO_HI


async def test_cancel_without_active_response_is_harmless() -> None:
    async with serve_sim(SimConfig()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.cancel_response()  # the sim answers response_cancel_not_active
        result = await turn(up, "hi")
        await up.close()
    assert result.errors == []
    assert result.text == ECHO_HI


async def test_history_and_instructions_reach_the_sim() -> None:
    history = [
        Message(role="user", content="first question"),
        Message(role="assistant", content="<think>t</think>first answer\n<end>"),
        Message(role="system", content="note"),
        Message(role="user", content="hi"),
    ]
    async with serve_sim(SimConfig()) as sim:
        up = adapter(sim.url)
        await up.open("Be brief.", history)
        await up.start_response()
        result = await read_turn(up)
        [conversation] = sim.conversations()
        await up.close()
    assert result.text == ECHO_HI  # it answered the last user message of the history
    assert conversation.instructions == "Be brief."
    assert conversation.messages() == [(m.role, m.content) for m in history] + [
        ("assistant", ECHO_HI)
    ]
    chars = len("Be brief.") + sum(len(m.content) for m in history)
    assert result.done is not None
    assert result.done.usage == Usage(input=chars // 4, output=len(result.deltas))


async def test_drop_after_raises_upstream_closed() -> None:
    async with serve_sim(SimConfig(chunk_size=1, drop_after=3)) as sim:
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
    async with serve_sim(SimConfig()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await sim.close()
        with pytest.raises(UpstreamClosed) as info:
            await recv(up)
        await up.close()
    assert "1001" in info.value.reason


async def test_api_key_is_checked() -> None:
    async with serve_sim(SimConfig(api_key="sekret")) as sim:
        for key in ("wrong", ""):
            with pytest.raises(UpstreamClosed) as info:
                await OpenAIRealtime(base_url=sim.url, api_key=key).open("", [])
            assert "401" in info.value.reason
            assert "OPENAI_API_KEY" in info.value.reason
        up = OpenAIRealtime(base_url=sim.url, api_key="sekret")
        await up.open("", [])
        result = await turn(up, "hi")
        await up.close()
    assert result.text == ECHO_HI


async def test_the_key_reaches_the_adapter_through_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert OpenAIRealtime(base_url="ws://unused/v1").api_key == ""  # adapters read no environment
    async with serve_sim(SimConfig(api_key="from-env")) as sim:
        config = load_config({"openai_base_url": sim.url}, env={"OPENAI_API_KEY": "from-env"})
        factory = PROVIDER.factory(config.upstream("openai"), "gpt-realtime")
        up = factory.create()
        assert isinstance(up, OpenAIRealtime)
        await up.open("", [])
        result = await turn(up, "hi")
        await up.close()
    assert result.text == ECHO_HI


async def test_unreachable_server_raises_upstream_closed() -> None:
    up = OpenAIRealtime(base_url=f"ws://127.0.0.1:{free_port()}/v1", api_key="x")
    with pytest.raises(UpstreamClosed) as info:
        await up.open("", [])
    assert "cannot connect" in info.value.reason


async def test_wrong_path_gives_the_http_status() -> None:
    async with serve_sim(SimConfig()) as sim:
        with pytest.raises(UpstreamClosed) as info:
            await adapter(sim.url + "/nowhere").open("", [])
    assert "HTTP 404" in info.value.reason


async def test_no_session_created_times_out() -> None:
    async with scripted_server([]) as url:
        with pytest.raises(UpstreamClosed) as info:
            await adapter(url, open_timeout=0.2).open("", [])
    assert "session.created" in info.value.reason


async def test_error_before_session_created_is_a_refusal() -> None:
    error = json.dumps(
        {
            "type": "error",
            "event_id": "e0",
            "error": {"type": "invalid_request_error", "code": "model_not_found", "message": "no"},
        }
    )
    async with scripted_server([error], close=True) as url:
        with pytest.raises(UpstreamClosed) as info:
            await adapter(url).open("", [])
    assert "model_not_found" in info.value.reason


async def test_unknown_frames_are_skipped_and_broken_ones_reported() -> None:
    frames = [
        SESSION_CREATED,
        '{"type": "some.future.event", "event_id": "e2", "x": [1, 2]}',
        '{"type": "rate_limits.updated", "event_id": "e3", "rate_limits": []}',
        '{"type": "error", "event_id": "e4", "error": {"type": "server_error", '
        '"code": "response_cancel_not_active", "message": "no active response"}}',
        '{"type": "error", "event_id": "e5", "error": {"type": "server_error", "message": "boom"}}',
        '{"type": "response.output_text.delta", "event_id": "e6"}',
        "not json",
    ]
    async with scripted_server(frames) as url:
        up = adapter(url)
        await up.open("", [])
        events = [await recv(up) for _ in range(3)]
        await up.close()
    assert events[0] == UpstreamError(code="server_error", message="boom")
    assert isinstance(events[1], UpstreamError)
    assert events[1].code == "upstream_protocol"
    assert isinstance(events[2], UpstreamError)
    assert events[2].code == "upstream_protocol"


async def test_close_is_idempotent_and_recv_after_close_raises() -> None:
    async with serve_sim(SimConfig()) as sim:
        up = adapter(sim.url)
        await up.open("", [])
        await up.close()
        await up.close()
        with pytest.raises(UpstreamClosed):
            await up.recv()
        with pytest.raises(UpstreamClosed):
            await up.start_response()
    await OpenAIRealtime(base_url="ws://unused/v1", api_key="x").close()  # never opened


async def test_many_concurrent_sessions() -> None:
    async with serve_sim(SimConfig(tokens_per_second=200, chunk_size=2)) as sim:

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
