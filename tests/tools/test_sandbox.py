"""No path the model sends lets a file tool reach outside the session's workspace.

Each escape is tried through the real tools, and a refusal is only half the
check: the secret next to the workspace must not appear in any result and
files outside must not be created or changed.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from protocol.calls import ToolCall
from tools.base import ToolContext, ToolFailure
from tools.builtin import default_registry
from tools.executor import Executor
from tools.sandbox import resolve, workspace_root

from .helpers import SECRET, Call, failed, ok

OUTSIDE_MSG = "is outside the workspace; use a path relative to the workspace root"


def path_args(tool: str, path: str) -> dict[str, Any]:
    """Minimal valid args for ``tool`` aimed at ``path``."""
    return {
        "read": {"path": path},
        "write": {"path": path, "content": "pwned"},
        "edit": {"path": path, "old": "secret", "new": "pwned"},
        "list": {"path": path},
        "find": {"pattern": "**/*", "path": path},
        "search": {"pattern": "secret", "path": path},
    }[tool]


ALL_TOOLS = ["read", "write", "edit", "list", "find", "search"]


@pytest.mark.parametrize("tool", ALL_TOOLS)
async def test_absolute_paths_are_refused(
    tool: str, call: Call, outside: Path, workspace: Path
) -> None:
    target = outside / "secret.txt" if tool in ("read", "write", "edit") else outside
    message = failed(await call(tool, **path_args(tool, str(target))))
    assert "is absolute; paths are relative to the workspace root" in message
    assert SECRET not in message
    assert (outside / "secret.txt").read_text() == SECRET + "\n"


@pytest.mark.parametrize("tool", ALL_TOOLS)
@pytest.mark.parametrize("escape", ["..", "../outside", "sub/../../outside/secret.txt"])
async def test_dot_dot_out_of_the_workspace_is_refused(
    tool: str, escape: str, call: Call, outside: Path, workspace: Path
) -> None:
    (workspace / "sub").mkdir()
    message = failed(await call(tool, **path_args(tool, escape)))
    assert f"path {escape!r} {OUTSIDE_MSG}" in message
    assert SECRET not in message
    assert (outside / "secret.txt").read_text() == SECRET + "\n"


async def test_dot_dot_that_stays_inside_is_fine(call: Call, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    (workspace / "a.txt").write_text("inside\n")
    assert ok(await call("read", path="sub/../a.txt")) == "inside\n"
    assert ok(await call("list", path="sub/.."))["path"] == "."


@pytest.mark.parametrize("tool", ALL_TOOLS)
async def test_symlink_to_an_outside_directory_is_refused(
    tool: str, call: Call, outside: Path, workspace: Path
) -> None:
    (workspace / "link").symlink_to(outside, target_is_directory=True)
    path = "link" if tool in ("list", "find", "search") else "link/secret.txt"
    message = failed(await call(tool, **path_args(tool, path)))
    assert OUTSIDE_MSG in message
    assert SECRET not in message
    assert (outside / "secret.txt").read_text() == SECRET + "\n"


@pytest.mark.parametrize("tool", ["read", "write", "edit", "search"])
async def test_symlink_to_an_outside_file_is_refused(
    tool: str, call: Call, outside: Path, workspace: Path
) -> None:
    (workspace / "notes.txt").symlink_to(outside / "secret.txt")
    message = failed(await call(tool, **path_args(tool, "notes.txt")))
    assert f"path 'notes.txt' {OUTSIDE_MSG}" in message
    assert (outside / "secret.txt").read_text() == SECRET + "\n"


async def test_write_through_a_symlinked_parent_creates_nothing_outside(
    call: Call, outside: Path, workspace: Path
) -> None:
    (workspace / "out").symlink_to(outside, target_is_directory=True)
    message = failed(await call("write", path="out/deep/new.txt", content="x"))
    assert OUTSIDE_MSG in message
    assert os.listdir(outside) == ["secret.txt"]


async def test_dangling_symlink_to_outside_is_not_followed_to_create_a_file(
    call: Call, outside: Path, workspace: Path
) -> None:
    (workspace / "new.txt").symlink_to(outside / "planted.txt")  # target does not exist yet
    message = failed(await call("write", path="new.txt", content="planted"))
    assert OUTSIDE_MSG in message
    assert not (outside / "planted.txt").exists()


async def test_symlink_that_stays_inside_works(call: Call, workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "real" / "a.txt").write_text("hello\n")
    (workspace / "alias").symlink_to(workspace / "real", target_is_directory=True)
    assert ok(await call("read", path="alias/a.txt")) == "hello\n"
    assert ok(await call("write", path="alias/b.txt", content="hi"))["path"] == "real/b.txt"
    assert (workspace / "real" / "b.txt").read_text() == "hi"


async def test_symlink_loop_is_a_clean_failure(call: Call, workspace: Path) -> None:
    (workspace / "loop").symlink_to(workspace / "loop")
    assert "path 'loop' cannot be resolved" in failed(await call("read", path="loop"))


async def test_walking_tools_skip_links_that_point_outside(
    call: Call, outside: Path, workspace: Path
) -> None:
    (workspace / "own.txt").write_text("my own secret\n")
    (workspace / "out_dir").symlink_to(outside, target_is_directory=True)
    (workspace / "out_file.txt").symlink_to(outside / "secret.txt")

    listed = ok(await call("list"))
    assert [e["name"] for e in listed["entries"]] == ["own.txt"]

    found = ok(await call("find", pattern="**/*"))
    assert found["files"] == ["own.txt"]

    searched = ok(await call("search", pattern="secret"))
    assert searched["matches"] == ["own.txt:1:my own secret"]


async def test_walking_tools_do_not_descend_into_symlinked_directories(
    call: Call, workspace: Path
) -> None:
    """A link back up the tree would otherwise loop, or report every file twice."""
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("x = 1\n")
    (workspace / "src" / "again").symlink_to(workspace, target_is_directory=True)
    assert ok(await call("find", pattern="**/*.py"))["files"] == ["src/a.py"]
    assert ok(await call("search", pattern="x = 1"))["matches"] == ["src/a.py:1:x = 1"]


def test_resolve_refuses_nul_bytes_and_returns_resolved_paths(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    with pytest.raises(ToolFailure, match="NUL byte"):
        resolve(root, "a\0b")
    assert resolve(root, "a/./b/../c") == root / "a" / "c"
    assert resolve(root, ".") == root
    assert resolve(root, "") == root


def test_missing_workspace_is_an_operator_error(tmp_path: Path) -> None:
    with pytest.raises(ToolFailure, match="operator must create it"):
        workspace_root(tmp_path / "nope")


# The read tool in a process of its own, as a user file permissions apply to: root
# drops to the uid and gid given after everything is imported (the interpreter may
# live where only root can read).
_READ_LOCKED = """
import asyncio, concurrent.futures.thread, os, sys
from pathlib import Path
from protocol.calls import ToolCall
from tools.base import ToolContext
from tools.builtin import default_registry
from tools.executor import Executor

if len(sys.argv) > 2:
    os.setgroups([])
    os.setgid(int(sys.argv[3]))
    os.setuid(int(sys.argv[2]))

async def main() -> None:
    context = ToolContext(workspace=Path(sys.argv[1]), session_id="permissions")
    call = ToolCall(name="read", args={"path": "locked.txt"})
    result = await Executor(default_registry(), timeout=20.0).run_call(call, context)
    print(result.status, result.content)

asyncio.run(main())
"""


def test_unreadable_file_is_a_clean_failure() -> None:
    """Root reads any file, so as root the tool runs as ``nobody`` (its own process)."""
    workspace = Path(tempfile.mkdtemp(prefix="rtgw-permissions-"))  # /tmp: nobody may enter
    try:
        locked = workspace / "locked.txt"
        locked.write_text("the locked text")
        run_as: list[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            for path in (workspace, locked):
                os.chown(path, nobody.pw_uid, nobody.pw_gid)
            run_as = [str(nobody.pw_uid), str(nobody.pw_gid)]
        locked.chmod(0)
        done = subprocess.run(
            [sys.executable, "-c", _READ_LOCKED, str(workspace), *run_as],
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            check=False,
        )
        assert done.returncode == 0, done.stderr
        status, _, message = done.stdout.strip().partition(" ")
        assert status == "failure", done.stdout
        assert "permission denied" in message and "the locked text" not in message
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


# --- hard links and races (issue 13) -------------------------------------------


@pytest.mark.parametrize("tool", ["write", "edit"])
async def test_a_hard_link_to_an_outside_file_is_never_written(
    tool: str, call: Call, outside: Path, workspace: Path
) -> None:
    os.link(outside / "secret.txt", workspace / "notes.txt")
    message = failed(await call(tool, **path_args(tool, "notes.txt")))
    assert "has 2 hard links" in message and "write a new file instead" in message
    assert (outside / "secret.txt").read_text() == SECRET + "\n"


async def test_fifos_and_devices_are_refused_without_hanging(call: Call, workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")
    for tool in ("read", "write", "edit"):
        assert "not a regular file" in failed(await call(tool, **path_args(tool, "pipe")))


def _swap_between_dir_and_symlink(workspace: Path, outside: Path, stop: threading.Event) -> int:
    """Flip ``d`` between a real directory and a symlink to ``outside`` until ``stop``."""
    d, parked, link = workspace / "d", workspace / "d.real", workspace / "d.link"
    flips = 0
    while not stop.is_set():
        with contextlib.suppress(OSError):
            os.symlink(outside, link)
        with contextlib.suppress(OSError):
            os.rename(d, parked)  # fails if d.real is still parked (d was recreated)
        with contextlib.suppress(OSError):
            os.rename(link, d)  # d is now the symlink out
            flips += 1
        if d.is_symlink():
            os.unlink(d)
        elif d.is_dir() and parked.is_dir():
            shutil.rmtree(d, ignore_errors=True)  # a write re-created d while parked: drop it
        with contextlib.suppress(OSError):
            os.rename(parked, d)  # d is the directory again
    return flips


async def test_racing_symlink_swaps_never_lead_a_write_or_read_outside(
    outside: Path, workspace: Path
) -> None:
    """A probe escaped in 6-31 of 3,000 attempts when the checked path was reopened by name."""
    (workspace / "d").mkdir()
    (workspace / "d" / "secret.txt").write_text("the inside file\n")
    ctx = ToolContext(workspace=workspace, session_id="race")
    executor = Executor(default_registry())
    stop = threading.Event()
    flips: list[int] = []
    flipper = threading.Thread(
        target=lambda: flips.append(_swap_between_dir_and_symlink(workspace, outside, stop)),
        daemon=True,
    )
    flipper.start()
    leaked: list[str] = []
    statuses: collections.Counter[tuple[str, str]] = collections.Counter()
    try:
        for i in range(100):  # 3,000 attempts, as the probe made
            batch = [
                call
                for j in range(10)
                for call in (
                    ToolCall("write", {"path": f"d/planted{i}-{j}.txt", "content": "pwned"}),
                    ToolCall("edit", {"path": "d/secret.txt", "old": "secret", "new": "pwned"}),
                    ToolCall("read", {"path": "d/secret.txt"}),
                )
            ]
            for result in await executor.run_batch(batch, ctx):
                statuses[result.tool, result.status] += 1
                if SECRET in str(result.content):
                    leaked.append(str(result.content))
    finally:
        stop.set()
        flipper.join(10)
    assert flips and flips[0] > 100, "the race did not run"
    assert statuses["read", "success"] and statuses["read", "failure"], statuses
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == SECRET + "\n"
    assert leaked == []
