"""Workspaces of ended sessions are removed: at node start and by the periodic sweep."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.sessions.workspaces import WorkspaceSweeper
from gateway.store import open_store
from gateway.store.base import Store
from tests.edge.conftest import poll_until
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient
from tools.workspaces import InvalidSessionId, workspace_dir


@pytest.fixture
async def store(store_kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    url = request.getfixturevalue("redis_url") if store_kind == "redis" else None
    opened = open_store(url, ttl=1.0)
    yield opened
    await opened.close()


def sid() -> str:
    return secrets.token_urlsafe(18)


def workspace(root: Path, name: str, *, age: float = 0.0) -> Path:
    path = root / name
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "file.txt").write_text("kept by a tool")
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


async def test_only_workspaces_of_sessions_the_store_does_not_know_are_removed(
    store: Store, tmp_path: Path
) -> None:
    root = tmp_path / "workspaces"
    live, gone, driven, recent = sid(), sid(), sid(), sid()
    await store.create_session(live, {"owner": "alice"})
    for name in (live, gone, driven):
        workspace(root, name, age=3600)
    workspace(root, recent)  # touched just now, its session already gone
    workspace(root, "not.a.session")  # a name no session id can have: never touched
    (root / "notes-from-the-operator").write_text("a file, not a workspace")
    sweeper = WorkspaceSweeper(root, store, driven={driven}.__contains__, session_ttl=600)

    # The periodic sweep trusts a recent mtime: that session cannot have idled out yet.
    assert await sweeper.sweep(use_mtime=True) == [gone]
    assert sorted(await sweeper.sweep(use_mtime=False)) == [recent]
    left = sorted(p.name for p in root.iterdir())
    assert left == sorted([live, driven, "not.a.session", "notes-from-the-operator"])
    assert (root / live / "sub" / "file.txt").read_text() == "kept by a tool"


async def test_an_expired_session_loses_its_workspace(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    session = sid()
    await store.create_session(session, {"owner": "alice"})
    workspace(root, session, age=3600)
    sweeper = WorkspaceSweeper(root, store, driven=lambda _: False, session_ttl=1.0)
    assert await sweeper.sweep(use_mtime=True) == []  # the session still exists

    async def expired() -> bool:
        return await store.get_meta(session) is None

    await poll_until(expired, "the store's idle TTL (1 s) deletes the session silently")
    assert await sweeper.sweep(use_mtime=True) == [session]
    assert not (root / session).exists()


async def test_a_starting_node_removes_workspaces_of_sessions_that_ended(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    root = tmp_path / "workspaces"
    stale = workspace(root, sid())
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        await client.turn("/tool write " + '{"path": "a.txt", "content": "x"}')
        mine = root / client.sid
        await poll_until(lambda: not stale.exists(), "the start sweep (in the background)")
        # A sweep now keeps the workspace of the live session.
        assert await gw.node.workspaces.sweep(use_mtime=False) == []
        assert (mine / "a.txt").read_text() == "x"
        await client.close()


def test_session_ids_that_are_not_safe_names_name_no_workspace(tmp_path: Path) -> None:
    good = sid()
    assert workspace_dir(tmp_path, good) == tmp_path / good
    for bad in ["..", "../etc", "a/b/c/d/e", "", ".hidden-session", "x" * 200, "short"]:
        with pytest.raises(InvalidSessionId, match="cannot name a workspace"):
            workspace_dir(tmp_path, bad)
