"""Glob patterns with ``**``, matched against ``/``-separated relative paths.

``PurePath.match`` on Python 3.11 matches from the right and treats ``**``
like ``*``, and ``Path.glob`` walks on its own terms (symlinks included); the
sandboxed walk in ``tools.sandbox`` needs a pure matcher instead. Semantics
are the usual ones: ``*`` and ``?`` stay within one path segment, ``[...]`` is
a character class (``[!...]`` negated), and a ``**`` segment matches zero or
more whole segments, so ``**/*.py`` matches ``a.py`` and ``src/pkg/a.py``.

Patterns are not translated to a regex: a pattern chosen by the model such as
``**/**/**/…/x`` compiled to ``(?:[^/]+/)*`` repeated backtracks
exponentially in ``re`` on a deep path, and ``re`` holds the GIL while it does,
which froze the whole event loop for a minute. Matching here is the
classic wildcard algorithm that remembers only the last star and resumes after
it: at most ``len(pattern) * len(text)`` steps, used once over path segments
(``**`` is the star) and once inside each segment (``*`` is the star).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["Glob", "compile_glob"]

_STAR: Final = object()
"""The token for ``*`` inside a segment and for ``**`` among segments."""

_SegmentToken = object | str | re.Pattern[str]
"""``_STAR``, one literal character, or a one-character class."""


@dataclass(frozen=True, slots=True)
class Glob:
    """A compiled glob; ``matches`` is linear-bounded, never exponential."""

    pattern: str
    _segments: tuple[object | tuple[_SegmentToken, ...], ...]

    def matches(self, path: str) -> bool:
        """Whether the whole ``/``-separated relative ``path`` is selected."""
        parts = [p for p in path.split("/") if p not in ("", ".")]
        return _wildcard(self._segments, parts, _segment_matches)


def compile_glob(pattern: str) -> Glob:
    """The matcher for ``pattern`` (an empty pattern, like ``**``, selects everything)."""
    segments: list[object | tuple[_SegmentToken, ...]] = []
    for segment in pattern.strip("/").split("/"):
        if segment in ("", "."):
            continue
        if segment == "**":
            if not segments or segments[-1] is not _STAR:  # a/**/**/b is a/**/b
                segments.append(_STAR)
        else:
            segments.append(_segment_tokens(segment))
    return Glob(pattern, tuple(segments) if segments else (_STAR,))


def _segment_matches(tokens: object | tuple[_SegmentToken, ...], name: str) -> bool:
    assert isinstance(tokens, tuple)
    return _wildcard(tokens, name, _char_matches)


def _char_matches(token: object, char: str) -> bool:
    if isinstance(token, str):
        return token == char
    assert isinstance(token, re.Pattern)
    return token.fullmatch(char) is not None


def _wildcard(pattern: Sequence[Any], text: Sequence[Any], one: Callable[[Any, Any], bool]) -> bool:
    """Whether ``pattern`` (tokens, ``_STAR`` = any run) matches all of ``text``.

    Greedy with one saved position: on a mismatch, retry from the last star
    with it taking one more element. Earlier stars never need revisiting
    because any run the later star skipped could equally be eaten by it.
    """
    p = t = 0
    star_p = star_t = -1
    while t < len(text):
        if p < len(pattern) and pattern[p] is _STAR:
            star_p, star_t = p, t
            p += 1
        elif p < len(pattern) and one(pattern[p], text[t]):
            p += 1
            t += 1
        elif star_p >= 0:
            star_t += 1
            p, t = star_p + 1, star_t
        else:
            return False
    return all(token is _STAR for token in pattern[p:])


def _segment_tokens(segment: str) -> tuple[_SegmentToken, ...]:
    out: list[_SegmentToken] = []
    i, n = 0, len(segment)
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            if not out or out[-1] is not _STAR:
                out.append(_STAR)
        elif c == "?":
            out.append(_ANY_CHAR)
        elif c == "[":
            start = i + 1 if i < n and segment[i] in "!^" else i
            if start < n and segment[start] == "]":
                start += 1  # a leading "]" is part of the class, as in fnmatch
            end = segment.find("]", start)
            if end == -1:
                out.append(c)
                continue
            body = segment[i:end]
            i = end + 1
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            body = body.replace("\\", "\\\\").replace("[", "\\[")
            # One character against one class: no repetition, so no backtracking.
            out.append(re.compile(f"[{'^/' if negate else ''}{body}]", re.DOTALL))
        else:
            out.append(c)
    return tuple(out)


_ANY_CHAR: Final = re.compile(r"[^/]", re.DOTALL)
