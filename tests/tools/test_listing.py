"""``list``, ``find`` and ``search``: what they report, how they cap, how they fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.calls import ToolCall, ToolResult
from tools.base import Limits, ToolContext
from tools.builtin import default_registry
from tools.executor import Executor

from .helpers import Call, failed, ok


@pytest.fixture
def tree(workspace: Path) -> Path:
    """A small project: nested sources, docs, a binary, and a dotfile."""
    files = {
        "README.md": "# Demo\nRun main.py\n",
        "main.py": "import util\nprint(util.f(1))\n",
        "src/util.py": "def f(x):\n    return x + 1  # TODO tidy\n",
        "src/pkg/deep.py": "TODO = 'deep'\n",
        "src/pkg/notes.md": "todo: write docs\n",
        "docs/guide.md": "See main.py(1) for usage.\n",
        ".env": "TOKEN=abc\n",
    }
    for rel, text in files.items():
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (workspace / "logo.png").write_bytes(b"\x89PNG\x00\x00TODO")
    return workspace


async def run_with_limits(workspace: Path, limits: Limits, name: str, **args: object) -> ToolResult:
    ctx = ToolContext(workspace, "s", limits)
    return await Executor(default_registry()).run_call(ToolCall(name, dict(args)), ctx)


# --- list ----------------------------------------------------------------------


async def test_list_shows_sorted_entries_with_type_and_size(call: Call, tree: Path) -> None:
    def size(name: str) -> int:
        return (tree / name).stat().st_size

    listed = ok(await call("list"))
    assert listed == {
        "path": ".",
        "entries": [
            {"name": ".env", "type": "file", "size": size(".env")},
            {"name": "README.md", "type": "file", "size": size("README.md")},
            {"name": "docs", "type": "dir"},
            {"name": "logo.png", "type": "file", "size": size("logo.png")},
            {"name": "main.py", "type": "file", "size": size("main.py")},
            {"name": "src", "type": "dir"},
        ],
    }
    sub = ok(await call("list", path="src/pkg"))
    assert sub["path"] == "src/pkg"
    assert [e["name"] for e in sub["entries"]] == ["deep.py", "notes.md"]


async def test_list_is_capped_with_a_note(tree: Path) -> None:
    listed = ok(await run_with_limits(tree, Limits(max_entries=2), "list"))
    assert [e["name"] for e in listed["entries"]] == [".env", "README.md"]
    assert "showing the first 2 of 6 entries; list a subdirectory" in listed["note"]


async def test_list_of_a_file_or_missing_path_says_what_to_do(call: Call, tree: Path) -> None:
    assert "is a file, not a directory; use read" in failed(await call("list", path="main.py"))
    assert "no such file or directory" in failed(await call("list", path="nope"))


# --- find ----------------------------------------------------------------------


async def test_find_double_star_matches_at_any_depth(call: Call, tree: Path) -> None:
    found = ok(await call("find", pattern="**/*.py"))
    assert found == {"files": ["main.py", "src/util.py", "src/pkg/deep.py"]}


async def test_find_single_star_stays_at_the_top(call: Call, tree: Path) -> None:
    assert ok(await call("find", pattern="*.md"))["files"] == ["README.md"]


async def test_find_under_a_path_returns_workspace_relative_paths(call: Call, tree: Path) -> None:
    """Paths are usable with read as they are, whatever directory was searched."""
    found = ok(await call("find", pattern="*.py", path="src/pkg"))
    assert found["files"] == ["src/pkg/deep.py"]
    assert ok(await call("read", path=found["files"][0])) == "TODO = 'deep'\n"


async def test_find_with_no_match_and_bad_input(call: Call, tree: Path) -> None:
    assert ok(await call("find", pattern="**/*.rs")) == {"files": []}
    assert "is not a directory" in failed(await call("find", pattern="*", path="main.py"))


async def test_find_is_capped_with_a_note(tree: Path) -> None:
    found = ok(await run_with_limits(tree, Limits(max_entries=2), "find", pattern="**/*"))
    assert len(found["files"]) == 2
    assert "stopped after 2 files; use a narrower pattern or path" in found["note"]


# --- search --------------------------------------------------------------------


async def test_search_is_literal_by_default(call: Call, tree: Path) -> None:
    """Code like ``main.py(`` is found as written, not parsed as a broken regex."""
    found = ok(await call("search", pattern="main.py(1)"))
    assert found == {"matches": ["docs/guide.md:1:See main.py(1) for usage."]}


async def test_search_regex_and_ignore_case(call: Call, tree: Path) -> None:
    found = ok(await call("search", pattern=r"^def \w+", regex=True))
    assert found["matches"] == ["src/util.py:1:def f(x):"]
    found = ok(await call("search", pattern="todo", ignore_case=True))
    # Binary logo.png also contains "TODO" and is skipped.
    assert found["matches"] == [
        "src/util.py:2:    return x + 1  # TODO tidy",
        "src/pkg/deep.py:1:TODO = 'deep'",
        "src/pkg/notes.md:1:todo: write docs",
    ]


async def test_search_glob_filters_by_name_or_by_path(call: Call, tree: Path) -> None:
    by_name = ok(await call("search", pattern="TODO", glob="*.py"))
    assert by_name["matches"] == [
        "src/util.py:2:    return x + 1  # TODO tidy",
        "src/pkg/deep.py:1:TODO = 'deep'",
    ]
    by_path = ok(await call("search", pattern="TODO", glob="pkg/*.py", path="src"))
    assert by_path["matches"] == ["src/pkg/deep.py:1:TODO = 'deep'"]


async def test_search_a_single_file(call: Call, tree: Path) -> None:
    found = ok(await call("search", pattern="util", path="main.py"))
    assert found["matches"] == ["main.py:1:import util", "main.py:2:print(util.f(1))"]


async def test_search_invalid_regex_says_how_to_fix_it(call: Call, tree: Path) -> None:
    message = failed(await call("search", pattern="f(", regex=True))
    assert "invalid regex 'f('" in message and "regex=false" in message


async def test_a_regex_too_complex_for_linear_time_is_refused(call: Call, tree: Path) -> None:
    # Found from outside (2026-12-07): RE2's time is linear in the line times its program,
    # and (.*a){1000} (11,005 steps) took 25 s a MB in its NFA, a thread held meanwhile.
    message = failed(await call("search", pattern="(.*a){1000}", regex=True))
    assert "too complex" in message and "at most 1,000" in message
    assert ok(await call("search", pattern="(.*a){20}", regex=True))["matches"] == []


async def test_search_missing_path_and_empty_pattern_fail(call: Call, tree: Path) -> None:
    assert "no such file or directory" in failed(await call("search", pattern="x", path="nope"))
    assert "args.pattern: expected str of length >= 1" in failed(await call("search", pattern=""))


async def test_search_caps_matches_and_long_lines(workspace: Path) -> None:
    (workspace / "many.txt").write_text("hit " + "x" * 50 + "\n" + "hit\n" * 9)
    found = ok(
        await run_with_limits(
            workspace, Limits(max_matches=3, max_line_chars=10), "search", pattern="hit"
        )
    )
    assert found["matches"] == ["many.txt:1:hit xxxxxx", "many.txt:2:hit", "many.txt:3:hit"]
    assert "stopped after 3 matches; narrow the pattern" in found["note"]


async def test_search_skips_files_over_the_size_cap_and_says_so(workspace: Path) -> None:
    (workspace / "small.txt").write_text("needle\n")
    (workspace / "huge.txt").write_text("needle\n" + "hay\n" * 100)
    found = ok(
        await run_with_limits(workspace, Limits(max_read_bytes=50), "search", pattern="needle")
    )
    assert found["matches"] == ["small.txt:1:needle"]
    assert "skipped 1 file(s) over 50 bytes" in found["note"]
