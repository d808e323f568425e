"""Gemini Live's conversation state, without sockets: setup, transcript, resumption, turns.

``GeminiConversation`` decides what a connection opens with, what a request
sends, which events a server message means and when a new connection must
be made; the adapter only moves frames. Each rule is checked here by
feeding it server messages as Structs.
"""

from __future__ import annotations

from gateway.upstream import gemini_wire as wire
from gateway.upstream.base import (
    AudioOut,
    FunctionTool,
    NativeCall,
    ResponseDone,
    Resumable,
    Spoken,
    TextDelta,
    Thought,
    VoiceConfig,
)
from gateway.upstream.gemini_conversation import IDLE, Compression, GeminiConversation
from gateway.upstream.providers import facts
from protocol.assembly import Message

HISTORY = [Message(role="user", content="hi"), Message(role="assistant", content="hello")]


def model_says(*parts: wire.Part, done: bool = False) -> wire.ServerMessage:
    content = wire.ServerContent(
        model_turn=wire.Content(parts=list(parts), role="model") if parts else None,
        turn_complete=True if done else None,
    )
    return wire.ServerMessage(server_content=content)


def handle(token: str) -> wire.ServerMessage:
    update = wire.SessionResumptionUpdate(new_handle=token, resumable=True)
    return wire.ServerMessage(session_resumption_update=update)


def sent_turns(message: wire.ClientMessage) -> list[str]:
    content = message.client_content
    assert content is not None and content.turn_complete
    return [part.text or "" for turn in content.turns or () for part in turn.parts]


def test_a_text_session_asks_for_text_and_resumption_handles() -> None:
    conversation = GeminiConversation("Be brief.", HISTORY, model=facts("gemini", "sim"))
    setup = conversation.setup("models/sim")
    assert setup.generation_config is not None
    assert setup.generation_config.response_modalities == ["TEXT"]
    assert setup.generation_config.thinking_config is None  # the model does not think
    assert setup.session_resumption == wire.SessionResumptionConfig()
    assert setup.context_window_compression is None


def test_a_spoken_answer_asks_for_audio_its_transcript_thoughts_and_native_tools() -> None:
    voice = VoiceConfig(
        audio_out=AudioOut(to_client=False),
        tools=(FunctionTool(name="list", parameters={"type": "object"}),),
    )
    conversation = GeminiConversation(
        "",
        [],
        voice,
        model=facts("gemini", "gemini-3.8-live-extended-thinking"),
        compression=Compression(trigger_tokens=50_000),
    )
    setup = conversation.setup("models/gemini-3.8-live-extended-thinking")
    assert setup.generation_config is not None
    assert setup.generation_config.response_modalities == ["AUDIO"]
    assert setup.generation_config.thinking_config == wire.ThinkingConfig(include_thoughts=True)
    assert setup.output_audio_transcription == {}
    assert setup.tools is not None and setup.tools[0].function_declarations is not None
    assert setup.context_window_compression == wire.ContextWindowCompression(
        trigger_tokens=50_000, sliding_window=wire.SlidingWindow()
    )


def test_thoughts_and_transcript_are_the_turns_think_and_answer() -> None:
    voice = VoiceConfig(audio_out=AudioOut(to_client=False))
    conversation = GeminiConversation("", [], voice, model=facts("gemini", "gemini-3.8-live"))
    conversation.add_message(Message(role="user", content="hi"))
    conversation.request()
    thought = conversation.handle(model_says(wire.Part(text="Hm.", thought=True)))
    spoken = conversation.handle(
        wire.ServerMessage(
            server_content=wire.ServerContent(output_transcription=wire.Transcription(text="Yes."))
        )
    )
    assert thought == [Thought("Hm.")]
    assert spoken == [Spoken("Yes.")]


def test_a_request_sends_only_the_turns_the_server_lacks() -> None:
    conversation = GeminiConversation("", HISTORY)
    conversation.connected(resumed=False)
    assert sent_turns(conversation.request()) == ["hi", "hello"]
    done = conversation.handle(model_says(wire.Part(text="ok"), done=True))
    assert isinstance(done[-1], ResponseDone) and done[-1].status == "completed"
    assert conversation.state == IDLE
    conversation.add_message(Message(role="user", content="again"))
    assert sent_turns(conversation.request()) == ["again"]


def test_a_handle_is_kept_with_the_position_of_the_last_turn_end() -> None:
    conversation = GeminiConversation("", [])
    conversation.connected(resumed=False)
    conversation.add_message(Message(role="user", content="hi"))
    conversation.request()
    conversation.handle(model_says(wire.Part(text="Echo: hi")))
    conversation.handle(model_says(done=True))
    # The server holds the user's turn and the reply: position 2.
    assert conversation.handle(handle("h1")) == [Resumable("h1", 2)]
    # A handle read late, after the next request went out, still names position 2.
    conversation.add_message(Message(role="user", content="again"))
    conversation.request()
    assert conversation.handle(handle("h2")) == [Resumable("h2", 2)]
    # Resuming it: the server holds 2 turns, so the next request sends the rest.
    conversation.handle(model_says(done=True))
    conversation.go_away = "10s"
    assert conversation.reconnect_reason() is not None and conversation.resumable
    conversation.connected(resumed=True)
    conversation.add_message(Message(role="user", content="third"))
    assert sent_turns(conversation.request()) == ["again", "third"]


def test_a_server_copy_that_differs_is_never_resumed() -> None:
    conversation = GeminiConversation("", [])
    conversation.connected(resumed=False)
    conversation.add_message(Message(role="user", content="hi"))
    conversation.request()
    conversation.handle(model_says(wire.Part(text="abc"), done=True))
    conversation.handle(handle("h1"))
    conversation.replace("ab")  # the session's history says otherwise: the copy differs
    assert conversation.dirty and not conversation.resumable
    conversation.connected(resumed=False)
    assert conversation.resume_handle == ""  # the new copy is another session
    conversation.add_message(Message(role="user", content="next"))
    assert sent_turns(conversation.request()) == ["hi", "ab", "next"]


def test_resuming_from_another_node_sends_only_what_was_logged_after_the_handle() -> None:
    history = [*HISTORY, Message(role="user", content="new")]
    conversation = GeminiConversation("", history, resume="h", pending=1)
    conversation.connected(resumed=True)
    assert sent_turns(conversation.request()) == ["new"]
    # If the server refuses the handle, the adapter connects afresh: all of it is sent.
    fresh = GeminiConversation("", history, resume="h", pending=1)
    fresh.connected(resumed=False)
    assert sent_turns(fresh.request()) == ["hi", "hello", "new"]


def test_native_calls_end_the_turn_and_their_outputs_are_the_next_request() -> None:
    voice = VoiceConfig(audio_out=AudioOut(), tools=(FunctionTool(name="list"),))
    conversation = GeminiConversation("", [], voice)
    conversation.add_message(Message(role="user", content="list"))
    conversation.request()
    call = wire.FunctionCall(id="c1", name="list", args={"path": "."})
    events = conversation.handle(wire.ServerMessage(tool_call=wire.ToolCall(function_calls=[call])))
    assert events[0] == NativeCall("c1", "list", '{"path":"."}')
    assert isinstance(events[1], ResponseDone)
    conversation.function_output("c1", '{"ok": true}')
    request = conversation.request()
    assert request.tool_response is not None
    assert request.tool_response.function_responses == [
        wire.FunctionResponse(id="c1", name="list", response={"output": '{"ok": true}'})
    ]


def test_text_of_a_turn_is_a_delta() -> None:
    conversation = GeminiConversation("", [])
    conversation.request()
    assert conversation.handle(model_says(wire.Part(text="a"))) == [TextDelta("a")]
