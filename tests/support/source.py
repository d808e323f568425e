"""Parse Python source in tests that read the project's own code (the house rules).

CPython 3.11 keeps the AST constructor's recursion counter per interpreter, not
per thread (python/cpython#106905, fixed in later releases): an ``ast.parse`` that
runs while another thread parses too (a thread an earlier test left importing a
module under pytest's assertion rewriting) can fail with ``SystemError: AST
constructor recursion depth mismatch`` though the source is fine. A fresh-clone
CI run failed so once. Such a parse is simply done again.
"""

from __future__ import annotations

import ast

__all__ = ["parse"]

_ATTEMPTS = 3


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, done again when CPython's racy recursion counter trips it."""
    for attempt in range(_ATTEMPTS):
        try:
            return ast.parse(source, filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
