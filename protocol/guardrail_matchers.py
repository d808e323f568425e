"""What a guardrail rule matches with (pure): an RE2 pattern searched a piece at a
time, and the detectors (card, phone, email) over maximal runs of characters.

Each ``scan(text, pos, final)`` gives the first decided match at or after ``pos``,
where nothing is decided yet, and where the text may be cut (``protocol.guardrails``
runs them over a stream or a whole text). Runs are bounded (``RUN_CAP``): a longer
run is judged by its first ``RUN_CAP`` characters, so the hold-back never grows past it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Final, Protocol

import re2

__all__ = ["DETECTORS", "RUN_CAP", "SEARCH_SPAN", "Matcher", "Pattern", "Span", "luhn"]

SEARCH_SPAN: Final = 4_096
"""Characters of starts a pattern rule searches a piece of a long text for (``Pattern``)."""
RUN_CAP: Final = 256
"""Characters of a run of digits (or of email characters) that a detector looks at."""

Span = tuple[int, int]


class Matcher(Protocol):
    def scan(self, text: str, pos: int, final: bool) -> tuple[Span | None, int, int]:
        """The first decided match at or after ``pos``, the position from which
        nothing is decided yet (``len(text)`` when ``final``), and the position the
        text may be cut at (at most both)."""
        ...


class Pattern:
    __slots__ = ("regex", "window")

    def __init__(self, regex: re2._Regexp, window: int) -> None:
        self.regex = regex
        self.window = window

    def scan(self, text: str, pos: int, final: bool) -> tuple[Span | None, int, int]:
        n = len(text)
        m = self._search(text, pos)
        if final:
            return m, n, n
        # A match starting before n - window has seen all it can match and one more
        # character (for \b and $); one starting later may still change.
        undecided = max(pos, n - self.window)
        if m is not None and m[0] < undecided:
            return m, undecided, m[0]
        hold = undecided if m is None else min(m[0], undecided)
        return None, hold, hold

    def _search(self, text: str, pos: int) -> Span | None:
        """``regex.search(text, pos)``'s span, the text given a span at a time: google-re2
        encodes all of the text it is given on every call (3.7 ms for a MiB, at any
        ``pos``), and judging a long answer searched again after each redaction. A piece
        has a character of context before it (``\\b``, ``^``) and ``window`` after its
        last start, so a match starting in it is the one the whole text gives."""
        n, regex, step = len(text), self.regex, SEARCH_SPAN
        while True:
            base = max(pos - 1, 0)
            end = pos + step + self.window + 1  # past the longest match from the last start
            last = end >= n  # the piece runs to the text's end: any match in it is the one
            m = regex.search(text[base:end] if base or not last else text, pos - base)
            if m is not None and (last or m.start() + base < pos + step):
                return m.start() + base, m.end() + base
            if last:
                return None
            pos += step


class _Runs:
    """A detector over maximal runs of characters (digits and separators, or email characters)."""

    __slots__ = ("classify", "continues", "gap", "lead", "run")

    def __init__(
        self,
        run: re.Pattern[str],
        continues: Callable[[str, int], int],
        classify: Callable[[str], Span | None],
        lead: frozenset[str] = frozenset(),
        gap: int = 2,
    ) -> None:
        self.run = run
        self.continues = continues
        self.classify = classify
        self.lead = lead  # characters that may go on into a run (separators, "+", "(")
        self.gap = gap  # how many of them in a row may

    def scan(self, text: str, pos: int, final: bool) -> tuple[Span | None, int, int]:
        n = limit = len(text)
        if not final and n > pos:
            # Separators after a digit may go on into the run; a "+" or "(" may start one.
            k, lead = n, self.lead
            while k > pos and n - k < self.gap and text[k - 1] in lead:
                k -= 1
            if k > pos and text[k - 1].isdigit():
                limit = k
            elif text[-1] in lead and text[-1] in "+(":
                limit = n - 1
        begin = pos
        back = self.continues(text, pos) if pos > 0 else -1
        if back >= 0:
            joined = self.run.match(text, back)
            if joined is not None and joined.end() > pos:
                begin = joined.end()  # the rest of a run judged already
        for m in self.run.finditer(text, begin):
            start, end = m.span()
            if end >= limit and not final and end - start <= RUN_CAP:
                return None, start, start  # it may go on
            span = self.classify(text[start : min(end, start + RUN_CAP)])
            if span is not None:
                return (start + span[0], start + span[1]), start + span[1], start
            if end >= limit:
                return None, n, n  # past the cap: judged by its start, the rest skipped
        return None, limit, limit


_SEPARATORS: Final = frozenset(" -.()")
_CARD_SEPARATORS: Final = frozenset(
    " -.\t\n\u00a0\u1680\u202f\u205f\u3000"  # spaces: no-break, ogham, narrow, math, wide
    + "".join(map(chr, range(0x2000, 0x200B)))  # the typographic spaces: en, em, thin, …
    + "\u2010\u2011\u2012\u2013\u2014\u2212"  # hyphens and dashes, minus
    + "\u200b\u200c\u200d\u2060\ufeff"  # zero-width: invisible, the number reads whole
    + "/_\u00b7"  # slash, underscore, middle dot
)
"""What a card number's digit groups are written apart with: a rule that missed
``4111.1111.1111.1111``, a no-break space or an invisible one let the number through."""
_CARD_GAP: Final = 3
"""Separators at most between two digits: ``4111 - 1111`` is three."""
_OTHER_DIGITS: Final = "".join(
    c for c in map(chr, range(0x20000)) if c.isdigit() and not c.isdecimal()
)
"""Digits ``\\d`` does not take that a reader reads all the same: superscript ``⁴``,
subscript ``₄``, circled ``④``, parenthesised ``⑷``, ``⒋`` (Unicode's digits that are
not decimal; 128 of them, none past U+1FFFF). A card written in them went through."""
_DIGIT: Final = r"[\d" + re.escape(_OTHER_DIGITS) + "]"
_CARD_RUN: Final = re.compile(
    _DIGIT
    + "(?:["
    + re.escape("".join(sorted(_CARD_SEPARATORS)))
    + rf"]{{0,{_CARD_GAP}}}"
    + _DIGIT
    + ")*"
)
"""Any digits (fullwidth ``４``, Arabic-Indic ``٤``, superscript ``⁴`` as well as ``4``),
as a reader sees them; the checksum is taken on their values."""
_CARD_GROUP: Final = re.compile(_DIGIT + "+")
_EMAIL_RUN: Final = re.compile(r"[A-Za-z0-9._%+@-]+")
_EMAIL: Final = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


def _digit_continues(
    text: str, pos: int, separators: frozenset[str] = _SEPARATORS, gap: int = 2
) -> int:
    """The last digit before ``pos`` (over up to ``gap`` separators), or -1."""
    i = pos - 1
    while i >= 0 and pos - i <= gap and text[i] in separators:
        i -= 1
    return i if i >= 0 and text[i].isdigit() else -1


def _card_continues(text: str, pos: int) -> int:
    return _digit_continues(text, pos, _CARD_SEPARATORS, _CARD_GAP)


def _email_continues(text: str, pos: int) -> int:
    return pos - 1 if _EMAIL_RUN.fullmatch(text, pos - 1, pos) is not None else -1


def luhn(digits: str) -> bool:
    """The Luhn checksum of a card number (digits only)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _values(text: str) -> str:
    """The digits of ``text`` as ASCII ("⁴٤４" is "444"): what the checksum reads."""
    return "".join(str(unicodedata.digit(c)) for c in text if c.isdigit())


def _card(run: str) -> Span | None:
    """A run of 13-19 digits passing Luhn; in a longer run, every group-aligned one
    (``4111 1111 1111 1111 4242 …``), the span from the first to the last."""
    digits = _values(run)
    if 13 <= len(digits) <= 19 and luhn(digits):
        return 0, len(run)
    if len(digits) <= 19:
        return None
    groups = [(m.start(), m.end(), _values(m.group())) for m in _CARD_GROUP.finditer(run)]
    found: list[Span] = []
    i = 0
    while i < len(groups):
        # The longest card of whole groups from group i: 19 digits at most, so a few
        # groups (trying every end, the longest first, was quadratic in a run's groups:
        # a 1 MiB message of digits and spaces took 3 s).
        number, last = "", -1
        for j in range(i, len(groups)):
            number += groups[j][2]
            if len(number) > 19:
                break
            if len(number) >= 13 and luhn(number):
                last = j
        if last >= 0:
            found.append((groups[i][0], groups[last][1]))
            i = last
        i += 1
    return (found[0][0], found[-1][1]) if found else None


def _phone(run: str) -> Span | None:
    """10-15 digits (8-15 after a ``+``), with the usual separators."""
    count = sum(c.isdigit() for c in run)
    low = 8 if run.startswith("+") else 10
    return (0, len(run)) if low <= count <= 15 else None


_PHONE_RUN: Final = re.compile(r"(?:\+|\()?[0-9](?:[ .()-]{0,2}[0-9])*")


def _email(run: str) -> Span | None:
    if "@" not in run:
        return None
    found = list(_EMAIL.finditer(run))
    return (found[0].start(), found[-1].end()) if found else None


DETECTORS: Final[dict[str, Matcher]] = {
    "card": _Runs(_CARD_RUN, _card_continues, _card, _CARD_SEPARATORS, _CARD_GAP),
    "phone": _Runs(_PHONE_RUN, _digit_continues, _phone, frozenset(" -.()+")),
    "email": _Runs(_EMAIL_RUN, _email_continues, _email),
}
