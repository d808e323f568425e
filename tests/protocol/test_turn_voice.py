"""The turn machine's voice transitions, without sockets."""

from __future__ import annotations

from collections.abc import Sequence

from protocol.calls import ToolResult
from protocol.events import Call, Cancelled, End, Execute, Metric, Respond, SpeechStarted, User
from protocol.turn import (
    TurnMachine,
    TurnState,
)
from protocol.turn_events import (
    Action,
    AddNote,
    Cancel,
    Commit,
    CommitAudio,
    DropUpstream,
    GuardrailCut,
    NativeCall,
    Opened,
    Persist,
    Played,
    Refuse,
    ReplaceResponse,
    Request,
    ResponseDone,
    RunTools,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    StopResponse,
    ToolsDone,
    Transcript,
    UserMessage,
)


def kinds(actions: Sequence[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def voice_machine() -> TurnMachine:
    machine = TurnMachine()
    machine.voice = True
    return machine


def test_speech_end_starts_a_turn_whose_output_waits_for_the_transcript() -> None:
    machine = voice_machine()
    assert kinds(machine.feed(SpeechBegan(300))) == ["SpeechStarted"]
    assert kinds(machine.feed(SpeechEnded(1500))) == ["SpeechStopped", "TurnStarted"]
    assert machine.state is TurnState.STREAMING
    assert machine.text("<think>hm</think>") == ()  # held until the user event
    out = machine.feed(Transcript("hello"))
    assert isinstance(out[0], User) and out[0].source == "audio" and out[0].content == "hello"
    assert isinstance(out[1], Persist)
    assert [type(a) for a in out[2:]] == [type(a) for a in out[2:] if not isinstance(a, User)]
    done = machine.feed(ResponseDone("completed"))
    assert "End" in kinds(done) and machine.idle


def test_a_missing_transcript_still_gives_a_user_event_before_the_answer() -> None:
    machine = voice_machine()
    machine.feed(SpeechEnded(100))
    machine.feed(Spoken("Hi"))
    out = machine.feed(ResponseDone("completed"))
    assert kinds(out)[:3] == ["User", "Persist", "Respond"]


def test_speech_during_an_answer_barges_in_and_truncates() -> None:
    machine = voice_machine()
    machine.feed(UserMessage(content="talk"))
    assert [type(e) for e in machine.feed(Spoken("Once upon"))] == [Respond]
    out = machine.feed(SpeechBegan(4000))
    assert isinstance(out[0], SpeechStarted)
    cancelled = [a for a in out if isinstance(a, Cancelled)]
    assert cancelled and cancelled[0].reason == "barge_in"
    assert not any(isinstance(a, StopResponse) for a in out)  # the provider stops by itself
    assert machine.feed(Spoken(" a time")) == ()
    closing = machine.feed(ResponseDone("cancelled"))
    assert any(isinstance(a, Metric) for a in closing)
    assert ReplaceResponse("Once upon") in closing
    assert not any(isinstance(a, DropUpstream) for a in closing)


def test_speech_ending_while_a_cancelled_turn_closes_is_answered_after_it() -> None:
    machine = voice_machine()
    machine.feed(UserMessage(content="talk"))
    machine.feed(SpeechBegan(10))
    assert kinds(machine.feed(SpeechEnded(900))) == ["SpeechStopped"]
    out = machine.feed(ResponseDone("cancelled"))
    assert kinds(out)[-1] == "TurnStarted"
    assert machine.state is TurnState.STREAMING


def test_a_client_cancel_in_voice_keeps_the_connection() -> None:
    machine = voice_machine()
    machine.feed(UserMessage(content="talk"))
    machine.text("Hello")
    out = machine.feed(Cancel())
    assert StopResponse() in out
    closing = machine.feed(ResponseDone("cancelled"))
    assert not any(isinstance(a, DropUpstream) for a in closing)
    assert any(isinstance(a, ReplaceResponse) for a in closing)


def test_commit_starts_a_turn_and_asks_the_provider() -> None:
    machine = voice_machine()
    out = machine.feed(Commit())
    assert kinds(out) == ["TurnStarted", "CommitAudio"] and isinstance(out[-1], CommitAudio)
    again = machine.feed(Commit())
    assert isinstance(again[0], Refuse)


def test_native_calls_run_the_tools_and_answer_with_function_outputs() -> None:
    machine = voice_machine()
    machine.feed(UserMessage(content="weather?"))
    [call] = machine.feed(NativeCall("c1", "weather", '{"city": "Oslo"}'))
    assert isinstance(call, Call) and call.content == '{"name":"weather","args":{"city":"Oslo"}}'
    out = machine.feed(ResponseDone("completed"))
    assert [type(a) for a in out][:1] == [Execute]
    run = out[-1]
    assert isinstance(run, RunTools) and run.calls[0].name == "weather"
    after = machine.feed(ToolsDone((ToolResult("weather", "success", "sunny"),)))
    request = after[-1]
    assert isinstance(request, Request) and request.message is None
    assert request.outputs == (("c1", '{"tool":"weather","status":"success","content":"sunny"}'),)
    machine.feed(Spoken("It is sunny."))
    assert any(isinstance(a, End) for a in machine.feed(ResponseDone("completed")))
    assert machine.idle


def test_bad_native_arguments_become_an_empty_object() -> None:
    machine = voice_machine()
    machine.feed(UserMessage(content="x"))
    [call] = machine.feed(NativeCall("c1", "list", "{not json"))
    assert isinstance(call, Call) and call.content == '{"name":"list","args":{}}'


def finished_spoken_answer(sent_ms: float, played_ms: int | None) -> TurnMachine:
    """A voice machine whose spoken answer is complete (the turn over), ``sent_ms`` of its
    audio sent to the clients, the newest playback report at ``played_ms``."""
    machine = voice_machine()
    machine.feed(UserMessage(content="talk"))
    machine.feed(Spoken("Once upon a time"))
    machine.audio_sent(sent_ms)
    assert "End" in kinds(machine.feed(ResponseDone("completed"))) and machine.idle
    if played_ms is not None:
        machine.feed(Played(seq=1, ms=played_ms))
    return machine


def test_speech_over_a_finished_answer_still_playing_cuts_it_where_the_listener_was() -> None:
    machine = finished_spoken_answer(2400.0, 300)
    out = machine.feed(SpeechBegan(5000))
    assert out[0] == SpeechStarted(offset_ms=5000, heard_ms=300)
    [persist] = [a for a in out if isinstance(a, Persist)]
    [note] = persist.items
    assert isinstance(note, Cancelled) and (note.reason, note.heard_ms) == ("barge_in", 300)
    assert ReplaceResponse("Once upon a time", heard_ms=300) in out
    assert machine.idle  # no turn to close: the answer's own end and metric are out already
    # The answer is cut once: more speech over the silence cuts nothing.
    assert machine.feed(SpeechBegan(6000)) == [SpeechStarted(offset_ms=6000)]


def test_a_new_connection_holding_a_playing_answer_whole_is_told_what_was_heard() -> None:
    """A connection opened after the answer (a configure between turns) was given it whole
    from history: no replacement there (it would hold the answer twice); it is told
    how much the user heard, in the words history tells the next connection."""
    machine = finished_spoken_answer(2400.0, 300)
    machine.feed(Opened(machine.setup, audio_ms=4000))
    out = machine.feed(SpeechBegan(500))
    assert out[0] == SpeechStarted(offset_ms=4500, heard_ms=300)
    assert not [a for a in out if isinstance(a, ReplaceResponse)]
    [note] = [a for a in out if isinstance(a, AddNote)]
    assert note.content.startswith(
        "(The user spoke over your previous response after hearing 0.3 s"
    )


def test_speech_after_a_finished_answer_was_heard_in_full_cuts_nothing() -> None:
    for played in (2400, 2350):  # the end, or within the slack of a resampler's tail
        machine = finished_spoken_answer(2400.0, played)
        assert machine.feed(SpeechBegan(5000)) == [SpeechStarted(offset_ms=5000)]
    # A client that never reports playback: nothing says it is still playing.
    machine = finished_spoken_answer(2400.0, None)
    assert machine.feed(SpeechBegan(5000)) == [SpeechStarted(offset_ms=5000)]
    # The next turn starts a new answer: the old one's audio no longer counts.
    machine = finished_spoken_answer(2400.0, 300)
    machine.feed(UserMessage(content="again"))
    machine.feed(Played(seq=2, ms=0))
    machine.feed(ResponseDone("completed"))
    assert machine.feed(SpeechBegan(9000)) == [SpeechStarted(offset_ms=9000)]


def test_a_guardrail_cut_cancels_the_spoken_answer_and_keeps_the_audio_heard() -> None:
    machine = voice_machine()
    machine.feed(UserMessage(content="card?"))
    machine.feed(Spoken("Your card is 4242"))
    out = machine.feed(GuardrailCut(720))
    [cancelled] = [a for a in out if isinstance(a, Cancelled)]
    assert cancelled.content == "stopped by a guardrail"
    assert StopResponse() in out and machine.state is TurnState.CANCELLING
    closing = machine.feed(ResponseDone("cancelled"))
    [replace] = [a for a in closing if isinstance(a, ReplaceResponse)]
    assert replace.heard_ms == 720  # the provider keeps what was heard
    assert machine.idle


def test_a_guardrail_cut_of_a_complete_response_stops_nothing() -> None:
    machine = voice_machine()
    machine.feed(UserMessage(content="card?"))
    machine.feed(Spoken("It is 4242"))
    assert StopResponse() not in machine.feed(GuardrailCut(300, done=True))
    closing = machine.feed(ResponseDone("completed"))
    assert ReplaceResponse("It is 4242", heard_ms=300) in closing
    assert machine.feed(GuardrailCut(10)) == ()  # no answer streams: nothing to cut


def test_a_context_sent_while_a_spoken_answer_waits_for_its_transcript_comes_after_it() -> None:
    # The answer ended (<end>) before the user's transcript came: it and its end are held,
    # so a message added now waits too; history keeps the user, the answer, the message.
    from protocol.events import Context
    from protocol.turn_events import AddMessage, ContextMessage

    machine = voice_machine()
    machine.feed(SpeechEnded(1500))
    assert machine.text("Hi.<end>") == ()
    assert machine.state is TurnState.ENDING
    assert machine.feed(ContextMessage(role="system", content="Now French.")) == ()
    out = list(machine.feed(Transcript("hello"))) + list(machine.feed(ResponseDone("completed")))
    persisted = [item for a in out if isinstance(a, Persist) for item in a.items]
    assert [type(i).__name__ for i in persisted] == ["User", "Respond", "Context"]
    assert persisted[-1] == Context(role="system", content="Now French.")
    assert kinds(out).index("End") < kinds(out).index("Context")
    assert any(isinstance(a, AddMessage) for a in out)
