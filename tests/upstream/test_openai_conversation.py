"""OpenAI Realtime's conversation state, without sockets: the current response, its items.

``OpenAIConversation`` decides which server events reach the session, which
are stale, and what a replaced or cancelled response sends; the adapter only
moves frames. Each rule is checked here by feeding it server events as Structs.
"""

from __future__ import annotations

from gateway.upstream import openai_wire as wire
from gateway.upstream.base import (
    AudioIn,
    AudioOut,
    NativeCall,
    ResponseBegan,
    ResponseDone,
    SpeechEnded,
    TextDelta,
    Transcript,
    UpstreamError,
    VoiceConfig,
)
from gateway.upstream.openai_conversation import OpenAIConversation, session_update, usage_of
from protocol.events import Usage

SPOKEN = VoiceConfig(audio_in=AudioIn(rate=24000), audio_out=AudioOut(voice="marin"))


def created(response_id: str) -> wire.ResponseCreated:
    return wire.ResponseCreated(
        event_id="s", response=wire.Response(id=response_id, status="in_progress")
    )


def delta(response_id: str, text: str) -> wire.ResponseOutputTextDelta:
    return wire.ResponseOutputTextDelta(event_id="s", response_id=response_id, delta=text)


def item_added(response_id: str, item_id: str) -> wire.ResponseOutputItemAdded:
    item = wire.Item(type="message", id=item_id)
    return wire.ResponseOutputItemAdded(
        event_id="s", response_id=response_id, output_index=0, item=item
    )


def done(response_id: str, status: str = "completed") -> wire.ResponseDone:
    usage = wire.ResponseUsage(input_tokens=10, output_tokens=4)
    response = wire.Response(id=response_id, status=status, usage=usage)
    return wire.ResponseDone(event_id="s", response=response)


def error(code: str, event_id: str | None = None) -> wire.ErrorEvent:
    detail = wire.ErrorDetail(
        type="invalid_request_error", message=code, code=code, event_id=event_id
    )
    return wire.ErrorEvent(event_id="s", error=detail)


def started(conversation: OpenAIConversation, response_id: str) -> None:
    conversation.create_response()
    assert conversation.handle(created(response_id)) == []


def test_only_the_response_asked_for_reaches_the_session() -> None:
    conversation = OpenAIConversation()
    started(conversation, "r1")
    assert conversation.handle(delta("r1", "Hel")) == [TextDelta("Hel")]
    # A new response asked for: the old one's draining events are stale until it starts.
    request = conversation.create_response()
    assert request.event_id == "gw_2"
    assert conversation.handle(delta("r1", "lo")) == []
    assert conversation.handle(done("r1", "cancelled")) == []
    assert conversation.hot_text(delta("r1", "x")) is None
    assert conversation.handle(created("r2")) == []
    assert conversation.hot_text(delta("r2", "Hi")) == "Hi"
    assert conversation.handle(delta("r2", "Hi")) == [TextDelta("Hi")]
    assert conversation.handle(done("r2")) == [
        ResponseDone(status="completed", usage=Usage(input=10, output=4), detail="")
    ]


def test_a_response_the_server_starts_is_the_sessions_only_with_server_vad() -> None:
    text = OpenAIConversation()
    assert text.handle(created("vad1")) == []
    assert text.handle(delta("vad1", "no")) == []
    spoken = OpenAIConversation(SPOKEN)
    assert spoken.handle(created("vad1")) == [ResponseBegan()]
    assert spoken.handle(delta("vad1", "yes")) == [TextDelta("yes")]


def test_a_refused_create_leaves_the_running_response_current() -> None:
    conversation = OpenAIConversation()
    started(conversation, "r1")
    request = conversation.create_response()
    refusal = conversation.handle(error("conversation_already_has_active_response"))
    assert [type(e) for e in refusal] == [UpstreamError]
    assert conversation.handle(delta("r1", "still")) == [TextDelta("still")]
    # Refused by its event id, with a code a retry will not fix.
    conversation.create_response()
    (failed,) = conversation.handle(error("invalid_api_key", conversation.pending_create))
    assert isinstance(failed, UpstreamError) and not failed.retryable
    assert conversation.pending_create is None and request.event_id == "gw_2"


def test_a_cancel_that_raced_with_the_end_is_harmless() -> None:
    conversation = OpenAIConversation()
    assert conversation.cancel().event_id == "gw_1"
    assert conversation.handle(error("response_cancel_not_active")) == []


def test_replace_deletes_the_items_and_writes_what_the_parser_accepted() -> None:
    conversation = OpenAIConversation()
    started(conversation, "r1")
    conversation.handle(item_added("r1", "i1"))
    conversation.handle(item_added("old", "ignored"))
    conversation.handle(item_added("r1", "i2"))
    sent = conversation.replace("clean answer", heard_ms=1200)  # not spoken: no truncation
    assert [type(e) for e in sent] == [
        wire.ConversationItemDelete,
        wire.ConversationItemDelete,
        wire.ConversationItemCreate,
    ]
    assert [e.item_id for e in sent[:2]] == ["i1", "i2"]  # type: ignore[union-attr]
    create = sent[2]
    assert isinstance(create, wire.ConversationItemCreate)
    assert create.item.role == "assistant" and create.item.content is not None
    assert create.item.content[0].text == "clean answer"
    assert conversation.replace("") == []  # the items were forgotten


def test_a_barge_in_truncates_the_spoken_answer_where_it_was_heard() -> None:
    conversation = OpenAIConversation(SPOKEN)
    started(conversation, "r1")
    conversation.handle(item_added("r1", "i1"))
    conversation.handle(item_added("r1", "i2"))
    sent = conversation.replace("the whole answer", heard_ms=1200)
    assert sent == [
        wire.ConversationItemTruncate(item_id="i1", audio_end_ms=1200),
        wire.ConversationItemDelete(item_id="i2"),
    ]


def test_an_idle_timeout_is_the_users_silent_turn() -> None:
    conversation = OpenAIConversation(SPOKEN)
    event = wire.InputAudioBufferTimeoutTriggered(
        event_id="s", item_id="u1", audio_start_ms=1000, audio_end_ms=7000
    )
    assert conversation.handle(event) == [SpeechEnded(7000), Transcript("(no speech for 6 s)")]


def test_a_native_call_of_the_current_response_only() -> None:
    conversation = OpenAIConversation(SPOKEN)
    started(conversation, "r1")

    def call(response_id: str) -> wire.ResponseFunctionCallArgumentsDone:
        return wire.ResponseFunctionCallArgumentsDone(
            event_id="s",
            response_id=response_id,
            item_id="c",
            output_index=0,
            call_id="call_1",
            name="list",
            arguments="{}",
        )

    assert conversation.handle(call("r0")) == []
    assert conversation.handle(call("r1")) == [NativeCall("call_1", "list", "{}")]


def test_usage_prices_cached_audio_as_cached() -> None:
    reported = wire.ResponseUsage(
        input_tokens=100,
        output_tokens=50,
        input_token_details=wire.InputTokenDetails(
            audio_tokens=60,
            cached_tokens=40,
            cached_tokens_details=wire.CachedTokenDetails(audio_tokens=30),
        ),
        output_token_details=wire.OutputTokenDetails(audio_tokens=45),
    )
    assert usage_of(reported) == Usage(
        input=100, output=50, cached=40, input_audio=30, output_audio=45
    )


def test_the_session_asked_for_is_text_unless_voice_says_otherwise() -> None:
    text = session_update("Be brief.", None, "gpt-4o-mini-transcribe")
    assert text.output_modalities == ["text"] and text.audio is None
    spoken = session_update("Be brief.", SPOKEN, "gpt-4o-mini-transcribe")
    assert spoken.output_modalities == ["audio"]
    assert spoken.audio is not None and spoken.audio.output is not None
    assert spoken.audio.output.voice == "marin"
