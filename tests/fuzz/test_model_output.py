"""Random model output through a live gateway (the simulator's ``/raw TEXT``).

The model's text is untrusted input too: marker soup, broken ``<execute>``
JSON, odd unicode, markers split across deltas. Whatever it writes, the turn
ends (``end``), the client gets contiguous seqs, nothing escapes as an
unhandled exception, and the session answers ``hello`` next.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.edge.server import Gateway
from protocol.events import End, Error
from tests.fuzz.conftest import answers_hello
from tests.support.client import GatewayClient

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

MARKERS = [
    "<think>",
    "</think>",
    "<execute>",
    "</execute>",
    "<end>",
    "<results>",
    "</results>",
    "<",
    ">",
    "</",
    "<thi",
    "</exec",
    "<end",
    "\n",
    "  ",
]
JSON_BITS = ["[", "]", "{", "}", '"', ",", ":", "\\", '"name"', '"args"', "null", "1e999"]
CALLS = [
    '[{"name": "list", "args": {"path": "."}}]',
    '[{"name": "read", "args": {"path": "nope.txt"}}]',
    '[{"name": "write", "args": {"path": "a.txt", "content": "x"}}]',
    '[{"name": "no_such_tool", "args": {}}]',
    '[{"name": "list"}]',
    '[{"name": 5, "args": []}]',
    "[]",
    "{}",
    '[{"name": "list", "args": {"path": "."}}, {"name": "read", "args": {"path": "../etc/passwd"}}]',
]
UNICODE = ["é", "🎉", "\u2028", "\u202e", "\ufeff", "\x00", "\U0010ffff", "日本語", "👩‍👩‍👧"]

pieces = st.one_of(
    st.sampled_from(MARKERS),
    st.sampled_from(JSON_BITS),
    st.sampled_from(UNICODE),
    st.text(max_size=12),
    st.sampled_from(CALLS).map(lambda c: f"<execute>{c}</execute>"),
    st.sampled_from(CALLS).map(lambda c: f"<execute>\n{c[: len(c) // 2]}"),  # cut off
)
outputs = st.lists(pieces, max_size=30).map("".join)


@st.composite
def execute_blocks(draw: st.DrawFn) -> str:
    """An ``<execute>`` block whose JSON is random, valid or not."""
    value = draw(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.sampled_from(["name", "args", "x"]), inner, max_size=3)
            ),
            max_leaves=10,
        )
    )
    body = json.dumps(value)
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(body)))
        body = body[:cut] + draw(st.sampled_from(JSON_BITS))
    before = draw(st.sampled_from(["", "<think>calling</think>", "Sure. "]))
    after = draw(st.sampled_from(["", "<end>", " trailing text", "</execute>"]))
    return f"{before}<execute>{body}</execute>{after}"


async def run_raw(gw: Gateway, text: str) -> None:
    client = await GatewayClient.connect(gw.url)
    await client.user("/raw " + text)
    turn = await client.until(lambda e: isinstance(e, End), timeout=30)
    seqs = [e.seq for e in turn]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    assert not any(isinstance(e, Error) and e.code == "internal" for e in turn), turn
    await answers_hello(client)
    await client.close()


@FUZZ
@given(text=outputs)
@example(text="<think>unclosed")
@example(text="<execute>" + "[" * 20_000)
@example(text="<execute>" + "[" * 5_000 + "]" * 5_000 + "</execute>")
@example(text='<execute>[{"name": "list", "args": ' + "{" * 3000 + "</execute>")
@example(
    text='<execute>[{"name": "list", "args": {"x": ' + "[" * 1000 + "]" * 1000 + "}}]</execute>"
)
@example(text="</think></execute><end><end>")
@example(text="<execute></execute>" * 4)
async def test_any_model_output_ends_the_turn_and_the_session_goes_on(
    fuzz_gateway: Gateway, text: str
) -> None:
    await run_raw(fuzz_gateway, text)


@FUZZ
@given(text=execute_blocks())
async def test_random_execute_json_is_reported_not_fatal(fuzz_gateway: Gateway, text: str) -> None:
    await run_raw(fuzz_gateway, text)
