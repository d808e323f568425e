"""``response.create``'s per-response overrides on the OpenAI door, without sockets: a
configure before the response and the session's values back after it, hidden from the
client; what one response cannot have is refused by name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.configuration import ClientToolSpec, SessionConfig
from protocol.events import Configure, Configured, End, Metric, Respond, Usage, User, UserMessage
from protocol.openai_conversation import Conversation
from protocol.openai_events import decode_client
from protocol.openai_response import Overrides, response_overrides, restore_of

ROUTE = ("sim", "m")
TOOL = ClientToolSpec(name="old", description="", parameters={"type": "object"})
SESSION = SessionConfig(instructions="house", tools=(TOOL,))


def test_overrides_configure_one_response_and_put_the_sessions_values_back() -> None:
    made = response_overrides({"instructions": "x", "tool_choice": "none"})
    assert isinstance(made, Overrides) and made.change is not None
    assert (made.change.instructions, made.change.tools) == ("x", ())
    back = restore_of(made.change, SESSION)
    assert back == Configure(instructions="house", tools=(TOOL,), id="~restore")
    assert response_overrides({"metadata": {"k": "v"}}) == Overrides(metadata={"k": "v"})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"conversation": "none"}, "response.conversation"),
        ({"input": [{"type": "item_reference", "id": "item_1"}]}, "response.input"),
        ({"max_output_tokens": 10}, "response.max_output_tokens"),
        ({"tool_choice": {"type": "function", "name": "f"}}, "response.tool_choice"),
        ({"metadata": {"k": 1}}, "response.metadata"),
        ({"output_modalities": ["text", "audio"]}, "response"),
    ],
)
def test_what_one_response_cannot_have_is_refused(body: dict[str, Any], param: str) -> None:
    refused = response_overrides(body)
    assert isinstance(refused, tuple) and refused[1] == param


def _client(conv: Conversation, **event: Any) -> list[Any]:
    return conv.client(decode_client(json.dumps(event)), model_route=ROUTE).commands


def test_the_door_hides_its_own_configures_and_restores_when_the_response_is_done() -> None:
    conv = Conversation("s", "m")
    assert [e["type"] for e in conv.gateway(Configured(seq=1, config=SESSION))] == [
        "session.created"
    ]
    _client(
        conv,
        type="conversation.item.create",
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
    )
    change, message = _client(
        conv, type="response.create", event_id="c", response={"instructions": "x"}
    )
    assert (change.instructions, change.id, message) == (
        "x",
        "~override",
        UserMessage("q", id="c", item="item_c_1"),
    )
    hidden = Configured(seq=2, config=SessionConfig(instructions="x"), reply_to="~override")
    assert conv.gateway(hidden) == []
    usage = Usage(input=1, output=1)
    conv.gateway(User(seq=3, content="q"))
    conv.gateway(Respond(seq=4, content="a"))
    assert conv.take_due() == []
    conv.gateway(End(seq=5))
    conv.gateway(Metric(seq=6, step=usage, total=usage))
    assert conv.take_due() == [Configure(instructions="house", id="~restore")]


def test_the_sessions_values_put_back_are_those_it_has_when_the_response_is_done() -> None:
    # A session.update sent just before the response.create is applied first.
    conv = Conversation("s", "m")
    conv.gateway(Configured(seq=1, config=SessionConfig()))
    _client(
        conv,
        type="conversation.item.create",
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
    )
    _client(conv, type="response.create", response={"instructions": "x"})
    conv.gateway(Configured(seq=2, config=SESSION))  # the session.update's, arriving now
    conv.gateway(User(seq=3, content="q"))
    conv.gateway(Respond(seq=4, content="a"))
    conv.gateway(End(seq=5))
    usage = Usage(input=1, output=1)
    conv.gateway(Metric(seq=6, step=usage, total=usage))
    assert conv.take_due() == [Configure(instructions="house", id="~restore")]


def test_a_configure_during_the_response_does_not_keep_its_overrides() -> None:
    # A WebRTC call's microphone configures input audio while the response runs: that
    # configuration carries the override, which still goes back once the response is done.
    conv = Conversation("s", "m")
    conv.gateway(Configured(seq=1, config=SESSION))
    _client(
        conv,
        type="conversation.item.create",
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
    )
    _client(conv, type="response.create", response={"instructions": "x"})
    pirate = SessionConfig(instructions="x", tools=(TOOL,))
    assert conv.gateway(Configured(seq=2, config=pirate, reply_to="~override")) == []
    conv.gateway(User(seq=3, content="q"))
    shown = conv.gateway(Configured(seq=4, config=pirate))  # the microphone's configure
    assert [e["type"] for e in shown] == ["session.updated"]
    conv.gateway(End(seq=5))
    usage = Usage(input=1, output=1)
    conv.gateway(Metric(seq=6, step=usage, total=usage))
    assert conv.take_due() == [Configure(instructions="house", id="~restore")]
