"""The OpenAI Realtime wire Structs: what we send, and how the adapter decodes."""

from __future__ import annotations

import json

import msgspec
import pytest

from gateway.upstream import openai_wire as wire


def test_client_events_omit_unset_fields() -> None:
    update = wire.SessionUpdate(
        session=wire.Session(type="realtime", instructions="i", output_modalities=["text"])
    )
    assert json.loads(wire.encode(update)) == {
        "type": "session.update",
        "session": {"type": "realtime", "instructions": "i", "output_modalities": ["text"]},
    }
    create = wire.ConversationItemCreate(
        item=wire.Item(
            type="message",
            role="assistant",
            content=[wire.ContentPart(type="output_text", text="a")],
        ),
        event_id="gw_1",
    )
    assert json.loads(wire.encode(create)) == {
        "type": "conversation.item.create",
        "event_id": "gw_1",
        "item": {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "a"}],
        },
    }
    assert json.loads(wire.encode(wire.ResponseCreate())) == {"type": "response.create"}
    assert json.loads(wire.encode(wire.ResponseCancel())) == {"type": "response.cancel"}
    assert json.loads(wire.encode(wire.ConversationItemDelete(item_id="x"))) == {
        "type": "conversation.item.delete",
        "item_id": "x",
    }


def test_client_events_round_trip() -> None:
    events: list[wire.ClientEvent] = [
        wire.SessionUpdate(session=wire.Session(type="realtime", instructions="x")),
        wire.ConversationItemCreate(
            item=wire.Item(type="message", role="user", content=[]), previous_item_id="root"
        ),
        wire.ConversationItemDelete(item_id="i", event_id="e"),
        wire.ResponseCreate(response=wire.ResponseParams(instructions="y")),
        wire.ResponseCancel(response_id="r"),
    ]
    for event in events:
        assert wire.decode_client_event(wire.encode(event)) == event


def test_server_events_carry_every_field() -> None:
    delta = wire.ResponseOutputTextDelta(event_id="e", response_id="r", item_id="i", delta="d")
    assert json.loads(wire.encode(delta)) == {
        "type": "response.output_text.delta",
        "event_id": "e",
        "response_id": "r",
        "delta": "d",
        "item_id": "i",
        "output_index": 0,
        "content_index": 0,
    }
    assert wire.decode_server_event(wire.encode(delta)) == delta


def test_decode_upstream_hot_path_and_skips() -> None:
    delta = b'{"type":"response.output_text.delta","event_id":"e","response_id":"r","delta":"hi"}'
    event = wire.decode_upstream(delta)
    assert isinstance(event, wire.ResponseOutputTextDelta)
    assert (event.response_id, event.delta) == ("r", "hi")
    # Types the adapter does not act on are skipped, whatever their shape.
    assert wire.decode_upstream(b'{"type": "conversation.item.added", "item": 3}') is None
    assert wire.decode_upstream(b'{"event_id": "e", "type": "brand.new.event"}') is None


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type": "response.output_text.delta", "event_id": "e"}',  # known, but broken
        b'{"no_type": 1}',
        b'{"type": 5}',
        b"[1]",
    ],
)
def test_decode_upstream_rejects_broken_frames(frame: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        wire.decode_upstream(frame)


def test_decode_upstream_rejects_non_json() -> None:
    with pytest.raises(msgspec.DecodeError):
        wire.decode_upstream(b"nope")


def test_response_done_decodes_other_item_types() -> None:
    frame = {
        "type": "response.done",
        "event_id": "e",
        "response": {
            "id": "r",
            "status": "failed",
            "status_details": {"type": "failed", "error": {"type": "server_error", "message": "m"}},
            "output": [{"type": "function_call", "id": "fc", "name": "f", "arguments": "{}"}],
            "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
        },
    }
    event = wire.decode_upstream(json.dumps(frame))
    assert isinstance(event, wire.ResponseDone)
    assert event.response.output[0].id == "fc"
    assert event.response.output[0].content is None
    assert event.response.usage == wire.ResponseUsage(
        total_tokens=5, input_tokens=3, output_tokens=2
    )


def test_event_type() -> None:
    assert wire.event_type(b'{"type": "x"}') == "x"
    assert wire.event_type(b'{"type": 1}') == ""
    assert wire.event_type(b"[]") == ""
