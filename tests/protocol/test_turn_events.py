"""The turn machine's vocabulary: every input has a handler, every list derives from its union."""

from __future__ import annotations

import typing

import orjson

from protocol.client_frames import decode_client
from protocol.events import CLIENT_MESSAGE_TYPES, ClientMessage, Error
from protocol.turn_events import ACTION_TYPES, EVENT_TYPES, INPUT_TYPES, Action, TurnInput
from protocol.turn_table import ROWS


def test_feed_has_a_handler_for_every_input_and_no_other() -> None:
    assert {row.input for row in ROWS} == INPUT_TYPES == set(typing.get_args(TurnInput))


def test_actions_split_into_events_and_what_the_shell_performs() -> None:
    assert set(typing.get_args(Action)) == EVENT_TYPES | ACTION_TYPES
    assert not EVENT_TYPES & ACTION_TYPES


def test_every_client_message_type_decodes_and_no_other_is_listed() -> None:
    tags = {kind.__struct_config__.tag for kind in typing.get_args(ClientMessage)}
    assert set(CLIENT_MESSAGE_TYPES) == tags
    for tag in CLIENT_MESSAGE_TYPES:
        # A listed type is known to the decoder: never refused as an unknown type.
        answer = decode_client(orjson.dumps({"type": tag, "zzz": [1]}))
        assert not (isinstance(answer, Error) and answer.code == "unknown_type"), tag
