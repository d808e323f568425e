"""The product's code says why, not which ticket: no issue numbers in it.

A comment that says "(issue 13)" sends a reader to a tracker they may not
have; the reason belongs in the comment and the history in the commit message
(``git log -S`` finds it). Tests may still name the issue a case came from.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("gateway", "protocol", "tools")
SUFFIXES = {".py", ".js", ".ts", ".html", ".css", ".md", ".toml", ".json"}
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)


def _hits(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if ISSUE.search(line)]


@pytest.mark.timeout(30)
def test_no_issue_numbers_in_product_code() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {path.read_text(errors='replace').splitlines()[n - 1].strip()}"
        for pkg in PRODUCT
        for path in sorted((ROOT / pkg).rglob("*"))
        if path.suffix in SUFFIXES and path.is_file()
        for n in _hits(path.read_text(errors="replace"))
    ]
    assert not found, (
        "issue numbers in product code (keep the why in the comment, the number in the "
        "commit message):\n" + "\n".join(found)
    )


@pytest.mark.timeout(30)
def test_the_check_sees_an_issue_number() -> None:
    assert _hits("x = 1\n# bounded (issue 38: one peer froze the node)\n") == [2]
    assert _hits("// servers before Issue #19 send\n") == [1]
    assert _hits("# see the issues list; 38 peers\n") == []
