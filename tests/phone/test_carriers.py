"""The carriers' table: docs/phone.md lists each row of ``gateway.phone.carriers``."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.phone.carriers import CARRIERS

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_has_a_line_per_carrier_in_the_tables_order() -> None:
    doc = (ROOT / "docs" / "phone.md").read_text()
    section = doc.split("\n## Carriers\n", 1)[1].split("\n## ", 1)[0]
    endpoints = re.findall(r"^\|[^|\n]+\| `(/v1/phone/[^`]+)` \|", section, re.MULTILINE)
    assert endpoints == [carrier.path for carrier in CARRIERS], (
        "docs/phone.md's table of carriers (## Carriers) and gateway/phone/carriers.py's "
        "CARRIERS differ: give each row its line, with its facts and their sources"
    )
