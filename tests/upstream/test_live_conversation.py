"""The GPT-Live conversation core, without sockets: every rule the adapter keeps."""

from __future__ import annotations

import msgspec

from gateway.upstream import live_wire as wire
from gateway.upstream.base import (
    AudioDelta,
    AudioOut,
    FunctionTool,
    NativeCall,
    ResponseBegan,
    ResponseDone,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    Transcript,
    UpstreamError,
    VoiceConfig,
)
from gateway.upstream.live_conversation import (
    APPEND_CHARS,
    IDLE,
    RUNNING,
    STALE,
    TYPED_PREFIX,
    LiveConversation,
)
from gateway.upstream.live_setup import HISTORY_MESSAGES
from protocol.assembly import Message
from protocol.events import Usage

SPEAKS = VoiceConfig(audio_out=AudioOut(to_client=False))
DELEGATE = FunctionTool(name="delegate")


def said(text: str, at: int = 0) -> wire.OutputTranscriptDelta:
    return wire.OutputTranscriptDelta(event_id="e", delta=text, start_ms=at, end_ms=at + 10)


def heard(text: str, at: int = 0) -> wire.InputTranscriptDelta:
    return wire.InputTranscriptDelta(event_id="e", delta=text, start_ms=at, end_ms=at + 10)


def delegated(delegation_id: str = "d1") -> wire.DelegationCreated:
    ref = wire.DelegationRef(id=delegation_id, target="client")
    return wire.DelegationCreated(event_id="e", delegation=ref, offset_ms=0)


def conversation(voice: VoiceConfig | None = SPEAKS, **more: object) -> LiveConversation:
    history = more.pop("history", ())
    return LiveConversation("gpt-live-1.1", "Be brief.", history, voice, **more)  # type: ignore[arg-type]


def test_the_start_names_the_model_format_voice_and_client_delegation() -> None:
    voice = VoiceConfig(audio_out=AudioOut(voice="marin"))
    start = conversation(voice).start()
    encoded = msgspec.json.decode(wire.encode(start))
    assert encoded["type"] == "session.start"
    assert encoded["session"] == {
        "model": "gpt-live-1.1",
        "instructions": "Be brief.",
        "audio": {"format": {"type": "audio/pcm", "rate": 24000}, "output": {"voice": "marin"}},
        "delegation": {"type": "client"},
    }


def test_the_startup_history_keeps_the_newest_messages_within_the_limits() -> None:
    history = [Message(role="user" if n % 2 else "assistant", content=f"m{n}") for n in range(200)]
    history.append(Message(role="system", content="a rule"))
    start = conversation(history=history).start()
    items = start.session.input or []
    assert len(items) == HISTORY_MESSAGES
    assert items[-1].role == "developer" and items[-1].content[0].text == "a rule"
    assert items[-2].content[0] == wire.TextPart(type="input_text", text="m199")
    assert items[-3].content[0] == wire.TextPart(type="output_text", text="m198")


def test_the_startup_history_is_plain_speech_not_the_text_protocol() -> None:
    history = [
        Message(role="user", content="list it"),
        Message(
            role="assistant",
            content='<think>Calling.</think>\n\n<execute>\n[{"name":"list","args":{}}]\n</execute>',
        ),
        Message(role="user", content='<results>\n[{"tool":"list","status":"success"}]\n</results>'),
        Message(role="assistant", content="<think>Done.</think>\n\nIt is empty.\n<end>"),
    ]
    items = conversation(history=history).start().session.input or []
    assert [(i.role, i.content[0].text) for i in items] == [
        ("user", "list it"),
        ("developer", 'Tool results: [{"tool":"list","status":"success"}]'),
        ("assistant", "It is empty."),
    ]


def test_a_typed_message_is_asked_for_aloud_and_its_transcript_is_the_answer() -> None:
    live = conversation()
    live.add_message(Message(role="user", content="hello"))
    assert live.outbox == []  # nothing until the answer is asked for
    live.begin()
    (ask,) = live.outbox
    assert isinstance(ask, wire.CommentaryAppend)
    assert ask.content == TYPED_PREFIX + "hello" and ask.delegation_id is None
    assert b'"delegation_id":null' in wire.encode(ask)  # required, nullable: always sent
    assert live.timer == "answer"
    assert live.handle(said("Hi")) == [Spoken("Hi")]
    assert live.handle(wire.OutputAudioDelta(delta=b"\x00\x01")) == [AudioDelta(b"\x00\x01", 24000)]
    assert live.timer == "quiet"
    assert live.quiet() == [ResponseDone(status="completed", usage=Usage(input=0, output=0))]
    assert live.state == IDLE and live.timer is None


def test_a_long_typed_message_sends_its_head_as_silent_context() -> None:
    live = conversation()
    live.add_message(Message(role="user", content="x" * 4000))
    live.begin()
    *context, ask = live.outbox
    assert context and all(isinstance(e, wire.ThinkingAppend) for e in context)
    assert isinstance(ask, wire.CommentaryAppend) and len(ask.content) <= APPEND_CHARS
    assert all(len(e.content) <= APPEND_CHARS for e in live.outbox)  # type: ignore[union-attr]
    sent = "".join(e.content for e in live.outbox)  # type: ignore[union-attr]
    assert sent.count("x") == 4000


def test_a_turn_asked_for_that_gets_no_word_ends_incomplete() -> None:
    live = conversation()
    live.begin()
    (done,) = live.quiet()
    assert isinstance(done, ResponseDone) and done.status == "incomplete"


def test_the_model_speaking_unasked_after_the_caller_is_a_spoken_turn() -> None:
    live = conversation()
    assert live.handle(heard("(speech", 300)) == [SpeechBegan(300)]
    assert live.handle(heard(" 1.2 s)", 1500)) == []
    events = live.handle(said("Echo", 1600))
    assert events == [
        SpeechEnded(1510),
        Transcript("(speech 1.2 s)"),
        ResponseBegan(),
        Spoken("Echo"),
    ]
    assert live.state == RUNNING


def test_speech_over_the_models_speech_ends_its_turn() -> None:
    live = conversation()
    live.begin()
    live.handle(said("Long answer"))
    events = live.handle(heard("(speech", 900))
    assert events[0] == SpeechBegan(900)
    assert isinstance(events[1], ResponseDone) and events[1].status == "cancelled"
    assert live.state == IDLE


def test_speech_before_the_model_answers_does_not_cancel_the_turn() -> None:
    live = conversation()
    live.begin()
    assert live.handle(heard("wait", 100)) == []
    assert live.state == RUNNING


def test_two_utterances_before_the_answer_are_one_turn_with_their_words_apart() -> None:
    live = conversation()
    for piece, at in (("Call", 0), (" him", 300), ("today.", 1500), (" Then", 1800), ("me", 2200)):
        live.handle(heard(piece, at))
    events = live.handle(said("Sure.", 3000))
    # Pieces of one utterance keep their own spacing; a pause parts the words only
    # where neither side has a space.
    assert events[:2] == [SpeechEnded(2210), Transcript("Call him today. Then me")]


def test_a_client_delegation_calls_the_delegate_tool_once_the_turn_ends() -> None:
    live = conversation(VoiceConfig(audio_out=AudioOut(), tools=(FunctionTool(name="x"), DELEGATE)))
    live.add_message(Message(role="user", content="find my order"))
    live.begin()
    live.outbox.clear()
    assert live.handle(delegated()) == []
    assert live.handle(said("One moment.")) == [Spoken("One moment.")]
    call, done = live.quiet()
    assert call == NativeCall("d1", "delegate", '{"task":"find my order"}')
    assert isinstance(done, ResponseDone) and done.status == "completed"
    live.function_output("d1", "order 7 ships today")
    (answer,) = live.outbox
    assert answer == wire.CommentaryAppend(
        content="order 7 ships today", delegation_id="d1", event_id=answer.event_id
    )
    live.outbox.clear()
    live.begin()
    assert live.outbox == []  # the commentary asks for the speech: nothing more to send
    assert live.state == RUNNING


def test_a_delegation_calls_the_clients_only_tool_beside_the_gateways() -> None:
    gateways = (FunctionTool(name="list_files"), FunctionTool(name="read_file"))
    mine = FunctionTool(name="find_order", client=True)
    live = conversation(VoiceConfig(audio_out=AudioOut(), tools=(*gateways, mine)))
    live.add_message(Message(role="user", content="where is order 7"))
    live.begin()
    live.handle(delegated())
    call, _ = live.quiet()
    assert call == NativeCall("d1", "find_order", '{"task":"where is order 7"}')


def test_a_delegation_task_is_the_callers_spoken_turn() -> None:
    live = conversation(VoiceConfig(audio_out=AudioOut(), tools=(DELEGATE,)))
    live.handle(heard("(speech 1.0 s)"))
    live.handle(delegated())
    call, _ = live.quiet()
    assert call == NativeCall("d1", "delegate", '{"task":"(speech 1.0 s)"}')


def test_a_delegation_with_no_tool_to_run_it_is_answered_silently() -> None:
    tools = (FunctionTool(name="a"), FunctionTool(name="b"))
    live = conversation(VoiceConfig(audio_out=AudioOut(), tools=tools))
    live.begin()
    live.outbox.clear()
    live.handle(delegated())
    (answer,) = live.outbox
    assert isinstance(answer, wire.ThinkingAppend) and answer.delegation_id == "d1"
    (done,) = live.quiet()  # no call
    assert isinstance(done, ResponseDone) and done.status == "completed"


def test_a_cancelled_turn_drops_its_speech_and_its_delegations() -> None:
    live = conversation(VoiceConfig(audio_out=AudioOut(), tools=(DELEGATE,)))
    live.begin()
    live.outbox.clear()
    live.handle(delegated())
    done = live.cancel()
    assert done is not None and done.status == "cancelled"
    assert live.state == STALE
    assert live.handle(said("more words")) == []  # dropped until the model falls quiet
    (told,) = live.outbox
    assert isinstance(told, wire.ThinkingAppend) and told.delegation_id == "d1"
    assert live.quiet() == []
    assert live.state == IDLE
    live.function_output("d1", "late")  # the dropped delegation's output goes nowhere
    assert len(live.outbox) == 1


def test_a_responses_delegations_function_call_runs_as_the_gateways_tool() -> None:
    live = conversation(delegation="responses")
    live.begin()
    live.outbox.clear()
    item = {
        "type": "function_call",
        "call_id": "c1",
        "name": "list",
        "arguments": '{"path":"."}',
    }
    inner = {"type": "response.output_item.done", "item": item}
    event = wire.ResponseEvent(event_id="e", event=inner, delegation_id="d1")
    assert live.handle(event) == []
    assert live.quiet()[0] == NativeCall("c1", "list", '{"path":"."}')
    live.function_output("c1", "[]")
    live.begin()
    created, create = live.outbox
    assert isinstance(created, wire.ResponseItemCreate)
    assert created.item == {"type": "function_call_output", "call_id": "c1", "output": "[]"}
    assert isinstance(create, wire.ResponseCreate)


def test_each_turn_bills_the_seconds_reported_since_the_last() -> None:
    live = conversation()
    live.begin()
    live.handle(said("a"))
    live.handle(wire.SessionUsageUpdated(event_id="e", usage=wire.SessionUsage(seconds=7)))
    (first,) = live.quiet()
    live.begin()
    live.handle(said("b"))
    live.handle(wire.SessionUsageUpdated(event_id="e", usage=wire.SessionUsage(seconds=12)))
    live.handle(wire.SessionUsageUpdated(event_id="e", usage=wire.SessionUsage(seconds=11)))
    (second,) = live.quiet()
    assert isinstance(first, ResponseDone) and isinstance(second, ResponseDone)
    assert first.usage == Usage(input=0, output=0, seconds=7.0)
    assert second.usage == Usage(input=0, output=0, seconds=5.0)  # cumulative, never summed


def test_errors_say_whether_a_retry_helps_and_usage_is_cumulative() -> None:
    live = conversation()
    error = wire.ErrorEvent(
        event_id="e",
        error=wire.ErrorDetail(code="invalid_api_key", message="bad key", type="auth"),
    )
    assert live.handle(error) == [
        UpstreamError(code="invalid_api_key", message="bad key", retryable=False)
    ]
    live.handle(wire.SessionUsageUpdated(event_id="e", usage=wire.SessionUsage(seconds=7)))
    live.handle(wire.SessionUsageUpdated(event_id="e", usage=wire.SessionUsage(seconds=12)))
    assert live.seconds == 12
