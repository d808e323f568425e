"""A recording read into a replay's plan: each user action at its anchor (no sockets)."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest

from gateway.client.replay_plan import MAX_NOTES, Anchor, PlanError, plan_replay
from protocol.recording import (
    ClientAudio,
    ClientCommand,
    Header,
    Logged,
    Record,
    encode_record,
    read_records,
)


def event(t: float, seq: int, **fields: Any) -> Logged:
    return Logged(t=t, event=msgspec.Raw(msgspec.json.encode({**fields, "seq": seq})))


def command(t: float, seq: int, **message: Any) -> ClientCommand:
    return ClientCommand(t=t, seq=seq, message=msgspec.Raw(msgspec.json.encode(message)))


def recording(*records: Record) -> bytes:
    head = Header(t=0.0, session_id="s1", node="n1", provider="sim", model="sim")
    return b"".join(encode_record(r) for r in (head, *records))


METRIC = {"type": "metric", "step": {"input": 1, "output": 1}, "total": {"input": 1, "output": 1}}
CALL = {"type": "call", "content": '{"name": "confirm", "args": {}}', "id": "call_7"}


def a_session() -> bytes:
    """Hello; a turn with a client call answered, cancelled mid-answer; spoken audio."""
    return recording(
        command(1.0, 0, type="user", content="hello"),
        event(1.01, 1, type="user", content="hello"),
        event(1.02, 2, type="respond", content="Echo: hello"),
        event(1.03, 3, type="end"),
        event(1.03, 4, **METRIC),
        command(3.0, 4, type="user", content="/long 9"),
        event(3.01, 5, type="user", content="/long 9"),
        event(3.02, 6, **CALL, runs_on="client"),
        command(3.5, 6, type="tool_result", id="call_7", status="success", content=True),
        event(3.6, 7, type="respond", content="Here"),
        command(3.65, 7, type="cancel"),
        event(3.7, 8, type="cancelled"),
        event(3.7, 9, **METRIC),
        ClientAudio(t=5.0, id=1, seq=9, rate=16000, pcm=b"\x00\x01" * 160),
        ClientAudio(t=5.01, id=2, seq=9, rate=16000, pcm=b"\x00\x02" * 160),
        ClientAudio(t=9.0, id=3, seq=9, rate=16000, pcm=b"\x00\x03" * 160),
    )


def test_each_action_is_anchored_where_the_recorded_session_was() -> None:
    plan = plan_replay(a_session())
    kinds = [(a.kind, a.anchor, round(a.delay, 2)) for a in plan.actions]
    assert kinds == [
        ("user", Anchor(0, 0, True), 1.0),  # before any turn
        ("user", Anchor(1, 4, True), 1.97),  # after turn 1 closed
        ("tool_result", Anchor(2, 0, False), 0.48),  # the call's place, as long after it
        ("cancel", Anchor(2, 3, False), 0.05),  # after the same words
        ("audio", Anchor(2, 5, True), 1.3),  # one run, then another after a gap
        ("audio", Anchor(2, 5, True), 5.3),
    ]
    answer = plan.actions[2]
    assert answer.call == (2, 0) and answer.message is not None
    assert [len(a.audio.chunks) for a in plan.actions if a.audio is not None] == [2, 1]


def test_a_fork_keeps_what_the_user_did_before_its_seq() -> None:
    plan = plan_replay(a_session(), fork_at=4)
    assert [a.kind for a in plan.actions] == ["user"]
    assert max(e.seq for _, e in plan.events) == 4


def test_a_file_that_is_not_a_recording_says_how_to_get_one() -> None:
    with pytest.raises(PlanError, match="gateway recording get"):
        plan_replay(b'{"type": "user"}\n')


def test_lines_are_read_one_by_one_and_a_bad_one_is_reported_not_raised() -> None:
    head = encode_record(Header(t=0.0, session_id="s1", node="n1", provider="sim", model="sim"))
    data = head.replace(b"\n", b"\r\n") + b"\n  \n" + b"[" * 10_000 + b"\n" + b'{"kind":"cut"}'
    found = list(read_records(data))
    assert isinstance(found[0], Header)
    assert found[1:] == [
        "line 4: not a recording record (Expected `object`, got `array`)",
        "line 5: not a recording record (Object missing required field `limit`)",
    ]


def test_events_that_are_not_events_are_noted_up_to_a_bound() -> None:
    junk = [Logged(t=1.0, event=msgspec.Raw(b'{"type":"nonsense","seq":1}'))] * 100
    plan = plan_replay(
        recording(
            *junk,
            command(1.0, 0, type="user", content="hello"),
            event(1.01, 1, type="user", content="hello"),
        )
    )
    assert len(plan.problems) == MAX_NOTES + 1
    assert plan.problems[-1] == f"{100 - MAX_NOTES} more problems like these"
    assert [a.kind for a in plan.actions] == ["user"]


@pytest.mark.parametrize(
    ("fork_at", "says"),
    [(0, "fork at seq 0"), (10, "fork at seq 10: the recording's events are seq 1 to 9")],
)
def test_a_fork_outside_the_events_is_refused(fork_at: int, says: str) -> None:
    with pytest.raises(PlanError, match=re.escape(says)):
        plan_replay(a_session(), fork_at=fork_at)


def test_a_spoken_turn_whose_audio_was_not_kept_is_not_waited_for() -> None:
    head = Header(t=0.0, session_id="s1", node="n1", provider="sim", model="sim", audio="none")
    data = b"".join(
        encode_record(r)
        for r in (
            head,
            command(1.0, 0, type="user", content="hello"),
            event(1.01, 1, type="user", content="hello"),
            event(1.03, 2, type="end"),
            event(1.03, 3, **METRIC),
            event(2.0, 4, type="user", content="spoken words", source="audio"),
            event(2.1, 5, type="end"),
            event(2.1, 6, **METRIC),
        )
    )
    plan = plan_replay(data)
    assert plan.turns == 1  # the replay waits for the typed turn only
    assert any("kept no audio" in p for p in plan.problems)
    assert plan_replay(a_session()).turns == 2


def test_a_reply_turn_counts_as_a_turn_and_anchors_what_follows() -> None:
    """A ``reply`` (a turn with no new message: an agent speaking first) starts a turn
    as a ``user`` does; counted without it, a replay waited for one turn too few and
    anchored the next message to the turn before."""
    plan = plan_replay(
        recording(
            command(1.0, 0, type="reply", id="r1"),
            event(1.01, 1, type="reply", reply_to="r1"),
            event(1.02, 2, type="respond", content="Hello! How can I help?"),
            event(1.03, 3, type="end"),
            event(1.03, 4, **METRIC),
            command(2.0, 4, type="user", content="hello"),
            event(2.01, 5, type="user", content="hello"),
            event(2.02, 6, type="respond", content="Echo: hello"),
            event(2.03, 7, type="end"),
            event(2.03, 8, **METRIC),
        )
    )
    assert plan.turns == 2
    assert [(a.kind, a.anchor) for a in plan.actions] == [
        ("reply", Anchor(0, 0, True)),
        ("user", Anchor(1, 4, True)),  # after the reply's turn closed
    ]
