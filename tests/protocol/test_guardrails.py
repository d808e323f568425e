"""Guardrail rules (``protocol.guardrails``): pure, so tested directly and with hypothesis.

The property that matters: whatever the chunking, the streamed output is what
the whole text gives, so a card number split across chunks is caught.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.guardrail_matchers
from protocol.guardrail_matchers import Pattern, luhn
from protocol.guardrails import (
    GROWTH_FLOOR,
    MAX_PROGRAMS,
    MAX_RULES,
    Hit,
    RuleSet,
    RuleSpec,
    StreamGuard,
    check,
    check_input,
    compile_rules,
)

CARD = "4111 1111 1111 1111"


@pytest.fixture(scope="module")
def monkeypatch_span() -> Iterator[None]:
    """Pieces of 7 characters: short texts cross many of them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(protocol.guardrail_matchers, "SEARCH_SPAN", 7)
        yield


def rules(*specs: RuleSpec) -> tuple[RuleSet, RuleSet]:
    compiled = compile_rules(specs)
    assert not isinstance(compiled, str), compiled
    return compiled


def out(*specs: RuleSpec) -> RuleSet:
    return rules(*specs)[1]


REDACT_ALL = out(
    RuleSpec(name="card", on="output", action="redact", detect="card"),
    RuleSpec(name="phone", on="output", action="redact", detect="phone"),
    RuleSpec(name="email", on="output", action="redact", detect="email"),
    RuleSpec(name="pw", on="output", action="redact", pattern=r"\bpass(word)?\b", ignore_case=True),
)


def stream(rules: RuleSet, chunks: list[str]) -> tuple[str, list[str], bool]:
    guard = StreamGuard(rules)
    sent: list[str] = []
    names: list[str] = []
    for chunk in chunks:
        piece = guard.feed(chunk)
        sent.append(piece.text)
        names += [h.rule for h in piece.hits]
    piece = guard.finish()
    sent.append(piece.text)
    names += [h.rule for h in piece.hits]
    return "".join(sent), names, guard.cut


def split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_card_in_four_character_chunks_never_sent_and_the_rest_intact() -> None:
    text = f"Sure. Your card is {CARD}, expiring soon. Anything else?"
    guard = StreamGuard(REDACT_ALL)
    sent = [guard.feed(c).text for c in split(text, 4)] + [guard.finish().text]
    whole = "".join(sent)
    assert whole == "Sure. Your card is [redacted], expiring soon. Anything else?"
    assert not any(any(ch.isdigit() for ch in piece) for piece in sent)


def test_luhn_decides_a_card() -> None:
    assert luhn("4111111111111111") and not luhn("4111111111111112")
    assert check(REDACT_ALL, "order 4111 1111 1111 1112 shipped").text == (
        "order 4111 1111 1111 1112 shipped"
    )


def test_two_cards_in_one_run_are_both_gone() -> None:
    text = f"cards {CARD} 5555 5555 5555 4444 done"
    assert check(REDACT_ALL, text).text == "cards [redacted] done"


def test_detectors() -> None:
    got = check(REDACT_ALL, "mail bob.s@ex-ample.co.uk, call +49 30 1234567 or (555) 123-4567.")
    assert got.text == "mail [redacted], call [redacted] or [redacted]."
    assert [h.rule for h in got.hits] == ["email", "phone", "phone"]
    assert check(REDACT_ALL, "on 2026-12-05 at 10:30, 3 items").text == (
        "on 2026-12-05 at 10:30, 3 items"
    )


def test_block_cuts_the_stream_where_it_trips() -> None:
    rs = out(RuleSpec(name="secret", on="output", action="block", pattern="launch codes"))
    text, names, cut = stream(rs, split("ok here are the launch codes: 0000 and more", 3))
    assert (text, names, cut) == ("ok here are the ", ["secret"], True)


def test_max_chars_cuts_at_the_limit() -> None:
    rs = out(RuleSpec(name="short", on="output", action="end_turn", max_chars=10))
    assert stream(rs, split("abcdefghijklmnop", 3)) == ("abcdefghij", ["short"], True)
    assert stream(rs, ["abcdefghij"]) == ("abcdefghij", [], False)


def test_hold_back_is_the_smallest_window() -> None:
    guard = StreamGuard(out(RuleSpec(name="card", on="output", action="redact", detect="card")))
    assert guard.feed("hello world ").text == "hello world "  # no digits: nothing held
    assert guard.feed("4111 11").text == ""
    assert guard.held == 7
    pattern = StreamGuard(out(RuleSpec(name="p", on="output", action="redact", pattern="abc")))
    assert pattern.feed("xxxxxxxx").text == "xxxxx"  # its longest match + 1 held
    email = StreamGuard(out(RuleSpec(name="e", on="output", action="redact", detect="email")))
    assert email.feed("write to bob@exa").text == "write to "


def test_input_block_and_redact() -> None:
    ins, _ = rules(
        RuleSpec(name="pw", on="input", action="block", pattern=r"(?i)my password is"),
        RuleSpec(name="mail", on="input", action="redact", detect="email"),
    )
    blocked = check_input(ins, "hi, my password is hunter2")
    assert blocked.blocked and [h.rule for h in blocked.hits] == ["pw"]
    redacted = check_input(ins, "write to a@b.io please")
    assert not redacted.blocked and redacted.text == "write to [redacted] please"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"pattern": "a+"}, ["'p'", "pattern", "unbounded", "window"]),
        ({"pattern": "x*"}, ["'p'", "pattern", "empty"]),
        ({"pattern": "(a"}, ["'p'", "pattern"]),
        ({"pattern": r"(\w)\1"}, ["'p'", "pattern"]),
        ({"pattern": "a", "detect": "card"}, ["'p'", "exactly one"]),
        ({"pattern": "a" * 3000}, ["'p'", "pattern", "at most"]),
        # A zero or negative length is refused as such, not taken for a missing matcher.
        ({"max_chars": 0}, ["'p'", "max_chars must be over 0"]),
        ({"max_chars": -5}, ["'p'", "max_chars must be over 0"]),
        ({"max_chars": 5, "detect": "card"}, ["'p'", "exactly one", "detect, max_chars"]),
    ],
)
def test_bad_rules_are_refused_naming_rule_and_field(
    spec: dict[str, object], words: list[str]
) -> None:
    problem = compile_rules([RuleSpec(name="p", on="output", action="redact", **spec)])  # type: ignore[arg-type]
    assert isinstance(problem, str)
    for word in words:
        assert word in problem, problem


def test_rule_count_is_bounded() -> None:
    many = [RuleSpec(name=f"r{i}", on="input", action="block", pattern="x") for i in range(65)]
    problem = compile_rules(many)
    assert isinstance(problem, str) and str(MAX_RULES) in problem


_alphabet = st.sampled_from(
    [*list("0123456789 -.()+@abxyz_.\n"), "4111", "pass", "word", "bob@e.io"]
)
_text = st.lists(_alphabet, max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_text, cuts=st.lists(st.integers(0, 80), max_size=12))
def test_any_chunking_gives_what_the_whole_text_gives(text: str, cuts: list[int]) -> None:
    points = sorted({c for c in cuts if c <= len(text)} | {0, len(text)})
    chunks = [text[a:b] for a, b in itertools.pairwise(points)]
    whole = check(REDACT_ALL, text)
    streamed, names, _ = stream(REDACT_ALL, chunks)
    assert streamed == whole.text
    assert names == [h.rule for h in whole.hits]


@settings(max_examples=100, deadline=None)
@given(
    before=st.text(alphabet="abc .,:\n", max_size=20),
    after=st.text(alphabet="abc .,:\n", max_size=20),
    size=st.integers(1, 8),
)
def test_a_card_never_leaks_whatever_the_chunking(before: str, after: str, size: int) -> None:
    text = f"{before} {CARD} {after}"
    streamed, _, _ = stream(REDACT_ALL, split(text, size))
    assert "1111" not in streamed and streamed == f"{before} [redacted] {after}"


# A card as a reader sees it, whatever it is written with: found from outside, a model's
# "Echo" of these reached the client whole (only spaces and "-" were separators, only
# ASCII digits were digits).
_SEPARATED = ["4111.1111.1111.1111", "4111\u00a01111\u00a01111\u00a01111", "4111\n1111\n1111\n1111"]
_SEPARATED += ["4111\u200b1111\u200b1111\u200b1111", "4111\u20131111\u20131111\u20131111"]
_SEPARATED += ["4111\u202f1111\u202f1111\u202f1111", "4111 \u200b1111 \u200b1111 \u200b1111"]
# From an outside probe (2026-12-07): the common " - " is three separators, and slashes,
# underscores and the typographic spaces were none.
_SEPARATED += ["4111 - 1111 - 1111 - 1111", "4111/1111/1111/1111", "4111_1111_1111_1111"]
_SEPARATED += ["4111\u20031111\u20031111\u20031111", "4111\u30001111\u30001111\u30001111"]
_SCRIPTS = {"fullwidth": 0xFF10, "arabic-indic": 0x0660, "devanagari": 0x0966}


# Digits that are not decimal (``\\d`` missed them; found from outside, 2026-12-07).
_NOT_DECIMAL = {
    "superscript": "⁰¹²³⁴⁵⁶⁷⁸⁹",
    "subscript": "₀₁₂₃₄₅₆₇₈₉",
    "circled": "⓪①②③④⑤⑥⑦⑧⑨",
    "negative-circled": "⓿❶❷❸❹❺❻❼❽❾",
}


def _in_script(text: str, zero: int) -> str:
    return "".join(chr(zero + int(c)) if c.isdigit() else c for c in text)


def _in_digits(text: str, digits: str) -> str:
    return "".join(digits[int(c)] if c.isdigit() else c for c in text)


@pytest.mark.parametrize(
    "card",
    _SEPARATED
    + [_in_script(CARD, zero) for zero in _SCRIPTS.values()]
    + [_in_digits(CARD, digits) for digits in _NOT_DECIMAL.values()],
    ids=[
        *("dots", "nbsp", "newlines", "zero-width", "en-dash", "narrow-nbsp", "space-zw"),
        *("spaced-hyphen", "slash", "underscore", "em-space", "wide-space", *_SCRIPTS),
        *_NOT_DECIMAL,
    ],
)
def test_a_card_is_found_whatever_it_is_written_with(card: str) -> None:
    text = f"Your card is {card}, thanks."
    assert check(REDACT_ALL, text).text == "Your card is [redacted], thanks."
    for size in (1, 3, 4):
        streamed, names, _ = stream(REDACT_ALL, split(text, size))
        assert streamed == "Your card is [redacted], thanks." and names == ["card"]
    wrong = card[:-1] + chr(ord(card[-1]) + 1)  # the checksum still decides
    assert check(REDACT_ALL, f"order {wrong} shipped").text == f"order {wrong} shipped"


def test_many_matches_in_a_long_text_are_judged_in_linear_time() -> None:
    """Found from outside (2026-12-07): after each redaction every rule scanned the rest
    of the text again, so a rule that found nothing nearer went through it once per
    match. 2,000 contacts with an email each (164 KB), judged whole as an answer is
    persisted or a tool's result is: 12 s of one core here; ~30 ms now."""
    text = "".join(
        f"- Customer {i}: Jane Doe, jane.doe{i}@example.com, since 2019, plan Pro.\n"
        for i in range(2000)
    )
    started = time.process_time()
    judged = check(REDACT_ALL, text)
    took = time.process_time() - started
    assert judged.text.count("[redacted]") == 2000 and "@" not in judged.text
    assert took < 2.0, took  # a loaded machine's margin: ~60x what it takes


def test_redactions_that_would_grow_a_text_past_twice_its_size_withhold_its_rest() -> None:
    """Found from outside (2026-12-07): a rule matching every character (``a`` → 100
    characters, within the limits) made a 1 MB message 100 MB, 57 s of CPU."""
    rules = out(
        RuleSpec(name="a", on="output", action="redact", pattern="a", replacement="x" * 100)
    )
    started = time.process_time()
    judged = check(rules, "a" * 1_000_000)
    took = time.process_time() - started
    assert judged.cut and judged.hits[-1] == Hit("a", "block")
    assert len(judged.text) < 2 * GROWTH_FLOOR and "a" not in judged.text
    assert took < 2.0, took  # ~20 ms; a loaded machine's margin
    streamed = StreamGuard(rules)
    pieces = [streamed.feed("a" * 300) for _ in range(4)]
    assert [p.cut for p in pieces] == [False, False, True, True]
    # A replacement no longer than its match never withholds anything.
    short = out(
        RuleSpec(name="a", on="output", action="redact", pattern="a{1,9}", replacement="[x]")
    )
    assert check(short, "a b " * 10_000).text == "[x] b " * 10_000


def test_patterns_too_costly_together_are_refused_naming_the_rule() -> None:
    """Found from outside (2026-12-07): 64 rules of 3,000 RE2 instructions each, every
    one within the other limits, kept a core busy judging 1 MB of lowercase text."""
    costly = [
        RuleSpec(name=f"c{n}", on="output", action="redact", pattern=f"[a-z ]{{1,1000}}Q{n:02}")
        for n in range(4)
    ]
    problem = compile_rules(costly)
    assert isinstance(problem, str) and problem.startswith("guardrail 'c3': pattern:")
    assert f"over {MAX_PROGRAMS:,}" in problem and "{1,40}" in problem
    assert not isinstance(compile_rules(costly[:3]), str)  # 9,018 instructions


def test_numbers_that_are_no_card_stay() -> None:
    for text in [
        "version 1.2.3 of 2026",
        "on 2026-12-05\nat 10:30, 3 items",
        "12\u00a0345 euros",
        "on 2026/12/05 - 10/30",
    ]:
        assert check(REDACT_ALL, text).text == text


@settings(max_examples=150, deadline=None)
@given(
    separator=st.sampled_from(
        ["", " ", ".", "-", "\u00a0", "\u200b", "\n", "\u2013", " \u200b", " - ", "/"]
    ),
    zero=st.sampled_from([0x30, *_SCRIPTS.values()]),
    before=st.text(alphabet="abc .,:\n", max_size=12),
    size=st.integers(1, 8),
)
def test_a_card_written_any_way_never_leaks_whatever_the_chunking(
    separator: str, zero: int, before: str, size: int
) -> None:
    card = _in_script(separator.join(["4111", "1111", "1111", "1111"]), zero)
    text = f"{before} {card} ok"
    streamed, _, _ = stream(REDACT_ALL, split(text, size))
    assert streamed == f"{before} [redacted] ok"


def test_a_window_shorter_than_the_patterns_longest_match_does_not_let_it_out() -> None:
    # Found from outside: window = 5 on a pattern whose matches run to 36 characters
    # held 5, so "the secret code 12345678 here" streamed in 3-character chunks came out
    # whole while the whole text was redacted.
    rs = out(
        RuleSpec(
            name="code", on="output", action="redact", pattern="secret code [0-9]{1,20}", window=5
        )
    )
    text = "the secret code 12345678 here"
    assert check(rs, text).text == "the [redacted] here"
    assert stream(rs, split(text, 3))[0] == "the [redacted] here"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab \nxy", max_size=80),
    pattern=st.sampled_from([r"\bab\b", r"^a", r"b$", r"(?m)^x", r"a{2,3}b?", r"\by+"]),
    pos=st.integers(0, 80),
)
def test_a_pattern_searched_a_piece_at_a_time_finds_what_a_whole_search_finds(
    text: str, pattern: str, pos: int, monkeypatch_span: None
) -> None:
    """google-re2 encodes the whole text on every search (3.7 ms a MiB at any position),
    so a rule searches a long text a piece at a time; with a character of context on
    each side, what it finds is what one search of the whole text finds."""
    regex = re2.compile(pattern)
    pos = min(pos, len(text))
    whole = regex.search(text, pos)
    pieces = Pattern(regex, 4)._search(text, pos)
    assert pieces == (whole.span() if whole else None), (text, pattern, pos)


def test_a_long_answer_with_many_pattern_matches_is_judged_in_linear_time() -> None:
    """Found from outside (2026-12-07): a 1,000-email answer judged whole with a pattern
    rule that matched each line searched the whole text again per match, each search
    re-encoding it: one /healthz of ~520-670 ms as the answer was persisted."""
    rules = out(RuleSpec(name="acct", on="output", action="redact", pattern=r"acct-[0-9]{4}"))
    text = "".join(f"line {n}: acct-{n % 10_000:04d} and more words here\n" for n in range(20_000))
    started = time.process_time()
    judged = check(rules, text)
    took = time.process_time() - started
    assert judged.text.count("[redacted]") == 20_000 and "acct-" not in judged.text
    assert took < 2.0, took  # a loaded machine's margin
