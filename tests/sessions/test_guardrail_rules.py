"""The rules a session runs under (``gateway.sessions.guardrail_rules``): the rules
file checked at start and re-read when it changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.common.settings import ConfigError
from gateway.sessions.guardrail_rules import GuardrailsFile


def test_the_rules_file_is_checked_at_start_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text('[[rule]]\nname = "a"\non = "output"\naction = "redact"\ndetect = "email"\n')
    rules = GuardrailsFile(path, check_interval=0.0)
    assert [s.name for s in rules.specs] == ["a"]
    path.write_text('[[rule]]\nname = "b"\non = "input"\naction = "block"\npattern = "x"\n')
    os.utime(path, (1, 1))
    assert rules.poll() == 2 and [s.name for s in rules.specs] == ["b"]
    path.write_text('[[rule]]\nname = "c"\non = "sideways"\naction = "block"\npattern = "x"\n')
    os.utime(path, (2, 2))
    assert rules.poll() == 2 and [s.name for s in rules.specs] == ["b"]  # kept
    with pytest.raises(ConfigError, match=r"guardrail 'c': .*on"):
        GuardrailsFile(path)


def test_an_emptied_rules_file_keeps_its_rules_until_it_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: a save that truncates, then writes, showed the node an empty
    file, loaded as no rules: redaction stopped until the next write."""
    path = tmp_path / "rules.toml"
    path.write_text('[[rule]]\nname = "a"\non = "output"\naction = "redact"\ndetect = "email"\n')
    rules = GuardrailsFile(path, check_interval=0.0)
    path.write_text("")
    os.utime(path, (1, 1))
    assert rules.poll() == 1 and [s.name for s in rules.specs] == ["a"]
    assert "is empty: keeping what it had loaded" in caplog.text
    path.write_text("# no rules for now\n")
    os.utime(path, (2, 2))
    assert rules.poll() == 2 and rules.specs == ()


def test_the_docs_unicode_space_pattern_loads_and_catches_a_no_break_space(
    tmp_path: Path,
) -> None:
    """docs/guardrails.md showed ``[\\s\\p{Z}\\x{200b}]+``, which the loader refuses (RE2's
    escapes, an unbounded repeat): its example is now one the loader takes."""
    import re

    docs = (Path(__file__).parents[2] / "docs" / "guardrails.md").read_text()
    example = next(
        block for block in re.findall(r"```toml\n(.*?)```", docs, re.DOTALL) if "\\u00a0" in block
    )
    path = tmp_path / "rules.toml"
    path.write_text(example)
    [spec] = [s for s in GuardrailsFile(path).specs if s.name == "no-passwords"]
    assert spec.pattern is not None
    for said in ("my\u00a0password", "my \u200bpassword", "my\u3000password"):
        assert re.search(spec.pattern, said), said
