"""Glob patterns with ``**``, matched against ``/``-separated relative paths.

``PurePath.match`` on Python 3.11 matches from the right and treats ``**``
like ``*``, and ``Path.glob`` walks on its own terms (symlinks included); the
sandboxed walk in ``tools.sandbox`` needs a pure matcher instead. Semantics
are the usual ones: ``*`` and ``?`` stay within one path segment, ``[...]`` is
a character class (``[!...]`` negated), and a ``**`` segment matches zero or
more whole segments, so ``**/*.py`` matches ``a.py`` and ``src/pkg/a.py``.
"""

from __future__ import annotations

import re

__all__ = ["compile_glob"]


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex that fully matches the relative paths ``pattern`` selects."""
    segments = [s for s in pattern.strip("/").split("/") if s not in ("", ".")]
    out: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
        else:
            out.append(_segment(segment) + ("" if last else "/"))
    return re.compile("".join(out) if out else ".*", re.DOTALL)


def _segment(segment: str) -> str:
    out: list[str] = []
    i, n = 0, len(segment)
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            start = i + 1 if i < n and segment[i] in "!^" else i
            if start < n and segment[start] == "]":
                start += 1  # a leading "]" is part of the class, as in fnmatch
            end = segment.find("]", start)
            if end == -1:
                out.append(re.escape(c))
                continue
            body = segment[i:end]
            i = end + 1
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            body = body.replace("\\", "\\\\").replace("[", "\\[")
            out.append(f"[{'^/' if negate else ''}{body}]")
        else:
            out.append(re.escape(c))
    return "".join(out)
