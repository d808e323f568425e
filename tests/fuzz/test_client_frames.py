"""Random and adversarial client frames against a live gateway.

Whatever a client sends, the gateway answers with an error event or closes
with a code that says why (1007 invalid UTF-8, 1009 too big), never crashes,
and the session keeps working for the next connection.
"""

from __future__ import annotations

import contextlib
import json
import types
import typing
from typing import Any

import msgspec
import orjson
from hypothesis import HealthCheck, Phase, example, find, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from gateway.edge.server import Gateway
from protocol.client_frames import decode_client
from protocol.configuration import ClientToolSpec
from protocol.events import (
    CLIENT_MESSAGE_TYPES,
    Approve,
    ClientMessage,
    Configure,
    Error,
    ToolResultMessage,
)
from tests.fuzz.conftest import answers_hello, reconnect_answers_hello
from tests.support.client import GatewayClient

FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=50)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
message_types = st.sampled_from(
    ["user", "cancel", "ping", "", "USER", "session", "think"]
) | st.text(max_size=20)


@st.composite
def json_frames(draw: st.DrawFn) -> str:
    """Objects shaped like client messages, with wrong and odd field values."""
    obj: dict[str, Any] = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
    if draw(st.booleans()):
        obj["type"] = draw(message_types | json_values)
    if draw(st.booleans()):
        obj["content"] = draw(st.text(max_size=200) | json_values)
    # The stdlib encoder: big integers, and Infinity (not JSON: a bad frame too).
    return json.dumps(obj, ensure_ascii=draw(st.booleans()))


def nested(depth: int, inside_object: bool) -> str:
    body = "[" * depth + "]" * depth
    return '{"type": "user", "content": "x", "extra": ' + body + "}" if inside_object else body


odd_unicode = st.sampled_from(
    [
        "\u0000",
        "\ufeff",
        "\u202e\u202d",
        "\u2028\u2029",
        "🎉👩‍👩‍👧",
        "\U0010ffff",
        "é" * 1000,
        "\ud7ff\ue000",
        "🚀" * 500,
    ]
)


def _without_unset(hint: Any) -> Any:
    """``hint`` less its ``msgspec.UnsetType`` member (an unset field is left out)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kept = tuple(a for a in typing.get_args(hint) if a is not msgspec.UnsetType)
        return typing.Union[kept] if len(kept) > 1 else kept[0]  # noqa: UP007
    return hint


_ids = st.sampled_from(["call_1", "call_2", ""]) | st.text(max_size=40)
_schemas = st.just({"type": "object"}) | st.dictionaries(
    st.text(max_size=8), json_values, max_size=3
)
_overrides: dict[type, dict[str, st.SearchStrategy[Any]]] = {
    ToolResultMessage: {"id": _ids, "content": json_values},
    Approve: {"id": _ids},
    Configure: {
        # Text out, so that the session's "hello" is still answered in text.
        "output": st.just("text"),
        "tools": st.lists(st.builds(ClientToolSpec, parameters=_schemas), max_size=3).map(tuple),
    },
}


def _message(kind: type) -> st.SearchStrategy[Any]:
    """Instances of one client message Struct, its optional fields set or left out."""
    given = _overrides.get(kind, {})
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in msgspec.structs.fields(kind):
        drawn = (
            given[field.name] if field.name in given else st.from_type(_without_unset(field.type))
        )
        optional = field.default is not msgspec.NODEFAULT or field.default_factory is not (
            msgspec.NODEFAULT
        )
        fields[field.name] = (st.just(field.default) | drawn) if optional else drawn
    return st.builds(kind, **fields)


@st.composite
def _mangled(draw: st.DrawFn, message: Any) -> str:
    """The message as a frame, sometimes with one field replaced by any JSON value."""
    obj: dict[str, Any] = msgspec.to_builtins(message)
    if len(obj) > 1 and draw(st.booleans()):
        obj[draw(st.sampled_from(sorted(k for k in obj if k != "type")))] = draw(json_values)
    return json.dumps(obj)


client_messages = st.one_of(*(_message(kind) for kind in typing.get_args(ClientMessage)))
"""Every kind of client message (``protocol.events.ClientMessage``), from its Struct."""

client_frames = client_messages.flatmap(_mangled)

frames = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300),
    json_frames(),
    client_frames,
    st.builds(nested, st.integers(1, 60_000), st.booleans()),
    odd_unicode.map(lambda s: orjson.dumps({"type": "user", "content": s}).decode()),
    odd_unicode,
)


def _decoded_type(frame: str | bytes) -> str:
    """The ``type`` of the client message ``frame`` decodes to ("" if it is refused)."""
    message = decode_client(frame)
    return "" if isinstance(message, Error) else str(type(message).__struct_config__.tag)


def test_the_frames_include_a_valid_message_of_every_client_type() -> None:
    """Each kind reaches its handler, not only the decoder's refusal."""
    for tag in CLIENT_MESSAGE_TYPES:
        frame = find(
            client_frames,  # one of the frames' kinds
            lambda f, tag=tag: _decoded_type(f) == tag,  # type: ignore[misc]
            settings=settings(max_examples=2_000, database=None, phases=[Phase.generate]),
        )
        assert _decoded_type(frame) == tag


# Close codes a client's own frames may earn: not UTF-8, too big.
EXPECTED_CLOSES = {1007, 1009}


async def survives(gw: Gateway, client: GatewayClient, batch: list[str | bytes]) -> None:
    """Send ``batch``; the session must then answer ``hello`` on this connection or,
    if the server closed it for a reason the frames earned, on a fresh one."""
    try:
        for frame in batch:
            await client.send(frame)
        await answers_hello(client)
        replies = [e for e in client.events if isinstance(e, Error)]
        assert all(e.content for e in replies)  # every error says something
    except ConnectionClosed:
        assert client.ws.close_code in EXPECTED_CLOSES, client.ws.close_code
        client = await reconnect_answers_hello(gw, client)
    await client.close()


@FUZZ
@given(batch=st.lists(frames, min_size=1, max_size=8))
@example(batch=[nested(30_000, True)])  # deep, but under max_frame: an error reply
@example(batch=[nested(30_000, False)])
@example(batch=['{"type": "user", "content": ' + "[" * 20_000 + "]" * 20_000 + "}"])
@example(batch=[nested(100_000, True)])  # over max_frame: 1009
@example(
    batch=[b"\x00" * 300, "", "null", "[]", '{"type": null}', '{"type": "user", "content": 1}']
)
async def test_any_frames_get_answers_and_the_session_keeps_working(
    fuzz_gateway: Gateway, batch: list[str | bytes]
) -> None:
    client = await GatewayClient.connect(fuzz_gateway.url)
    await survives(fuzz_gateway, client, batch)


@FUZZ
@given(
    good=st.text(max_size=40),
    bad=st.binary(min_size=1, max_size=40).filter(lambda b: not _is_utf8(b)),
)
async def test_invalid_utf8_in_a_text_frame_closes_1007_and_the_session_survives(
    fuzz_gateway: Gateway, good: str, bad: bytes
) -> None:
    client = await GatewayClient.connect(fuzz_gateway.url)
    await client.ws.send(good.encode() + bad, text=True)  # a text frame that is not UTF-8
    with contextlib.suppress(ConnectionClosed):
        await client.until(lambda e: False, timeout=10)
    assert client.ws.close_code == 1007
    again = await reconnect_answers_hello(fuzz_gateway, client)
    await again.close()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


async def test_over_max_frame_closes_1009_then_a_fresh_connection_works(
    fuzz_gateway: Gateway,
) -> None:
    limit = fuzz_gateway.config.max_frame
    client = await GatewayClient.connect(fuzz_gateway.url)
    for size in (limit + 1, limit * 4, 16 * limit):
        frame = orjson.dumps({"type": "user", "content": "x" * size}).decode()
        with contextlib.suppress(ConnectionClosed):
            await client.send(frame)
            await client.until(lambda e: False, timeout=10)
        assert client.ws.close_code == 1009
        client = await reconnect_answers_hello(fuzz_gateway, client)
    # Just under the limit is a normal message.
    content = "y" * (limit - 100)
    events = await client.turn(content)
    assert events[0].content == content  # type: ignore[union-attr]
    await client.close()


@settings(FUZZ, max_examples=15)
@given(
    # Up to one burst (client_frame_burst, 200) with the marker and the hello
    # of answers_hello: every frame is answered. Past it the frame-rate limit
    # applies (tests/edge/test_client_limits.py); a gateway that reads the
    # burst faster than the limit refills (50/s) must not fail the example.
    count=st.integers(50, 198),
    kinds=st.lists(
        st.sampled_from(["user", "cancel", "ping", "bad", "binary"]), min_size=1, max_size=5
    ),
)
async def test_floods_of_frames_are_answered_and_the_session_survives(
    fuzz_gateway: Gateway, count: int, kinds: list[str]
) -> None:
    client = await GatewayClient.connect(fuzz_gateway.url)
    frames_by_kind: dict[str, str | bytes] = {
        "user": '{"type": "user", "content": "flood"}',
        "cancel": '{"type": "cancel"}',
        "ping": '{"type": "ping"}',
        "bad": "{not json",
        "binary": b"\x01\x02",
    }
    batch = [frames_by_kind[kinds[i % len(kinds)]] for i in range(count)]
    await survives(fuzz_gateway, client, batch)
