"""Client frame decoding and event encoding: the gateway's public wire."""

from __future__ import annotations

import orjson
import pytest

from protocol.client_frames import decode_client
from protocol.events import (
    Cancel,
    Error,
    Metric,
    Ping,
    Result,
    ResultPayload,
    Session,
    Think,
    Usage,
    UserMessage,
    decode_event,
    encode,
)


def test_encode_uses_the_seed_schema_plus_seq() -> None:
    frame = orjson.loads(encode(Think(content="I need", seq=3, timestamp=1.5)))
    assert frame == {"type": "think", "content": "I need", "seq": 3, "timestamp": 1.5}


def test_result_and_metric_carry_payload_and_usage() -> None:
    result = Result(
        content='[{"tool":"read","status":"success","content":"x"}]',
        payload=ResultPayload(tools_executed=1, success_count=1, failure_count=0),
    )
    frame = orjson.loads(encode(result))
    assert frame["payload"] == {"tools_executed": 1, "success_count": 1, "failure_count": 0}
    metric = orjson.loads(encode(Metric(step=Usage(50, 30), total=Usage(100, 50))))
    assert metric["step"] == {"input": 50, "output": 30}
    assert metric["total"] == {"input": 100, "output": 50}


def test_events_round_trip_through_the_decoder() -> None:
    for event in (
        Session(session_id="abc", seq=4, resumed=True),
        Error(code="turn_active", content="wait"),
        Think(content="x", seq=9, timestamp=2.0),
    ):
        assert decode_event(encode(event)) == event


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ('{"type": "user", "content": "hi"}', UserMessage(content="hi")),
        ('{"type": "cancel"}', Cancel()),
        ('{"type": "ping"}', Ping()),
        (b'{"type": "user", "content": "\\u00e9t\\u00e9", "extra": 1}', UserMessage(content="été")),
    ],
)
def test_valid_client_frames_decode(frame: str | bytes, expected: object) -> None:
    assert decode_client(frame) == expected


@pytest.mark.parametrize(
    ("frame", "code", "says"),
    [
        ("not json", "bad_frame", "not a JSON object"),
        ("[1, 2]", "bad_frame", "not a JSON object"),
        ('"user"', "bad_frame", "not a JSON object"),
        ("{}", "bad_frame", 'no string "type"'),
        ('{"type": 5}', "bad_frame", 'no string "type"'),
        ('{"type": "launch"}', "unknown_type", "unknown message type 'launch'"),
        ('{"type": "user"}', "bad_frame", "content"),
        ('{"type": "user", "content": 5}', "bad_frame", "content"),
        ("\xff\xfe", "bad_frame", "not a JSON object"),
        ("[" * 100_000, "bad_frame", "not a JSON object"),
    ],
)
def test_bad_client_frames_become_error_events(frame: str, code: str, says: str) -> None:
    result = decode_client(frame)
    assert isinstance(result, Error)
    assert result.code == code
    assert says in result.content
    # Every error tells the client what a good frame looks like.
    assert '{"type": "user", "content": "<text>"}' in result.content


def test_unknown_type_names_are_shortened_in_errors() -> None:
    result = decode_client('{"type": "' + "x" * 10_000 + '"}')
    assert isinstance(result, Error)
    assert len(result.content) < 400
