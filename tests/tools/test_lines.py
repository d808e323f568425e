"""The line framer and the overlong-answer reader of MCP's stdio transport, without sockets."""

from __future__ import annotations

import json
import time

import pytest

from tools.providers.lines import (
    KEPT,
    Line,
    LineFramer,
    Overlong,
    OverlongEnd,
    overlong_answer,
    overlong_kind,
)

pytestmark = pytest.mark.timeout(30)


def test_lines_are_split_across_chunks_and_blank_lines_skipped() -> None:
    framer = LineFramer(1024)
    assert framer.feed(b'{"a":1}\n{"b"') == [Line(b'{"a":1}')]
    assert framer.feed(b":2}\n\n  \r\n") == [Line(b'{"b":2}')]
    assert framer.feed(b'{"c":3}\r\n') == [Line(b'{"c":3}\r')]  # JSON ignores the \r


def test_a_line_of_exactly_the_limit_is_whole_and_one_byte_more_is_overlong() -> None:
    framer = LineFramer(KEPT)
    assert framer.feed(b"x" * KEPT + b"\n") == [Line(b"x" * KEPT)]
    frames = framer.feed(b"y" * (KEPT + 1) + b"\nnext\n")
    assert frames == [
        Overlong(b"y" * KEPT),
        OverlongEnd(b"y" * KEPT, b"y" * KEPT, KEPT + 1),
        Line(b"next"),
    ]


def test_an_overlong_line_keeps_its_two_ends_only() -> None:
    framer = LineFramer(1024)
    head = b'{"jsonrpc":"2.0","id":7,"result":"'
    frames = framer.feed(head + b"a" * 500)
    assert frames == []
    frames = framer.feed(b"b" * 2000)
    assert len(frames) == 1 and isinstance(frames[0], Overlong)
    assert frames[0].head.startswith(head) and len(frames[0].head) == KEPT
    for _ in range(10):
        assert framer.feed(b"c" * 1000) == []
    frames = framer.feed(b'c"}\n{"ok":1}\n')
    end = frames[0]
    assert isinstance(end, OverlongEnd)
    assert end.tail.endswith(b'c"}') and len(end.tail) == KEPT
    assert end.size == len(head) + 500 + 2000 + 10_000 + 3
    assert frames[1:] == [Line(b'{"ok":1}')]


def test_a_100mb_line_costs_one_pass_and_no_buffer() -> None:
    framer = LineFramer(1024 * 1024)
    chunk = b"x" * 65536
    started = time.process_time()
    frames = []
    for _ in range(100 * 1024 * 1024 // len(chunk)):
        frames += framer.feed(chunk)
    frames += framer.feed(b"\n")
    spent = time.process_time() - started
    print(f"\n100 MiB line framed in {spent * 1000:.0f} ms of CPU")
    assert [type(f) for f in frames] == [Overlong, OverlongEnd]
    assert spent < 2.0  # linear: ~0.1 s; the SDK's reader is quadratic here


PENDING = {3, 7, "abc"}


@pytest.mark.parametrize(
    ("head", "tail", "expected"),
    [
        # The Python SDK: id before result.
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"xx', None, 7),
        (b'{"jsonrpc": "2.0", "id": "abc", "error": {"code": 1, "message": "xx', None, "abc"),
        # The TypeScript SDK: id last, found in the tail.
        (b'{"result":{"content":[{"text":"xx', b'xx"}]},"jsonrpc":"2.0","id":3}', 3),
        (b'{"result":{"content":[{"text":"xx', b'xx"}]}, "jsonrpc": "2.0", "id": 3 }\r', 3),
        # An id nobody waits for, or one inside the result, names nothing.
        (b'{"jsonrpc":"2.0","id":99,"result":{"x":"xx', None, None),
        (b'{"result":{"items":[{"id":7,"text":"xx', b'xx", "id": 7}}', None),
        # Requests and notifications from the server are no answers.
        (b'{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{"x', None, None),
        (b'{"method":"notifications/message","params":{"data":"xx', b'xx"},"id":3}', None),
        # Not JSON at all.
        (b"Traceback (most recent call last): xx", b"xx", None),
    ],
)
def test_which_request_an_overlong_line_answers(
    head: bytes, tail: bytes | None, expected: int | str | None
) -> None:
    assert overlong_answer(head, tail, PENDING) == expected


def test_the_kind_of_an_overlong_line_is_read_from_its_start() -> None:
    assert overlong_kind(b'{"jsonrpc":"2.0","result":{"x') == "answer"
    assert overlong_kind(b'{"jsonrpc":"2.0","id":1,"error":{"x') == "answer"
    assert overlong_kind(b'{"jsonrpc":"2.0","method":"notifications/progress","params"') == (
        "message"
    )
    assert overlong_kind(b'{"params":{"x') == "message"
    assert overlong_kind(b"[1,2,3") == "unknown"
    assert overlong_kind(json.dumps({"jsonrpc": "2.0"}).encode()) == "unknown"
