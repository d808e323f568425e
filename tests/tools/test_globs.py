"""Glob matching for ``find`` and ``search``: the patterns models actually write."""

from __future__ import annotations

import re

import pytest

from tools.globs import compile_glob


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("**/*.py", "a.py", True),
        ("**/*.py", "src/pkg/a.py", True),
        ("**/*.py", "src/a.pyc", False),
        ("*.py", "a.py", True),
        ("*.py", "src/a.py", False),  # * stays within one segment
        ("src/**", "src/a/b.txt", True),
        ("src/**", "lib/a.txt", False),
        ("src/**/test_*.py", "src/test_a.py", True),
        ("src/**/test_*.py", "src/x/y/test_a.py", True),
        ("src/**/test_*.py", "src/x/a_test.py", False),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("[ab].md", "a.md", True),
        ("[!ab].md", "a.md", False),
        ("[!ab].md", "c.md", True),
        ("[].md", "[].md", True),  # unclosed class: literal
        ("a+b(1).txt", "a+b(1).txt", True),  # regex metacharacters are literal
        ("./*.md", "x.md", True),
        ("**", "any/thing/at/all", True),
    ],
)
def test_glob(pattern: str, path: str, matches: bool) -> None:
    assert compile_glob(pattern).matches(path) is matches


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("**/" * 40 + "x", "d/" * 60 + "y", False),
        ("/".join(["**", "d"] * 20) + "/x", "d/" * 60 + "y", False),
        ("/".join(["**", "d"] * 20) + "/x", "d/" * 60 + "x", True),
        ("*a" * 30 + "b", "a" * 5_000, False),
        ("*a" * 30 + "*", "a" * 5_000, True),
        ("[ab]" * 20 + "*c", "ab" * 2_000, False),
    ],
)
def test_pathological_globs_answer_without_backtracking(
    pattern: str, path: str, matches: bool
) -> None:
    """Patterns that took minutes (and held the GIL) as a backtracking regex (issue 13).

    Compiled to ``(?:[^/]+/)*`` per ``**`` these are exponential; the
    wildcard matcher answers each in at most len(pattern) * len(path) steps,
    so the suite's timeout is the only clock this needs.
    """
    assert compile_glob(pattern).matches(path) is matches


def test_a_bad_character_class_is_a_regex_error_callers_report() -> None:
    with pytest.raises(re.error):
        compile_glob("[z-a].txt")
