"""Fixtures for the tools tests: a workspace, a directory outside it, and a caller.

Every test gets a fresh ``tmp_path`` with ``ws/`` (the session workspace) and
``outside/`` next to it holding ``secret.txt``: whatever a sandbox-escape test
tries, the proof of a leak would be that text showing up in a result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.calls import ToolCall, ToolResult
from tools.base import ToolContext
from tools.builtin import default_registry
from tools.executor import Executor

from .helpers import SECRET, Call


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace holding a secret file."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text(SECRET + "\n")
    return out


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace, session_id="test-session")


@pytest.fixture
def executor() -> Executor:
    return Executor(default_registry(enable_shell=True), timeout=30.0)


@pytest.fixture
def call(executor: Executor, ctx: ToolContext) -> Call:
    """``await call("read", path="a.txt")``: one call through the real executor."""

    async def run(name: str, **args: Any) -> ToolResult:
        return await executor.run_call(ToolCall(name=name, args=args), ctx)

    return run
