"""Glob matching for ``find`` and ``search``: the patterns models actually write."""

from __future__ import annotations

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
    assert (compile_glob(pattern).fullmatch(path) is not None) is matches
