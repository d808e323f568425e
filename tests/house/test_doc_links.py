"""Every relative link in README.md and docs/ leads to a file that exists.

The manual is spread over README.md and docs/; a section that moves must not
leave a link behind that leads nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _broken(page: Path) -> list[str]:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    return broken


def test_the_manual_links_lead_to_files_that_exist() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = {str(p.relative_to(ROOT)): b for p in pages if (b := _broken(p))}
    assert not broken, f"links to no file: {broken}"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("")
    page.write_text("[ok](there.md#part) [gone](nowhere.md) [web](https://example.com)")
    assert _broken(page) == ["nowhere.md"]
