"""``forget``, without sockets: what it takes out of the model's context (``assemble``),
what it refuses (``forgetting``), and how history items get the seqs it names by
(``StepRecorder``)."""

from __future__ import annotations

from protocol.assembly import Message, assemble, forgetting
from protocol.events import (
    Call,
    Error,
    Forget,
    Forgotten,
    Respond,
    Result,
    ResultPayload,
    Think,
    User,
)
from protocol.steps import StepRecorder

HISTORY = [
    User(seq=1, content="apples"),
    Think(seq=2, content="fruit"),
    Respond(seq=3, content="Echo: apples"),
    User(seq=6, content="pears"),
    Respond(seq=7, content="Echo: pears"),
]


def test_a_forgotten_user_message_is_left_out_and_the_answer_before_it_still_ended() -> None:
    messages = assemble([*HISTORY, Forgotten(seq=9, first=6, last=6)])
    assert messages == [
        Message("user", "apples"),
        Message("assistant", "<think>fruit</think>\n\nEcho: apples\n<end>"),
        Message("assistant", "Echo: pears"),
    ]


def test_a_forgotten_answer_takes_its_thoughts_but_not_the_calls() -> None:
    assert assemble([*HISTORY, Forgotten(seq=9, first=3, last=5)])[:2] == [
        Message("user", "apples"),
        Message("user", "pears"),
    ]
    payload = ResultPayload(tools_executed=1, success_count=1, failure_count=0)
    with_call = [
        User(seq=1, content="go"),
        Respond(seq=2, content="Looking."),
        Call(seq=3, content='{"name": "f", "args": {}}', id="call_1", runs_on="client"),
        Result(seq=5, content="[]", payload=payload, id="call_1"),
        Forgotten(seq=9, first=2, last=2),
    ]
    assert assemble(with_call)[1].content.startswith("<execute>")


def test_forgetting_refuses_during_a_turn_and_what_the_model_does_not_hold() -> None:
    assert forgetting(HISTORY, Forget(first=6, last=6), idle=True) == Forgotten(first=6, last=6)
    busy = forgetting(HISTORY, Forget(first=6, last=6), idle=False)
    assert isinstance(busy, Error) and busy.code == "turn_active"
    done = [*HISTORY, Forgotten(seq=9, first=6, last=6)]
    again = forgetting(done, Forget(first=6, last=6), idle=True)
    assert isinstance(again, Error) and again.code == "unknown_item"
    nothing = forgetting(HISTORY, Forget(first=2, last=2), idle=True)  # a thought alone
    assert isinstance(nothing, Error) and nothing.code == "unknown_item"


def test_step_items_carry_their_first_events_seq_once_logged() -> None:
    recorder = StepRecorder()
    first, second = Respond(content="Hel"), Respond(content="lo")
    recorder.chunk(first)
    recorder.chunk(second)
    persist = recorder.persist()
    assert persist.firsts == (first,)  # not logged yet: the log stamps it when it stores it
    first.seq = 12  # logged
    recorder.chunk(Think(seq=14, content="hm"))
    recorder.add(Respond(seq=15, content="ok"))
    items = recorder.finish()
    assert [(type(i).__name__, i.seq) for i in items] == [("Think", 14), ("Respond", 15)]
