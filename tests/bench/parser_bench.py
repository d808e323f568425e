"""Benchmark of protocol.Parser: per-token cost and linearity.

Run: ``.venv/bin/python tests/bench/parser_bench.py [--quick]``

The gateway does two things per model token: one msgspec decode of the
provider's frame and one ``Parser.feed``. So the parser's hot path (a ~4-char
delta of response or reasoning text with no ``<``) is measured against one
decode of an OpenAI ``response.output_text.delta`` frame, in the same run on the
same machine; the target is a ratio of at most 4 (aim 1.5).

Linearity: one long open block (respond, think, and an execute block with one
long JSON string argument) is fed in 4-char deltas; feeding 2N characters must
take about twice as long as N (target ratio at most 2.6). A parser that rescans
its buffer on every delta shows up here as a ratio near 4.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import msgspec

from protocol import Parser

REPEATS = 7


class OutputTextDelta(msgspec.Struct):
    """The OpenAI Realtime frame that carries one text delta."""

    type: str
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


FRAME = (
    b'{"type":"response.output_text.delta","event_id":"event_abc123",'
    b'"response_id":"resp_abc123","item_id":"item_abc123","output_index":0,'
    b'"content_index":0,"delta":"abcd"}'
)


def median_us(run: Callable[[], float], repeats: int = REPEATS) -> float:
    """Median over ``repeats`` runs of ``run()``, which returns seconds per operation."""
    return statistics.median(run() for _ in range(repeats)) * 1e6


def decode_per_op(n: int) -> float:
    decode = msgspec.json.Decoder(OutputTextDelta).decode
    frame = FRAME
    start = time.perf_counter()
    for _ in range(n):
        decode(frame)
    return (time.perf_counter() - start) / n


def feed_per_op(prefix: str, delta: str, n: int) -> float:
    """Seconds per ``feed(delta)`` once the parser is in the state ``prefix`` leads to."""
    parser = Parser()
    parser.feed(prefix)
    feed = parser.feed  # bound once, as the gateway does
    start = time.perf_counter()
    for _ in range(n):
        feed(delta)
    return (time.perf_counter() - start) / n


def feed_block(opening: str, unit: str, chars: int) -> float:
    """Seconds to feed ``opening`` then ``chars`` characters of ``unit``s in 4-char deltas."""
    text = (unit * (chars // len(unit) + 1))[:chars]
    deltas = [text[i : i + 4] for i in range(0, len(text), 4)]
    parser = Parser()
    feed = parser.feed
    start = time.perf_counter()
    feed(opening)
    for delta in deltas:
        feed(delta)
    elapsed = time.perf_counter() - start
    assert not parser.stopped, "the block must stay open"
    return elapsed


# Realistic fillers: prose with the odd "<", and file content as a JSON string
# (escaped newlines and quotes, and a "</execute>" that must not end the block).
PROSE = "The value of a < b holds, so we read the config next. "
CODE = json.dumps('def f(x):\n    return "<b>" + x  # </execute> \\ ok\n')[1:-1]
BLOCKS = [
    ("respond", "Sure. ", PROSE),
    ("think", "<think>", PROSE),
    ("execute", '<execute>[{"name": "write", "args": {"path": "a.py", "text": "', CODE),
]


def main() -> None:
    quick = "--quick" in sys.argv
    n = 50_000 if quick else 300_000
    block_chars = 250_000 if quick else 1_000_000

    decode = median_us(lambda: decode_per_op(n))
    rows = [
        ("respond, 4-char delta", median_us(lambda: feed_per_op("Sure. ", "abcd", n))),
        ("think, 4-char delta", median_us(lambda: feed_per_op("<think>", "abcd", n))),
        ("respond, delta with '<'", median_us(lambda: feed_per_op("Sure. ", "a<b ", n))),
        ("think, delta with '<'", median_us(lambda: feed_per_op("<think>", "a<b ", n))),
    ]
    print(f"hot path ({n:,} deltas, median of {REPEATS})")
    print(f"  {'case':<28}{'µs/op':>8}{'× decode':>10}")
    print(f"  {'msgspec decode of the frame':<28}{decode:>8.3f}{1:>10.2f}")
    for name, us in rows:
        print(f"  {name:<28}{us:>8.3f}{us / decode:>10.2f}")

    repeats = 3 if quick else 5
    print(f"\nlong open block in 4-char deltas (median of {repeats})")
    print(f"  {'block':<10}{'N chars':>11}{'t(N) ms':>10}{'t(2N) ms':>10}{'ratio':>8}")
    for name, opening, unit in BLOCKS:
        t1 = statistics.median(feed_block(opening, unit, block_chars) for _ in range(repeats))
        t2 = statistics.median(feed_block(opening, unit, 2 * block_chars) for _ in range(repeats))
        print(f"  {name:<10}{block_chars:>11,}{t1 * 1e3:>10.1f}{t2 * 1e3:>10.1f}{t2 / t1:>8.2f}")

    print("\ntargets: hot path ≤ 4× decode (aim 1.5×); block ratio ≤ 2.6")


if __name__ == "__main__":
    main()
