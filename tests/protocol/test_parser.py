"""The streaming parser: token-mode text, markers in any chunking, calls, hard stop.

Events are compared after merging consecutive ``Think``/``Respond`` chunks where
only the text matters, and chunk by chunk where the spec says *when* text is
emitted (in the same ``feed`` that delivers it).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    Call,
    End,
    Error,
    Event,
    Execute,
    Parser,
    Respond,
    Think,
    ToolCall,
    decode_call,
    encode_call,
)
from protocol.parser import State

MARKERS = ["<think>", "</think>", "<execute>", "</execute>", "<end>"]
TEXT_MARKERS = ["<think>", "<execute>", "<end>"]


# --- helpers ---------------------------------------------------------------------


def parse(chunks: Iterable[str]) -> list[Event]:
    """Feed every chunk to a fresh parser, then close it; all events in order."""
    parser = Parser()
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.close()
    return events


def merged(events: Sequence[Event]) -> list[tuple[str, str]]:
    """(type, content) pairs with consecutive think/respond chunks joined."""
    out: list[tuple[str, str]] = []
    for event in events:
        kind = type(event).__name__.lower()
        content = getattr(event, "content", "")
        if isinstance(event, Error):
            content = f"{event.code}: {content}"
        if kind in ("think", "respond") and out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + content)
        else:
            out.append((kind, content))
    return out


def every_char(text: str) -> list[str]:
    return list(text)


def call_block(*calls: tuple[str, dict[str, Any]], indent: int | None = None) -> str:
    body = json.dumps([{"name": n, "args": a} for n, a in calls], indent=indent)
    return f"<execute>\n{body}\n</execute>"


def expected_calls(*calls: tuple[str, dict[str, Any]]) -> list[tuple[str, str]]:
    return [("call", encode_call(ToolCall(name=n, args=a))) for n, a in calls] + [("execute", "")]


# --- token mode ------------------------------------------------------------------


def test_respond_text_is_emitted_in_the_feed_that_delivers_it() -> None:
    parser = Parser()
    assert parser.feed("Hel") == [Respond(content="Hel")]
    assert parser.feed("lo, ") == [Respond(content="lo, ")]
    assert parser.feed("world") == [Respond(content="world")]
    assert parser.close() == []


def test_think_text_is_emitted_in_the_feed_that_delivers_it() -> None:
    parser = Parser()
    assert parser.feed("<think>I ") == [Think(content="I ")]
    assert parser.feed("need") == [Think(content="need")]
    assert parser.feed(" to</think>Done") == [Think(content=" to"), Respond(content="Done")]
    assert parser.state is State.TEXT


def test_events_carry_no_seq_or_timestamp() -> None:
    events = parse(["<think>a</think>b", call_block(("t", {}))])
    assert events
    assert all(e.seq == 0 and e.timestamp == 0.0 for e in events)


def test_a_possible_partial_marker_at_the_end_is_held_back() -> None:
    parser = Parser()
    assert parser.feed("abc<thi") == [Respond(content="abc")]
    assert parser.feed("nk>x") == [Think(content="x")]


def test_a_held_back_prefix_that_is_no_marker_becomes_text() -> None:
    parser = Parser()
    assert parser.feed("abc<thi") == [Respond(content="abc")]
    assert parser.feed("s is") == [Respond(content="<this is")]
    assert parser.feed("<") == []
    assert parser.feed(" 3") == [Respond(content="< 3")]


def test_a_held_back_prefix_in_think_becomes_think_text() -> None:
    parser = Parser()
    assert parser.feed("<think>a</th") == [Think(content="a")]
    assert parser.feed("e>") == [Think(content="</the>")]


DOC = (
    "<think>plan: a<b</think>\n\nHi <b>there</b>, 1 < 2 > 0."
    "<think>more</think>Answer: 42<end>ignored <think>"
)
DOC_EVENTS = [
    ("think", "plan: a<b"),
    ("respond", "\n\nHi <b>there</b>, 1 < 2 > 0."),
    ("think", "more"),
    ("respond", "Answer: 42"),
    ("end", ""),
]


def test_document_fed_whole() -> None:
    assert merged(parse([DOC])) == DOC_EVENTS


@pytest.mark.parametrize("cut", range(1, len(DOC)))
def test_markers_split_at_every_position(cut: int) -> None:
    assert merged(parse([DOC[:cut], DOC[cut:]])) == DOC_EVENTS


def test_markers_split_at_every_pair_of_positions() -> None:
    text = "a<think>b</think>c<execute>[]</execute>"
    whole = merged(parse([text]))
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert merged(parse([text[:i], text[i:j], text[j:]])) == whole, (i, j)


def test_one_char_per_delta() -> None:
    assert merged(parse(every_char(DOC))) == DOC_EVENTS


@pytest.mark.parametrize("marker", MARKERS)
def test_every_marker_one_char_per_delta(marker: str) -> None:
    text = f"x{marker}y"
    assert merged(parse(every_char(text))) == merged(parse([text]))


# --- the whitespace rule --------------------------------------------------------


def test_whitespace_between_blocks_is_not_a_response() -> None:
    text = "\n<think>a</think>\n\n" + call_block(("t", {"x": 1}))
    assert merged(parse([text])) == [("think", "a"), *expected_calls(("t", {"x": 1}))]
    assert merged(parse(every_char(text))) == merged(parse([text]))


def test_leading_whitespace_is_sent_with_the_first_text_in_the_same_event() -> None:
    parser = Parser()
    assert parser.feed("<think>a</think>") == [Think(content="a")]
    assert parser.feed("\n") == []
    assert parser.feed(" \t") == []
    assert parser.feed("Hi") == [Respond(content="\n \tHi")]


def test_leading_whitespace_at_the_start_of_the_response_is_held() -> None:
    parser = Parser()
    assert parser.feed("  ") == []
    assert parser.feed(" a") == [Respond(content="   a")]


def test_only_leading_whitespace_is_held() -> None:
    parser = Parser()
    assert parser.feed("a") == [Respond(content="a")]
    assert parser.feed("  ") == [Respond(content="  ")]
    assert parser.feed("\n") == [Respond(content="\n")]


def test_whitespace_before_a_marker_is_dropped() -> None:
    parser = Parser()
    assert parser.feed("  \n") == []
    assert parser.feed("<end>") == [End()]


def test_whitespace_dropped_before_a_think_block_does_not_come_back_after_it() -> None:
    assert parse(["\n ", "<think>a</think>", "b"]) == [Think(content="a"), Respond(content="b")]
    assert parse(["\n <think>a</think>b"]) == [Think(content="a"), Respond(content="b")]


def test_whitespace_only_response_is_dropped_at_close() -> None:
    parser = Parser()
    assert parser.feed("<think>a</think>") == [Think(content="a")]
    assert parser.feed("\n\n") == []
    assert parser.close() == []


def test_whitespace_held_then_unknown_tag_is_text() -> None:
    assert parse(["  ", "<b>", "x"]) == [Respond(content="  <b>"), Respond(content="x")]


def test_whitespace_and_partial_marker_are_flushed_together_at_close() -> None:
    assert parse(["\n", "<thi"]) == [Respond(content="\n<thi")]


def test_think_content_is_verbatim() -> None:
    assert merged(parse(["<think>  a \n</think>"])) == [("think", "  a \n")]
    assert merged(parse(["<think>\n\n</think>b"])) == [("think", "\n\n"), ("respond", "b")]


# --- calls and the execute block -------------------------------------------------


def test_calls_then_execute_in_order() -> None:
    calls = (("read", {"file": "a.txt"}), ("write", {"file": "b", "text": "x", "n": [1, 2]}))
    events = parse(["<think>go</think>", call_block(*calls, indent=2)])
    assert merged(events) == [("think", "go"), *expected_calls(*calls)]
    assert isinstance(events[1], Call)
    assert events[1].content == '{"name":"read","args":{"file":"a.txt"}}'
    assert decode_call(events[2].content) == ToolCall("write", calls[1][1])  # type: ignore[union-attr]


def test_execute_events_come_in_the_feed_with_the_closing_marker() -> None:
    parser = Parser()
    assert parser.feed('<execute>[{"name": "t", "args": {}}]') == []
    assert parser.feed("</exec") == []
    assert parser.feed("ute>") == [Call(content='{"name":"t","args":{}}'), Execute()]


ARG_VALUES = [
    "</execute>",
    "<think>x</think>",
    "<end>",
    'say "hi"',
    "back\\slash",
    "a\\",
    'a\\"</execute>',
    "\\\\</execute>\\",
    "</execute",
    "line\nbreak\t\u00e9\U0001f600",
    "[{]}",
]


@pytest.mark.parametrize("value", ARG_VALUES)
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_tool_args_may_hold_markers_quotes_and_escapes(value: str, ensure_ascii: bool) -> None:
    body = json.dumps(
        [{"name": "write", "args": {"text": value, value: 1}}], ensure_ascii=ensure_ascii
    )
    text = f"<execute>{body}</execute>after"
    expected = expected_calls(("write", {"text": value, value: 1}))
    assert merged(parse([text])) == expected
    assert merged(parse(every_char(text))) == expected


def test_escaped_backslash_before_quote_closes_the_string() -> None:
    # JSON text "a\\" is the string a\ : the quote after the escaped backslash
    # closes it, so the </execute> that follows ends the block (as bad JSON).
    text = r'<execute>[{"name": "t", "args": {"s": "a\\"</execute>"}}]</execute>'
    for chunks in ([text], every_char(text)):
        events = parse(chunks)
        assert len(events) == 1 and isinstance(events[0], Error)
        assert events[0].code == "malformed_execute"


def test_escaped_quote_keeps_the_string_open() -> None:
    # JSON text "a\\\"</execute>" is the string a\"</execute>
    text = r'<execute>[{"name": "t", "args": {"s": "a\\\"</execute>"}}]</execute>'
    expected = expected_calls(("t", {"s": 'a\\"</execute>'}))
    assert merged(parse([text])) == expected
    assert merged(parse(every_char(text))) == expected


def test_unicode_escaped_marker_in_args() -> None:
    text = '<execute>[{"name": "t", "args": {"s": "\\u003c/execute>"}}]</execute>'
    assert merged(parse(every_char(text))) == expected_calls(("t", {"s": "</execute>"}))


MALFORMED = [
    ("[{", "not valid JSON"),
    ('[{"name": "t", "args": {}},]', "not valid JSON"),
    ('{"name": "t", "args": {}}', "an object, not a JSON array"),
    ('"read"', "a string, not a JSON array"),
    ("", "not valid JSON"),
    ("[]", "empty array"),
    ('["read"]', "call 1 of 1 is not a JSON object"),
    ('[{"args": {}}]', 'call 1 of 1 has no string "name"'),
    ('[{"name": 3, "args": {}}]', 'call 1 of 1 has no string "name"'),
    ('[{"name": "t"}]', 'call 1 of 1 ("t") has no "args" object'),
    ('[{"name": "t", "args": [1]}]', 'call 1 of 1 ("t") has no "args" object'),
    ('[{"name": "a", "args": {}}, {"name": "b"}]', 'call 2 of 2 ("b") has no "args" object'),
    ('[{"name": "t", "args": {}}] [1]', "not valid JSON"),
    # 30,000 calls in one block were started in one loop pass (0.5 s) and pushed the
    # turn's own first events out of the log.
    ("[" + ",".join(['{"name": "t", "args": {}}'] * 257) + "]", "257 calls, over 256"),
    ('[{"name": "' + "n" * 900 + '", "args": {}}]', "names a tool of 900 characters"),
    ('[{"name": "t", "args": {"s": "' + "x" * (1 << 20) + '"}}]', "over 1,048,576"),
]


@pytest.mark.parametrize(("body", "problem"), MALFORMED)
def test_malformed_execute_is_one_error_and_no_call(body: str, problem: str) -> None:
    parser = Parser()
    events = parser.feed(f"<execute>{body}</execute>")
    assert len(events) == 1
    error = events[0]
    assert isinstance(error, Error)
    assert error.code == "malformed_execute"
    assert problem in error.content
    assert '{"name": "tool_name", "args": {"arg": "value"}}' in error.content  # what to write
    assert parser.stopped
    assert parser.feed('<execute>[{"name": "t", "args": {}}]</execute>') == []
    assert parser.close() == []


def test_bad_json_error_says_where() -> None:
    events = parse(['<execute>\n[{"name": "t", "args": {}}\n</execute>'])
    assert isinstance(events[0], Error)
    assert "line 3" in events[0].content


# --- hard stop ----------------------------------------------------------------------


def test_hard_stop_after_execute() -> None:
    parser = Parser()
    events = parser.feed('<execute>[{"name": "t", "args": {}}]</execute>Now I will')
    assert merged(events) == expected_calls(("t", {}))
    assert parser.stopped and parser.state is State.STOPPED
    assert parser.feed(" make up results <think>x</think><end>") == []
    assert parser.close() == []
    assert parser.accepted_text == '<execute>[{"name": "t", "args": {}}]</execute>'


def test_hard_stop_after_end() -> None:
    parser = Parser()
    assert parser.feed("Bye<end>\n") == [Respond(content="Bye"), End()]
    assert parser.stopped
    assert parser.feed("more") == []
    assert parser.close() == []
    assert parser.accepted_text == "Bye<end>"


def test_not_stopped_before_a_stop_marker() -> None:
    parser = Parser()
    parser.feed("<think>x</think>hello <execute>[")
    assert not parser.stopped
    parser.close()
    assert not parser.stopped


# --- unknown tags and markers out of place ------------------------------------------


def test_unknown_tags_and_angle_brackets_are_text() -> None:
    text = "<b>bold</b> <results>x</results> </think> a < b > c </execute> <END> <<think"
    assert merged(parse([text])) == [("respond", text)]
    assert merged(parse(every_char(text))) == [("respond", text)]


def test_only_the_closing_marker_counts_inside_think() -> None:
    text = "<think>a <execute>[] <end> <think> </execute> b</think>c"
    expected = [("think", "a <execute>[] <end> <think> </execute> b"), ("respond", "c")]
    assert merged(parse([text])) == expected
    assert merged(parse(every_char(text))) == expected


def test_markers_are_case_sensitive() -> None:
    assert merged(parse(["<THINK>x</THINK><End>"])) == [("respond", "<THINK>x</THINK><End>")]


# --- close() ------------------------------------------------------------------------


def test_close_flushes_a_partial_marker_as_response_text() -> None:
    parser = Parser()
    assert parser.feed("<thi") == []
    assert parser.close() == [Respond(content="<thi")]


def test_close_flushes_a_partial_marker_as_think_text() -> None:
    parser = Parser()
    assert parser.feed("<think>abc</thi") == [Think(content="abc")]
    assert parser.close() == [Think(content="</thi")]


def test_unclosed_think_stays_think_and_close_does_not_end() -> None:
    assert merged(parse(["<think>abc", " def"])) == [("think", "abc def")]


@pytest.mark.parametrize(
    "tail", ['[{"name": "t", "args": {}}]', '[{"name": "t", "args": {"s": "</execute>']
)
def test_close_inside_execute_is_malformed(tail: str) -> None:
    parser = Parser()
    assert parser.feed("<execute>" + tail) == []
    events = parser.close()
    assert len(events) == 1 and isinstance(events[0], Error)
    assert events[0].code == "malformed_execute"
    assert "ended inside an <execute> block" in events[0].content


def test_close_is_idempotent_and_feed_after_close_is_a_bug() -> None:
    parser = Parser()
    parser.feed("<thi")
    assert parser.close() == [Respond(content="<thi")]
    assert parser.close() == []
    assert parser.state is State.CLOSED
    with pytest.raises(RuntimeError, match="new Parser"):
        parser.feed("x")


def test_empty_deltas_are_harmless() -> None:
    parser = Parser()
    assert parser.feed("") == []
    assert parser.feed("a") == [Respond(content="a")]
    assert parser.feed("") == []
    assert parser.feed("<think>") == []
    assert parser.feed("") == []
    assert parser.close() == []


# --- accepted text ----------------------------------------------------------------


def test_accepted_text_is_everything_fed_when_not_stopped() -> None:
    parser = Parser()
    for chunk in ["  <think>a</th", "ink>b <x", "<exe"]:
        parser.feed(chunk)
    assert parser.accepted_text == "  <think>a</think>b <x<exe"
    assert parser.accepted_text == "  <think>a</think>b <x<exe"  # stable on re-read


@pytest.mark.parametrize("cut", range(1, 30))
def test_accepted_text_ends_at_the_stop_marker_in_any_chunking(cut: int) -> None:
    text = 'a<execute>[{"name":"t","args":{}}]</execute>overrun'
    parser = Parser()
    for i in range(0, len(text), cut):
        parser.feed(text[i : i + cut])
    assert parser.accepted_text == text[: text.index("overrun")]


# --- linear work: carried state stays bounded --------------------------------------


@pytest.mark.parametrize(
    ("opening", "filler"),
    [
        ("", "a < b <th"),  # respond text full of "<" and partial markers
        ("<think>", "x </thin"),
        ('<execute>[{"name": "t", "args": {"s": "', 'q \\" </execute'),
        ("<execute>[", "</execut "),  # outside strings too
    ],
)
def test_only_a_partial_marker_is_carried_between_deltas(opening: str, filler: str) -> None:
    """No rescan: what is carried to the next delta never exceeds one marker's length."""
    parser = Parser()
    parser.feed(opening)
    text = filler * 2000
    longest = max(len(m) for m in MARKERS)
    for i in range(0, len(text), 4):
        parser.feed(text[i : i + 4])
        assert len(parser._held) < longest
    assert not parser.stopped


# --- properties ---------------------------------------------------------------------

PROSE = st.sampled_from(
    ["a", " ", "\n", "<", ">", "/", "<b>", "a < b > c", '"', "\\", "[", "{", "}", "]", "é", "🙂"]
)
PIECES = st.one_of(
    st.sampled_from(MARKERS),
    st.sampled_from([m[:k] for m in MARKERS for k in range(1, len(m))]),
    PROSE,
    st.text(max_size=5),
    st.builds(
        lambda v: call_block(("t", {"s": v})),
        st.sampled_from(ARG_VALUES),
    ),
    st.just('<execute>[{"name": "t", "args": {"s": "</execute>"}}]</execute>'),
)
ANY_TEXT = st.lists(PIECES, max_size=25).map("".join)


@st.composite
def chunkings(draw: st.DrawFn, text: str) -> list[str]:
    """``text`` cut at arbitrary positions (empty chunks allowed)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=max(1, len(text)))))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@given(data=st.data(), text=ANY_TEXT)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_chunking_gives_the_events_of_the_whole_text(data: st.DataObject, text: str) -> None:
    chunks = data.draw(chunkings(text))
    whole = Parser()
    expected = whole.feed(text) + whole.close()
    parser = Parser()
    got: list[Event] = []
    for chunk in chunks:
        got += parser.feed(chunk)
        assert len(parser._held) < len("</execute>")  # only a partial marker waits
    got += parser.close()
    assert merged(got) == merged(expected)
    assert parser.stopped == whole.stopped
    accepted = parser.accepted_text
    assert accepted == whole.accepted_text
    if parser.stopped:  # the text up to and including the stop marker
        assert text.startswith(accepted)
        assert accepted.endswith(("</execute>", "<end>"))
    else:
        assert accepted == text


@given(text=ANY_TEXT)
@settings(deadline=None)
def test_one_char_deltas_give_the_events_of_the_whole_text(text: str) -> None:
    assert merged(parse(every_char(text))) == merged(parse([text]))


def _no_text_marker(s: str) -> bool:
    return not any(m in s for m in TEXT_MARKERS)


WHITESPACE = st.text(st.sampled_from(" \n\t\r\u00a0\u2003"), max_size=3)
SEGMENT_TEXT = st.one_of(
    WHITESPACE,
    st.lists(st.one_of(PROSE, WHITESPACE, st.text(max_size=4)), max_size=8).map("".join),
)
RESPOND_SEGMENTS = SEGMENT_TEXT.filter(_no_text_marker)
THINK_SEGMENTS = SEGMENT_TEXT.filter(lambda s: "</think>" not in s)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
CALLS = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=8),
        st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
    ),
    min_size=1,
    max_size=3,
)


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    """A response R0 <think>T1</think> R1 … plus an ending, with the events it must give."""
    parts: list[str] = []
    expected: list[tuple[str, str]] = []

    def respond(segment: str) -> None:
        parts.append(segment)
        if segment and not segment.isspace():  # the whitespace rule
            expected.append(("respond", segment))

    respond(draw(RESPOND_SEGMENTS))
    for _ in range(draw(st.integers(0, 3))):
        think = draw(THINK_SEGMENTS)
        parts.append(f"<think>{think}</think>")
        if think:
            expected.append(("think", think))
        respond(draw(RESPOND_SEGMENTS))
    ending = draw(st.sampled_from(["none", "end", "execute", "open_think"]))
    if ending == "end":
        parts.append("<end>")
        expected.append(("end", ""))
    elif ending == "execute":
        calls = draw(CALLS)
        body = json.dumps(
            [{"name": n, "args": a} for n, a in calls],
            indent=draw(st.sampled_from([None, 2])),
            ensure_ascii=draw(st.booleans()),
        )
        parts.append(f"<execute>{body}</execute>")
        expected.extend(expected_calls(*calls))
    elif ending == "open_think":
        think = draw(THINK_SEGMENTS)
        parts.append(f"<think>{think}")
        if think:
            expected.append(("think", think))
    if ending in ("end", "execute"):
        parts.append(draw(ANY_TEXT))  # the overrun, discarded
    merged_expected = merged([_event(kind, content) for kind, content in expected])
    return "".join(parts), merged_expected


def _event(kind: str, content: str) -> Event:
    if kind == "think":
        return Think(content=content)
    if kind == "respond":
        return Respond(content=content)
    if kind == "call":
        return Call(content=content)
    return Execute() if kind == "execute" else End()


@given(data=st.data(), document=documents())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_think_and_respond_chunks_rebuild_the_document_segments(
    data: st.DataObject, document: tuple[str, list[tuple[str, str]]]
) -> None:
    text, expected = document
    chunks = data.draw(chunkings(text))
    assert merged(parse(chunks)) == expected


def test_msgspec_round_trip_of_parser_events() -> None:
    """Parser events are wire events: they encode and decode unchanged."""
    from protocol import decode_event, encode

    for event in parse([DOC]) + parse([call_block(("t", {"a": "</execute>"}))]):
        assert decode_event(encode(event)) == event
    assert msgspec.json.decode(encode(End())) == {"type": "end", "seq": 0, "timestamp": 0.0}


@pytest.mark.parametrize("depth", [100, 1000, 5000])
def test_arguments_nested_absurdly_deep_are_a_malformed_block_not_a_crash(depth: int) -> None:
    """A model's runaway ``[[[[…`` is answered like any bad block (issue 13.8)."""
    nested = "[" * depth + "]" * depth
    out = Parser().feed(f'<execute>[{{"name": "read", "args": {{"x": {nested}}}}}]</execute>')
    (error,) = out
    assert isinstance(error, Error) and error.code == "malformed_execute"
    assert "no tool was run" in error.content
