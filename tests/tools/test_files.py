"""``read``, ``write`` and ``edit``: success paths and every failure the model can fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from protocol.calls import ToolCall, ToolResult
from tools.base import Limits, ToolContext
from tools.builtin import default_registry
from tools.executor import Executor
from tools.quota import workspace_usage

from .helpers import Call, failed, ok

# --- read --------------------------------------------------------------------


async def test_read_returns_the_whole_text(call: Call, workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\ntwo\nthree\n")
    assert ok(await call("read", path="a.txt")) == "one\ntwo\nthree\n"


async def test_read_a_range_says_where_to_continue(call: Call, workspace: Path) -> None:
    (workspace / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    assert ok(await call("read", path="a.txt", offset=3, limit=2)) == (
        "line 3\nline 4\n[lines 3-4 of 10; pass offset=5 to read on]"
    )
    assert ok(await call("read", path="a.txt", offset=9)) == "line 9\nline 10\n[lines 9-10 of 10]"
    assert ok(await call("read", path="a.txt", limit=100)) == (
        "".join(f"line {i}\n" for i in range(1, 11))
    )


async def test_read_past_the_end_says_how_long_the_file_is(call: Call, workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\ntwo\n")
    message = failed(await call("read", path="a.txt", offset=5))
    assert message == "offset 5 is past the end of 'a.txt', which has 2 lines; use a smaller offset"


async def test_read_keeps_line_endings_and_tolerates_bad_bytes(call: Call, workspace: Path) -> None:
    (workspace / "crlf.txt").write_bytes(b"a\r\nb\r\n")
    assert ok(await call("read", path="crlf.txt")) == "a\r\nb\r\n"
    (workspace / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    assert ok(await call("read", path="latin1.txt")) == "caf\ufffd\n"
    (workspace / "empty.txt").write_text("")
    assert ok(await call("read", path="empty.txt")) == ""


async def test_read_of_missing_file_or_directory_says_what_to_do(
    call: Call, workspace: Path
) -> None:
    assert "no such file or directory; use list or find" in failed(
        await call("read", path="nope.txt")
    )
    (workspace / "d").mkdir()
    assert "it is a directory; use list" in failed(await call("read", path="d"))


async def test_read_refuses_binary_files(call: Call, workspace: Path) -> None:
    (workspace / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    message = failed(await call("read", path="img.png"))
    assert "binary file (16 bytes)" in message


async def test_read_refuses_big_files_whole_but_reads_a_range(workspace: Path) -> None:
    (workspace / "big.log").write_text("".join(f"event {i}\n" for i in range(1, 101)))
    ctx = ToolContext(workspace, "s", Limits(max_read_bytes=100))
    executor = Executor(default_registry())

    whole = await executor.run_call(ToolCall("read", {"path": "big.log"}), ctx)
    message = failed(whole)
    assert "over the 100-byte limit; pass offset and limit" in message

    part = await executor.run_call(
        ToolCall("read", {"path": "big.log", "offset": 50, "limit": 2}), ctx
    )
    assert ok(part) == "event 50\nevent 51\n[lines 50-51; pass offset=52 to read on]"
    tail = await executor.run_call(
        ToolCall("read", {"path": "big.log", "offset": 99, "limit": 5}), ctx
    )
    assert ok(tail) == "event 99\nevent 100\n[lines 99-100 of 100]"
    past = await executor.run_call(
        ToolCall("read", {"path": "big.log", "offset": 500, "limit": 5}), ctx
    )
    assert "offset 500 is past the end of 'big.log'" in failed(past)


# --- write -------------------------------------------------------------------


async def test_write_creates_parents_and_reports_bytes(call: Call, workspace: Path) -> None:
    result = ok(await call("write", path="a/b/c.txt", content="héllo\n"))
    assert result == {"path": "a/b/c.txt", "bytes_written": 7}
    assert (workspace / "a/b/c.txt").read_text() == "héllo\n"


async def test_write_overwrites(call: Call, workspace: Path) -> None:
    (workspace / "a.txt").write_text("old content that is longer")
    ok(await call("write", path="a.txt", content="new"))
    assert (workspace / "a.txt").read_text() == "new"


async def test_write_to_a_directory_or_under_a_file_fails(call: Call, workspace: Path) -> None:
    (workspace / "d").mkdir()
    assert "it is a directory" in failed(await call("write", path="d", content="x"))
    assert "it is a directory" in failed(await call("write", path=".", content="x"))
    (workspace / "f").write_text("file")
    message = failed(await call("write", path="f/x.txt", content="x"))
    assert "cannot write 'f/x.txt'" in message
    assert (workspace / "f").read_text() == "file"


# --- edit --------------------------------------------------------------------


async def test_edit_replaces_exactly_one_occurrence(call: Call, workspace: Path) -> None:
    (workspace / "m.py").write_text("def f():\n    return 1\n")
    result = ok(await call("edit", path="m.py", old="return 1", new="return 2"))
    assert result == {"path": "m.py", "replacements": 1}
    assert (workspace / "m.py").read_text() == "def f():\n    return 2\n"


async def test_edit_not_found_leaves_the_file_alone(call: Call, workspace: Path) -> None:
    (workspace / "m.py").write_text("def f():\n    return 1\n")
    message = failed(await call("edit", path="m.py", old="return  1", new="x"))
    assert "'old' was not found in 'm.py'; read the file and copy the text exactly" in message
    assert (workspace / "m.py").read_text() == "def f():\n    return 1\n"


async def test_edit_ambiguous_needs_more_context_or_replace_all(
    call: Call, workspace: Path
) -> None:
    (workspace / "m.py").write_text("a = 1\nb = 1\n")
    message = failed(await call("edit", path="m.py", old="= 1", new="= 2"))
    assert "occurs 2 times" in message and "replace_all=true" in message
    assert (workspace / "m.py").read_text() == "a = 1\nb = 1\n"

    result = ok(await call("edit", path="m.py", old="= 1", new="= 2", replace_all=True))
    assert result["replacements"] == 2
    assert (workspace / "m.py").read_text() == "a = 2\nb = 2\n"


async def test_edit_text_copied_from_read_applies(call: Call, workspace: Path) -> None:
    """What read shows (CRLF included) is what edit matches, and the rest is kept byte-exact."""
    (workspace / "w.txt").write_bytes(b"first\r\nsecond\r\nthird\r\n")
    text = ok(await call("read", path="w.txt", offset=2, limit=1)).split("[")[0]
    assert text == "second\r\n"
    ok(await call("edit", path="w.txt", old=text, new="2nd\r\n"))
    assert (workspace / "w.txt").read_bytes() == b"first\r\n2nd\r\nthird\r\n"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("", "x", "'old' is empty"),
        ("same", "same", "nothing to change"),
    ],
)
async def test_edit_rejects_pointless_edits(
    old: str, new: str, expected: str, call: Call, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("same\n")
    assert expected in failed(await call("edit", path="a.txt", old=old, new=new))


async def test_edit_refuses_missing_binary_and_non_utf8_files(call: Call, workspace: Path) -> None:
    assert "no such file or directory" in failed(
        await call("edit", path="nope.txt", old="a", new="b")
    )
    (workspace / "b.bin").write_bytes(b"a\x00b")
    assert "binary file" in failed(await call("edit", path="b.bin", old="a", new="b"))
    latin = "café\n".encode("latin-1")
    (workspace / "l.txt").write_bytes(latin)
    assert "not valid UTF-8" in failed(await call("edit", path="l.txt", old="caf", new="x"))
    assert (workspace / "l.txt").read_bytes() == latin  # not rewritten with U+FFFD


# --- bounds (issue 13) ---------------------------------------------------------


def _rss_bytes() -> int:
    """This process's resident set size, from /proc/self/statm (pages → bytes)."""
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


async def test_edit_that_would_amplify_to_300_mb_is_refused_before_building_it(
    call: Call, workspace: Path
) -> None:
    """110 kB of model output once became a 1 GB file and 1.95 GB of RSS."""
    (workspace / "small.txt").write_text("a" * 3_000)
    before = _rss_bytes()
    message = failed(
        await call("edit", path="small.txt", old="a", new="b" * 100_000, replace_all=True)
    )
    grown = _rss_bytes() - before
    assert "would make it 300,000,000 bytes, over the 10,000,000-byte limit" in message
    assert "replace fewer occurrences" in message
    assert grown < 40 * 1024 * 1024, f"RSS grew by {grown:,} bytes"
    assert (workspace / "small.txt").read_text() == "a" * 3_000


async def test_write_over_the_file_size_limit_is_refused(workspace: Path) -> None:
    ctx = ToolContext(workspace, "s", Limits(max_write_bytes=1_000))
    executor = Executor(default_registry())
    result = await executor.run_call(ToolCall("write", {"path": "a", "content": "é" * 600}), ctx)
    assert "over the 1,000-byte limit for one file; split it" in failed(result)
    assert not (workspace / "a").exists()


async def test_a_50_mb_single_line_file_is_read_as_a_bounded_slice(workspace: Path) -> None:
    (workspace / "one-line.txt").write_bytes(b"x" * 50_000_000 + b"\nsecond line\n")
    ctx = ToolContext(workspace, "s", Limits())
    executor = Executor(default_registry(), max_output=2_000_000)
    before = _rss_bytes()
    result = await executor.run_call(
        ToolCall("read", {"path": "one-line.txt", "offset": 1, "limit": 2}), ctx
    )
    grown = _rss_bytes() - before
    text = ok(result)
    assert text.startswith("x" * 1_000_000 + "\n[line 1 is cut after 1,000,000 characters")
    assert "pass offset=2 to read on" in text
    assert len(text) < 1_001_000
    assert grown < 40 * 1024 * 1024, f"RSS grew by {grown:,} bytes"
    after = await executor.run_call(
        ToolCall("read", {"path": "one-line.txt", "offset": 2, "limit": 5}), ctx
    )
    assert ok(after) == "second line\n[lines 2-2 of 2]"


async def test_write_and_edit_refuse_to_take_the_workspace_over_its_quota(
    workspace: Path,
) -> None:
    ctx = ToolContext(workspace, "s", Limits(max_workspace_bytes=10_000))
    executor = Executor(default_registry())

    async def run(name: str, **args: object) -> ToolResult:
        return await executor.run_call(ToolCall(name, dict(args)), ctx)

    ok(await run("write", path="a.txt", content="a" * 6_000))
    message = failed(await run("write", path="b.txt", content="b" * 6_000))
    assert "would hold 12,000 bytes, over its 10,000-byte quota" in message
    assert "delete files" in message
    assert not (workspace / "b.txt").exists()
    message = failed(await run("edit", path="a.txt", old="a", new="aa", replace_all=True))
    assert "over its 10,000-byte quota" in message
    ok(await run("write", path="a.txt", content="a" * 9_000))  # overwriting counts the old size
    ok(await run("edit", path="a.txt", old="a" * 9_000, new="short"))


async def test_empty_files_and_new_directories_count_against_the_quota(workspace: Path) -> None:
    # Found from outside (2026-12-07): counted by their bytes, empty files and the parent
    # directories write makes cost nothing, and a session made hundreds a minute (inodes
    # on a disk every session shares). Each now counts a block, 4,096 bytes, at least.
    ctx = ToolContext(workspace, "s", Limits(max_workspace_bytes=40_960))
    executor = Executor(default_registry())
    made = 0
    for n in range(20):
        result = await executor.run_call(ToolCall("write", {"path": f"d{n}/e", "content": ""}), ctx)
        if result.status != "success":
            assert "every file and directory counts 4,096 at least" in failed(result)
            break
        made += 1
    assert made == 5  # a directory and a file each: 8,192 bytes
    assert workspace_usage(workspace) <= 40_960


async def test_parallel_writes_in_one_batch_cannot_all_pass_the_quota(workspace: Path) -> None:
    ctx = ToolContext(workspace, "s", Limits(max_workspace_bytes=100_000))
    batch = [ToolCall("write", {"path": f"f{i}", "content": "x" * 30_000}) for i in range(10)]
    results = await Executor(default_registry()).run_batch(batch, ctx)
    assert sum(r.status == "success" for r in results) == 3
    assert workspace_usage(workspace) <= 100_000
