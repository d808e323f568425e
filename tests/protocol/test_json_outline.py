"""``protocol.json_outline``: a large frame's arrays counted before the typed decode."""

from __future__ import annotations

import msgspec
import pytest

from protocol.client_frames import decode_client
from protocol.events import Error
from protocol.json_outline import LARGE_FRAME, MAX_VALUES, too_many_values
from protocol.openai_events import BadEvent
from protocol.openai_events import decode_client as decode_door_event


def _frame(value: object) -> bytes:
    return msgspec.json.encode(value)


@pytest.mark.parametrize(
    ("value", "where", "count"),
    [
        ({"type": "configure", "tools": [{"name": "a"}] * 60_000}, "tools", 60_000),
        ({"type": "configure", "server_tools": ["list"] * 70_000}, "server_tools", 70_000),
        (
            {"type": "conversation.item.create", "item": {"content": [{"text": "a"}] * 30_000}},
            "item.content",
            30_000,
        ),
        (
            {"type": "response.create", "response": {"input": [{}] * 40_000}},
            "response.input",
            40_000,
        ),
    ],
)
def test_an_array_past_the_limit_is_named_with_its_count(
    value: object, where: str, count: int
) -> None:
    problem = too_many_values(_frame(value), "id")
    assert problem is not None
    assert (
        problem[0].startswith(f"{where} holds {count:,} values") and f"{MAX_VALUES:,}" in problem[0]
    )


def test_what_is_within_the_limit_or_small_or_not_an_object_is_left_to_the_decode() -> None:
    at_limit = {"type": "configure", "tools": [{"name": "a" * 60}] * MAX_VALUES}
    assert len(_frame(at_limit)) >= LARGE_FRAME
    assert too_many_values(_frame(at_limit), "id") is None
    small = {"type": "configure", "server_tools": ["a"] * 5_000}
    assert len(_frame(small)) < LARGE_FRAME
    assert too_many_values(_frame(small), "id") is None  # the typed decode's own limit answers
    assert too_many_values(b"[1]" * LARGE_FRAME, "id") is None  # not JSON: the decode says why
    text = {"type": "user", "content": "a, [b], {c}, " * 10_000}  # brackets in a string
    assert too_many_values(_frame(text), "id") is None
    deep = {"a": {"b": {"c": [0] * 50_000}}}  # past the two levels looked at
    assert too_many_values(_frame(deep), "id") is None


def test_both_doors_refuse_such_a_frame_saying_what_to_send() -> None:
    crowded = {"type": "configure", "id": "c1", "tools": [{"name": "a"}] * 60_000}
    native = decode_client(_frame(crowded))
    assert isinstance(native, Error) and native.code == "bad_frame" and native.reply_to == "c1"
    assert "tools holds 60,000 values" in native.content and "send fewer" in native.content
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]}
    item["content"] = item["content"] * 30_000  # type: ignore[operator]
    create = {"type": "conversation.item.create", "event_id": "e1", "item": item}
    door = decode_door_event(_frame(create))
    assert isinstance(door, BadEvent) and "item.content holds 30,000 values" in door.message
    assert door.event_id == "e1"
