"""``CallSocket`` without a network: what the edge reads of a client's socket, answered
from a data channel (a fake one here, with aiortc's attributes)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from gateway import wsfast
from gateway.webrtc.channel import HIGH_WATER, CallSocket

pytestmark = pytest.mark.timeout(10)


class FakeChannel:
    label = "oai-events"

    def __init__(self) -> None:
        self.readyState = "open"
        self.bufferedAmount = 0
        self.bufferedAmountLowThreshold = 0
        self.sent: list[str] = []
        self.handlers: dict[str, Any] = {}

    def on(self, event: str, handler: Any) -> None:
        self.handlers[event] = handler

    def send(self, data: str) -> None:
        self.sent.append(data)

    def close(self) -> None:
        self.readyState = "closed"


def _opened(max_frame: int = 1000) -> tuple[CallSocket, FakeChannel]:
    call = CallSocket("rtc_test", max_frame, ("127.0.0.1", 8765))
    channel = FakeChannel()
    call._channel(channel)
    return call, channel


async def test_messages_in_order_then_the_end_and_oversized_ones_answered() -> None:
    call, channel = _opened(max_frame=10)
    channel.handlers["message"]('{"a": 1}')
    channel.handlers["message"](b'{"b": 2}')  # a binary message is read as text
    channel.handlers["message"]("x" * 11)  # over max_frame: answered, not read
    channel.handlers["close"]()
    assert [m async for m in call] == ['{"a": 1}', '{"b": 2}']
    assert json.loads(channel.sent[0])["error"]["code"] == "message_too_big"
    with pytest.raises(ConnectionClosed):
        await call.recv()
    assert call.state is State.CLOSED and call.transport.is_closing()


async def test_writes_wait_past_the_high_water_mark_as_a_websocket_does() -> None:
    call, channel = _opened()
    assert wsfast.can_write_now(call)  # type: ignore[arg-type]
    call.send_now([b'{"type": "x"}'])
    assert channel.sent == ['{"type": "x"}']  # a text message, as OpenAI's clients read
    channel.bufferedAmount = HIGH_WATER
    assert call.paused and not wsfast.can_write_now(call)  # type: ignore[arg-type]
    assert call.transport.get_write_buffer_size() == HIGH_WATER  # the reaper's view
    assert call.transport.get_extra_info("sockname") == ("127.0.0.1", 8765)


async def test_a_close_says_why_on_the_channel_then_ends() -> None:
    call, channel = _opened()
    await call.close(1012, "reconnect with session_id and after_event")
    error = json.loads(channel.sent[-1])["error"]
    assert error["code"] == "session_closed_1012"
    assert error["message"] == "reconnect with session_id and after_event"
    await call.wait_closed()
    assert await call.joined == ""  # never served: the offer's answer says so
