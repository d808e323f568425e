"""A session's guardrails at its log (``gateway.sessions.guard``), without sockets:
events in, the events to log out; history judged whole; a spoken answer's audio."""

from __future__ import annotations

import msgspec

from gateway.metrics import Metrics
from gateway.sessions.guard import EventGuard, guard_result
from gateway.sessions.guardrail_rules import guardrails_of
from protocol.events import (
    Call,
    Cancelled,
    End,
    Event,
    Guardrail,
    Respond,
    Result,
    ResultPayload,
    Think,
)
from protocol.guardrails import RuleSpec

CARD = "4111 1111 1111 1111"
RULES = [
    RuleSpec(name="no-cards", on="output", action="redact", detect="card"),
    RuleSpec(name="stop", on="output", action="end_turn", pattern="STOP"),
    RuleSpec(name="secret", on="input", action="block", pattern="s3cret"),
]


def make_guard() -> tuple[EventGuard, list[str], Metrics]:
    compiled = guardrails_of(RULES)
    assert not isinstance(compiled, str)
    ended: list[str] = []
    metrics = Metrics()
    return EventGuard(compiled, metrics, lambda: ended.append("end")), ended, metrics


def run(guard: EventGuard, events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        out += guard.filter(event)
    return out


def chunks(text: str, size: int = 4) -> list[Event]:
    return [Respond(content=text[i : i + size]) for i in range(0, len(text), size)]


def test_a_card_in_chunks_is_redacted_and_the_rest_flushed_before_the_end() -> None:
    guard, ended, metrics = make_guard()
    out = run(guard, [Think(content="hmm"), *chunks(f"Card {CARD}. Bye 42"), End()])
    said = "".join(e.content for e in out if isinstance(e, Respond))
    assert said == "Card [redacted]. Bye 42"
    assert [type(e).__name__ for e in out][-1] == "End"
    trips = [e for e in out if isinstance(e, Guardrail)]
    assert [(t.rule, t.action, t.on) for t in trips] == [("no-cards", "redact", "output")]
    assert metrics.guardrails.trips.labels("no-cards", "redact", "output")._value.get() == 1
    assert not ended


def test_a_card_or_a_pattern_split_around_a_think_block_is_still_caught() -> None:
    """Each block of text was judged alone: the answer's halves around a <think> block
    reached the client as one card (a model steered to write it so, by an injection)."""
    guard, _, _ = make_guard()
    split = [
        Respond(content="Card: 4111 1111 "),
        Think(content="hmm"),
        Respond(content="1111 1111 end"),
        End(),
    ]
    out = run(guard, split)
    said = "".join(e.content for e in out if isinstance(e, Respond))
    assert said == "Card: [redacted] end", said
    assert "".join(e.content for e in out if isinstance(e, Think)) == "hmm"
    guard, ended, _ = make_guard()
    out = run(guard, [Respond(content="ok ST"), Think(content="x"), Respond(content="OP more")])
    assert "".join(e.content for e in out if isinstance(e, Respond)) == "ok "
    assert ended == ["end"]


def test_end_turn_withholds_the_rest_of_the_turn_and_asks_once() -> None:
    guard, ended, _ = make_guard()
    out = run(guard, [*chunks("ok then STOP and more"), Call(content='{"name":"x","args":{}}')])
    assert "".join(e.content for e in out if isinstance(e, Respond)) == "ok then "
    assert not any(isinstance(e, Call) for e in out)
    assert ended == ["end"]
    after = run(guard, [End(), Respond(content="next turn")])
    assert [type(e) for e in after] == [End, Respond]


def test_call_args_and_results_are_judged_and_history_matches() -> None:
    guard, _, _ = make_guard()
    [call, trip] = guard.filter(Call(content=f'{{"name":"pay","args":{{"card":"{CARD}"}}}}'))
    assert isinstance(call, Call) and CARD not in call.content and "[redacted]" in call.content
    assert isinstance(trip, Guardrail)
    result = Result(
        content='[{"tool":"read","status":"success","content":"the s3cret"}]',
        payload=ResultPayload(1, 1, 0),
    )
    [judged, trip] = guard.filter(result)
    assert isinstance(judged, Result) and "s3cret" not in judged.content
    assert isinstance(trip, Guardrail) and trip.on == "input"
    [item] = guard.history([Respond(content=f"it is {CARD}!")])
    assert isinstance(item, Respond) and item.content == "it is [redacted]!"


def test_a_tool_result_is_shown_as_the_output_rules_leave_it() -> None:
    # Found from outside: a card the model wrote into a file (redacted in its call) came
    # back whole in the read's result, to every client and into the export.
    guard, ended, _ = make_guard()
    result = Result(
        content=f'[{{"tool":"read","status":"success","content":"card {CARD}, ok"}}]',
        payload=ResultPayload(1, 1, 0),
    )
    [judged, *trips] = guard.filter(result)
    assert isinstance(judged, Result)
    assert CARD not in judged.content and "card [redacted], ok" in judged.content
    assert '"status":"success"' in judged.content
    assert [(t.rule, t.on) for t in trips if isinstance(t, Guardrail)] == [("no-cards", "output")]
    assert not ended  # shown redacted: the turn goes on
    [item] = guard.history([result])
    assert isinstance(item, Result) and CARD not in item.content


def test_a_tool_result_a_block_rule_withheld_is_logged_as_the_failure_the_model_got() -> None:
    """Found from outside: the model got a failure naming the rule, while the clients and
    the export were shown a success whose text had lost its match ("note: [blocked]")."""
    guard, _, _ = make_guard()
    results = (
        f'[{{"tool":"read","status":"success","content":"card {CARD}, the s3cret"}},'
        '{"tool":"ls","status":"success","content":"a.txt"}]'
    )
    [judged, *trips] = guard.filter(Result(content=results, payload=ResultPayload(2, 2, 0)))
    assert isinstance(judged, Result)
    read, listed = msgspec.json.decode(judged.content)
    assert read["status"] == "failure" and "'secret'" in read["content"]
    assert CARD not in judged.content and "s3cret" not in judged.content
    assert listed == {"tool": "ls", "status": "success", "content": "a.txt"}
    assert judged.payload == ResultPayload(2, 1, 1)  # counted as the failure it is
    assert [(t.rule, t.on) for t in trips if isinstance(t, Guardrail)] == [("secret", "input")]


def test_a_blocked_tool_result_is_a_failure_naming_the_rule() -> None:
    compiled = guardrails_of(RULES)
    assert not isinstance(compiled, str)
    content, hits, withheld = guard_result(compiled.input, {"text": "the s3cret is x"})
    assert withheld and "secret" in content and "s3cret" not in content
    assert [h.rule for h in hits] == ["secret"]


def test_an_event_in_the_middle_of_an_answer_does_not_split_a_card() -> None:
    guard, _, _ = make_guard()
    background = Result(content="[]", payload=ResultPayload(1, 1, 0))
    out = run(guard, [*chunks("Card 4111 11"), background, *chunks("11 1111 1111."), End()])
    said = "".join(e.content for e in out if isinstance(e, Respond))
    assert said == "Card [redacted]."


def test_a_block_on_a_spoken_answer_ends_the_turn() -> None:
    compiled = guardrails_of(
        [RuleSpec(name="rude", on="output", action="block", pattern="(?i)idiot")]
    )
    assert not isinstance(compiled, str)
    ended: list[str] = []
    guard = EventGuard(compiled, Metrics(), lambda: ended.append("end"))
    run(guard, chunks("you idiot, fine"))
    assert not ended  # text: the rest of the block is withheld, the turn goes on
    guard = EventGuard(compiled, Metrics(), lambda: ended.append("end"))
    guard.speaks = True
    out = run(guard, chunks("you idiot, fine"))
    assert guard.take_cut() == 0  # speech: cut there (no audio went out), the turn ends
    assert not ended and guard.take_cut() is None
    assert "".join(e.content for e in out if isinstance(e, Respond)) == "you "


def spoken_guard() -> tuple[EventGuard, list[str], list[bytes]]:
    compiled = guardrails_of(RULES[:1])  # cards only (a pattern would hold every chunk)
    assert not isinstance(compiled, str)
    ended: list[str] = []
    guard = EventGuard(compiled, Metrics(), lambda: ended.append("end"))
    sent: list[bytes] = []
    guard.send_audio = sent.append
    guard.speaks = True
    return guard, ended, sent


def test_a_spoken_answers_audio_waits_for_its_transcript_and_is_cut_with_it() -> None:
    guard, ended, sent = spoken_guard()
    assert guard.gates_audio
    guard.hold_audio(b"a" * 480)  # "Card": its audio comes first, as OpenAI sends it
    assert sent == []
    run(guard, [Respond(content="Card")])
    assert sent == [b"a" * 480]  # its transcript was judged and sent
    guard.hold_audio(b"b" * 480)  # " 411": spoken while the number is undecided
    out = run(guard, [Respond(content=" 411")])
    assert sent == [b"a" * 480]
    guard.hold_audio(b"c" * 480)
    out += run(guard, [*chunks("1 1111 1111 1111, and more")])
    guard.hold_audio(b"d" * 480)  # after the cut: never sent
    assert sent == [b"a" * 480]
    assert guard.released_ms == 10.0  # 480 bytes of 24 kHz PCM16
    assert "".join(e.content for e in out if isinstance(e, Respond)) == " [redacted]"
    # A spoken answer stops where a rule trips, even a redaction: the machine is told
    # (by the reader) how much of its audio the listener got.
    assert guard.cut_ms == 10 and not ended
    [item] = guard.history([Respond(content=f"Card {CARD}, and more")])
    assert isinstance(item, Respond) and item.content == "Card [redacted]"
    assert guard.answer(f"Card {CARD}, and more") == "Card [redacted]"


def test_a_clean_spoken_answers_last_audio_goes_at_its_end_and_a_cancel_drops_it() -> None:
    guard, ended, sent = spoken_guard()
    run(guard, [Respond(content="Call 55")])  # digits held: maybe a number
    guard.hold_audio(b"x" * 48)
    run(guard, [End()])
    assert sent == [b"x" * 48] and not ended
    guard.hold_audio(b"y" * 48)
    run(guard, [Respond(content="Dial 9"), Cancelled(content="cancelled by the user")])
    guard.hold_audio(b"z" * 48)  # the next answer's
    run(guard, [Respond(content="there")])
    assert sent == [b"x" * 48, b"z" * 48]  # what waited when the answer stopped is not played


def test_a_spoken_answers_tail_is_judged_when_the_response_is_done() -> None:
    guard, _, sent = spoken_guard()
    guard.hold_audio(b"a" * 48)
    run(guard, [Respond(content="It is"), Respond(content=f" {CARD}")])
    assert sent == [b"a" * 48] and guard.cut_ms is None  # the number may go on
    guard.hold_audio(b"b" * 48)
    out = guard.answer_done()  # the response is complete: its end is judged now
    assert [type(e) for e in out] == [Respond, Guardrail]
    assert guard.cut_ms == 1 and sent == [b"a" * 48]
    assert run(guard, [End()]) == [End()] and guard.cut_ms is None
