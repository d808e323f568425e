"""Guardrails: rules on what goes into the model and what comes out of it (pure).

A rule has a ``name``, a side (``on = "input" | "output"``), one matcher
(``pattern``: an RE2 regex, linear in the text; ``detect``: ``email``,
``phone`` or ``card`` with the Luhn checksum; ``max_chars``; on input only,
``check_url``: an HTTP checker the app runs, only validated here and awaited
by ``gateway.sessions.guardrail_check``) and an ``action``: ``redact``
replaces what matched, ``block`` withholds it (an input never reaches the
model; an output is cut where the rule tripped) and ``end_turn`` also ends
the model's turn.

``check`` judges a whole text. ``StreamGuard`` judges the same text fed in
chunks and gives back, per chunk, what is safe to send now: it holds back only
the smallest window a rule still needs to decide (the trailing run of digits
and separators for ``card``/``phone``, the trailing word for ``email``, the
last ``window`` characters for a ``pattern``), so any chunking of a text
gives exactly what ``check`` gives for the whole of it.

Every matcher is built so that the part of the text it has decided on never
changes as more text comes: a pattern's match is decided once ``window``
characters (its longest match, plus one for ``\\b`` and ``$``) follow its
start; a run of digits once a character that cannot continue it follows.
Runs are bounded (``RUN_CAP``): a longer run is judged by its first
``RUN_CAP`` characters, so the hold-back never grows past it.
"""

from __future__ import annotations

import importlib
import re
import urllib.parse
from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec
import re2

from protocol.guardrail_matchers import DETECTORS, RUN_CAP, Matcher, Pattern, Span

__all__ = [
    "GROWTH_FLOOR",
    "MAX_PATTERN",
    "MAX_PROGRAMS",
    "MAX_RULES",
    "MAX_WINDOW",
    "RUN_CAP",
    "Hit",
    "Piece",
    "RuleSet",
    "RuleSpec",
    "StreamGuard",
    "Verdict",
    "check",
    "check_input",
    "compile_rules",
]

Side = Literal["input", "output"]
Action = Literal["block", "redact", "end_turn"]
Detector = Literal["email", "phone", "card"]

MAX_RULES: Final = 64
"""Rules in one set (a file's plus a key's): each output chunk is scanned by every one."""
MAX_PATTERN: Final = 2_000
"""Characters in one pattern (a word list belongs in a few alternations, not thousands)."""
MAX_PROGRAMS: Final = 10_000
"""RE2 instructions of all of a set's patterns together: each streamed chunk runs every
output pattern over up to ``MAX_WINDOW`` held characters, at a cost that grows with its
program. A usual pattern is 10-100; 64 rules of ``[a-z ]{1,1000}Q`` (3,000 each, within
every other limit) kept a core busy with 1 MB of lowercase text."""
MAX_WINDOW: Final = 1_024
"""The longest match a pattern may declare or imply: the most an output is held back."""
CONTEXT: Final = 3
"""Characters kept before the held text: ``\\b`` and a run's continuation look back."""
REPLACEMENT: Final = "[redacted]"
GROWTH_FLOOR: Final = 64 * 1024
"""Characters redactions may add to a text or stream beyond as many as it has had judged
(whichever is more); past that its rest is withheld, as a ``block`` rule's is. A rule
matching every character of a 1 MB message (``a`` → 100 characters) made it 100 MB and
took 57 s of CPU; a redaction no longer than what it replaces never comes near it."""
# Python's regex parser, only to derive a pattern's longest match (RE2 does not tell).
_sre_parse: Any = importlib.import_module("re._parser")


class RuleSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One rule as written in a guardrails file or a key policy (see the module docstring)."""

    name: str
    on: Side
    action: Action
    pattern: str = ""
    ignore_case: bool = False
    window: int = 0
    """A pattern's longest match in characters (derived when the pattern is bounded)."""
    detect: Detector | None = None
    max_chars: int | None = None
    """None: no length rule (0 is refused, not taken for "unset")."""
    replacement: str = REPLACEMENT
    check_url: str = ""
    """An HTTP checker the app runs (input rules only): POSTed each input, awaited."""
    check_timeout: float = 2.0
    """Seconds for the whole exchange with the checker, at most ``MAX_CHECK_TIMEOUT``."""
    on_check_error: Literal["allow", "block"] = "block"
    """What a checker that errs or times out decides: fail-open or fail-closed."""
    check_headers: dict[str, str] = {}
    """Headers sent to the checker; the gateway takes ``${VAR}`` from its environment."""

    def __hash__(self) -> int:  # compiled sets are cached by their specs; a dict is not hashable
        return hash(
            tuple(
                tuple(sorted(v.items())) if isinstance(v, dict) else v
                for v in msgspec.structs.astuple(self)
            )
        )


class Hit(msgspec.Struct, frozen=True):
    """A rule tripped: its name and action (never the matched text)."""

    rule: str
    action: Action


class Piece(msgspec.Struct):
    """What a ``StreamGuard`` gives back: text safe to send now, and the rules that tripped.

    ``cut``: a ``block``/``end_turn`` rule tripped; nothing more of this text follows.
    """

    text: str
    hits: list[Hit]
    cut: bool = False


class Verdict(msgspec.Struct, frozen=True):
    """An input judged whole: the text to use (redacted), the hits, and whether it is blocked."""

    text: str
    hits: tuple[Hit, ...]
    blocked: bool


class _Rule:
    __slots__ = ("action", "matcher", "max_chars", "name", "replacement")

    def __init__(self, spec: RuleSpec, matcher: Matcher | None) -> None:
        self.name = spec.name
        self.action: Action = spec.action
        self.matcher = matcher
        self.max_chars = spec.max_chars or 0
        self.replacement = spec.replacement


class RuleSet:
    """Compiled rules of one side, in order (``compile_rules``).

    ``checks``: its HTTP checker rules, which are awaited (``gateway.sessions.
    guardrail_check``) apart from the rules judged here: truth is of these only.
    """

    __slots__ = ("checks", "limit", "rules", "scanners")

    def __init__(self, rules: Sequence[_Rule], checks: Sequence[RuleSpec] = ()) -> None:
        self.checks = tuple(checks)
        self.rules = tuple(rules)
        self.scanners = tuple(r for r in rules if r.matcher is not None)
        limits = [r for r in rules if r.max_chars]
        self.limit: _Rule | None = min(limits, key=lambda r: r.max_chars) if limits else None

    def __bool__(self) -> bool:
        return bool(self.rules)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rules)


EMPTY: Final = RuleSet(())


def _pattern_window(spec: RuleSpec) -> int | str:
    """The longest match of the rule's pattern (held back: a match starting before
    the last ``window`` characters has seen one more, for ``\\b`` and ``$``)."""
    where = f"guardrail {spec.name!r}: pattern"
    try:
        low, high = _sre_parse.parse(spec.pattern).getwidth()
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        return f"{where}: {exc}; write it in the syntax RE2 and Python's re share"
    if low == 0:
        return f"{where}: it can match empty text; make it match at least one character"
    if spec.window:
        # A window shorter than a longest match that is known would let such a match
        # out in pieces (the whole text redacted, the stream not): never shorter.
        return max(spec.window, int(high)) if high <= MAX_WINDOW else spec.window
    if high > MAX_WINDOW:
        return (
            f"{where}: its longest match is unbounded or over {MAX_WINDOW} characters; "
            "bound its repeats ({1,40} instead of +) or set window = N (the longest "
            f"text it should match, at most {MAX_WINDOW})"
        )
    return int(high)


def _compile_one(spec: RuleSpec) -> _Rule | str | None:
    where = f"guardrail {spec.name!r}"
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", spec.name):
        return f"guardrail {spec.name[:64]!r}: name: use 1-64 of A-Za-z0-9_.:-"
    given = [f for f in ("pattern", "detect", "check_url") if getattr(spec, f)]
    if spec.max_chars is not None:
        given.append("max_chars")
    if len(given) != 1:
        return (
            f"{where}: give exactly one matcher of pattern, detect, max_chars (a number of "
            f"characters), check_url (it has {', '.join(given) or 'none'})"
        )
    if spec.check_url:
        return _check_problem(spec)
    stray = spec.check_headers or spec.check_timeout != 2.0 or spec.on_check_error != "block"
    if stray:
        return f"{where}: check_timeout, on_check_error and check_headers go with check_url"
    if (spec.max_chars is not None and spec.max_chars < 1) or not 0 <= spec.window <= MAX_WINDOW:
        return f"{where}: max_chars must be over 0, window 0 to {MAX_WINDOW}"
    if len(spec.replacement) > 100:
        return f"{where}: replacement: at most 100 characters"
    if spec.detect is not None:
        return _Rule(spec, DETECTORS[spec.detect])
    if not spec.pattern:
        return _Rule(spec, None)
    if len(spec.pattern) > MAX_PATTERN:
        return (
            f"{where}: pattern: {len(spec.pattern)} characters, at most {MAX_PATTERN}; "
            "split it into several rules or use a detector"
        )
    window = _pattern_window(spec)
    if isinstance(window, str):
        return window
    options = re2.Options()
    options.case_sensitive = not spec.ignore_case
    options.log_errors = False
    options.max_mem = 8 << 20  # a pattern whose program is bigger is refused, not run
    try:
        regex = re2.compile(spec.pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        return f"{where}: pattern: {reason} (RE2 syntax: no backreferences or lookaround)"
    if regex.search("") is not None:
        return f"{where}: pattern: it matches empty text; make it match at least one character"
    return _Rule(spec, Pattern(regex, window))


MAX_CHECK_TIMEOUT: Final = 10.0
"""The longest a checker may take: an input waits for it before the model sees it."""


def _check_problem(spec: RuleSpec) -> str | None:
    """What is wrong with an HTTP checker rule (None: nothing)."""
    where = f"guardrail {spec.name!r}"
    if spec.on != "input":
        return (
            f'{where}: check_url: an HTTP checker judges inputs only (on = "input"); an '
            "answer streams, and a round trip per chunk would stall it: judge output "
            "with pattern or detect rules (docs/guardrails.md)"
        )
    if spec.action == "redact":
        return (
            f"{where}: action: a checker answers allow or not, so it cannot redact; "
            'use action = "block"'
        )
    url = urllib.parse.urlsplit(spec.check_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        return f"{where}: check_url: must be an http:// or https:// URL, not {spec.check_url!r}"
    if not 0 < spec.check_timeout <= MAX_CHECK_TIMEOUT:
        return (
            f"{where}: check_timeout: {spec.check_timeout:g} seconds; give more than 0 and at most "
            f"{MAX_CHECK_TIMEOUT:g} seconds (every judged input waits for it)"
        )
    return None


def compile_rules(specs: Sequence[RuleSpec]) -> tuple[RuleSet, RuleSet] | str:
    """The input and the output rules, or a problem naming the rule and the field."""
    if len(specs) > MAX_RULES:
        return f"guardrails: {len(specs)} rules, at most {MAX_RULES}"
    seen: set[str] = set()
    program = 0
    sides: dict[str, list[_Rule]] = {"input": [], "output": []}
    checks: list[RuleSpec] = []
    for spec in specs:
        if spec.name in seen:
            return f"guardrail {spec.name!r}: name: used twice; give each rule its own"
        seen.add(spec.name)
        rule = _compile_one(spec)
        if isinstance(rule, str):
            return rule
        if rule is not None and isinstance(rule.matcher, Pattern):
            program += rule.matcher.regex.programsize
            if program > MAX_PROGRAMS:
                return (
                    f"guardrail {spec.name!r}: pattern: the rules' patterns take {program:,} "
                    f"RE2 instructions by this one, over {MAX_PROGRAMS:,} for all together "
                    "(every answer's chunk runs each): use smaller repetition counts "
                    "({1,40}, not {1,1000}), fewer rules, or a detector"
                )
        if rule is None:
            checks.append(spec)  # an HTTP checker: awaited by the gateway, not run here
        else:
            sides[spec.on].append(rule)
    return RuleSet(sides["input"], checks), RuleSet(sides["output"])


class StreamGuard:
    """One stream of output (an answer, its reasoning) judged as it comes (see the module)."""

    __slots__ = ("_buf", "_grown", "_offset", "_pos", "cut", "cuts", "rules")

    def __init__(self, rules: RuleSet, *, cuts: bool = False) -> None:
        """``cuts``: every rule that trips cuts the stream there, a ``redact`` rule after
        its replacement (a spoken answer: its audio cannot go on past the match)."""
        self.rules = rules
        self.cuts = cuts
        self._buf = ""  # CONTEXT characters already judged, then the held text
        self._pos = 0  # where the held text starts in _buf
        self._offset = 0  # characters of the stream before _buf[_pos]
        self._grown = 0  # characters the redactions added (less what they took out)
        self.cut = False

    @property
    def held(self) -> int:
        """Characters held back now."""
        return len(self._buf) - self._pos

    def feed(self, chunk: str) -> Piece:
        """The next chunk; what of the stream is safe to send now."""
        return self._run(chunk, final=False)

    def finish(self) -> Piece:
        """The stream ended: the rest of what was held, judged."""
        return self._run("", final=True)

    def _run(self, chunk: str, final: bool) -> Piece:
        if self.cut:
            return Piece("", [], cut=True)
        hits: list[Hit] = []
        over: _Rule | None = None
        limit = self.rules.limit
        if limit is not None:
            room = limit.max_chars - (self._offset + len(self._buf) - self._pos)
            if len(chunk) > room:
                chunk, over, final = chunk[:room], limit, True
        buf = self._buf + chunk
        pos = self._pos
        out: list[str] = []
        scanners = self.rules.scanners
        # Each rule's last scan, reused while all it found lies at or after ``pos``: a
        # rescan after each redaction went through the whole rest of the text for every
        # rule that found nothing nearer (80 KB of answer with 1,000 emails: 3 s).
        scans: list[tuple[Span | None, int, int] | None] = [None] * len(scanners)
        while True:
            best: tuple[int, int, _Rule] | None = None
            decided = cut_at = len(buf)
            for i, rule in enumerate(scanners):
                last = scans[i]
                if last is None or min(last[1], last[2]) < pos or (last[0] or (pos,))[0] < pos:
                    assert rule.matcher is not None
                    last = scans[i] = rule.matcher.scan(buf, pos, final)
                span, hold, keep = last
                decided = min(decided, hold)
                cut_at = min(cut_at, keep)
                if span is not None and (best is None or span[0] < best[0]):
                    best = (span[0], span[1], rule)
            if best is not None and best[0] < decided:
                start, end, rule = best
                out.append(buf[pos:start])
                hits.append(Hit(rule.name, rule.action))
                if rule.action != "redact":
                    return self._cut(out, hits)
                self._grown += len(rule.replacement) - (end - start)
                if self._grown > max(GROWTH_FLOOR, self._offset):  # see GROWTH_FLOOR
                    hits[-1] = Hit(rule.name, "block")
                    return self._cut(out, hits)
                out.append(rule.replacement)
                if self.cuts:
                    return self._cut(out, hits)
                self._offset += end - pos
                pos = end
                continue
            release = min(decided, cut_at)
            out.append(buf[pos:release])
            self._offset += release - pos
            keep_from = max(0, release - CONTEXT)
            self._buf, self._pos = buf[keep_from:], release - keep_from
            break
        if over is not None:
            hits.append(Hit(over.name, over.action))
            if over.action == "redact":
                out.append(over.replacement)
            return self._cut(out, hits)
        return Piece("".join(out), hits)

    def _cut(self, out: list[str], hits: list[Hit]) -> Piece:
        self.cut = True
        self._buf, self._pos = "", 0
        return Piece("".join(out), hits, cut=True)


def check(rules: RuleSet, text: str, *, cuts: bool = False) -> Piece:
    """A whole text judged by ``rules`` (what a ``StreamGuard`` gives for it, in one piece)."""
    guard = StreamGuard(rules, cuts=cuts)
    first = guard.feed(text)
    if first.cut:
        return first
    rest = guard.finish()
    return Piece(first.text + rest.text, first.hits + rest.hits, rest.cut)


def check_input(rules: RuleSet, text: str) -> Verdict:
    """An input (a user's message, a transcript, a tool's result) judged whole.

    Blocked when a ``block`` or ``end_turn`` rule trips; else redacted by the
    ``redact`` rules that matched.
    """
    if not rules:
        return Verdict(text, (), False)
    piece = check(rules, text)
    return Verdict(piece.text, tuple(piece.hits), piece.cut and piece.hits[-1].action != "redact")
