"""A node's workspaces: in its store's namespace, removed at start and by the periodic sweep
when their session ended, and never another store's."""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.sessions.workspaces import NAMESPACE_KEY, WorkspaceSweeper
from gateway.store import open_store
from gateway.store.base import Store
from tests.edge.conftest import poll_until
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient
from tools.workspaces import (
    InvalidSessionId,
    is_workspace_name,
    namespace_kind,
    namespace_name,
    workspace_dir,
)

DAY = 86400.0


@pytest.fixture
async def store(store_kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    url = request.getfixturevalue("redis_url") if store_kind == "redis" else None
    opened = open_store(url, ttl=1.0)
    yield opened
    await opened.close()


def sid() -> str:
    return secrets.token_urlsafe(18)


def workspace(path: Path, *, age: float = 0.0) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "file.txt").write_text("kept by a tool")
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


_made: list[WorkspaceSweeper] = []


def sweeper(
    root: Path, store: Store, *, driven: frozenset[str] = frozenset(), ttl: float = 600
) -> WorkspaceSweeper:
    made = WorkspaceSweeper(root, store, driven=driven.__contains__, session_ttl=ttl)
    _made.append(made)
    return made


@pytest.fixture(autouse=True)
def _release_locks() -> Iterator[None]:
    """The in-process namespaces' locks the test's sweepers took are let go."""
    yield
    while _made:
        _made.pop().release()


async def test_only_workspaces_of_sessions_the_store_does_not_know_are_removed(
    store: Store, tmp_path: Path
) -> None:
    root = tmp_path / "workspaces"
    sweep = sweeper(root, store, driven=frozenset({driven := sid()}))
    own = await sweep.resolve()
    live, ended, recent = sid(), sid(), sid()
    await store.create_session(live, {"owner": "alice"})
    for name in (live, ended, driven):
        workspace(own / name, age=3600)
    workspace(own / recent)  # touched just now, its session already gone (not deleted)
    workspace(own / "not.a.session")  # a name no session id can have: never touched
    (own / "notes-from-the-operator").write_text("a file, not a workspace")

    # The periodic sweep trusts a recent mtime: that session cannot have idled out yet.
    assert await sweep.sweep(use_mtime=True) == [ended]
    assert await sweep.sweep(use_mtime=False) == [recent]
    left = sorted(p.name for p in own.iterdir())
    assert left == sorted([live, driven, "not.a.session", "notes-from-the-operator"])
    assert (own / live / "sub" / "file.txt").read_text() == "kept by a tool"


async def test_a_deleted_sessions_workspace_goes_at_the_next_sweep_whatever_its_age(
    store: Store, tmp_path: Path
) -> None:
    """A turn that raced the delete wrote the workspace again after every node removed it."""
    root = tmp_path / "workspaces"
    sweep = sweeper(root, store, ttl=DAY)
    own = await sweep.resolve()
    deleted, alive = sid(), sid()
    for name in (deleted, alive):
        await store.create_session(name, {"owner": "alice"})
    assert await store.delete_session(deleted)
    assert await store.were_deleted([deleted, alive, sid()]) == [True, False, False]
    workspace(own / deleted)  # written just now, by the racing turn
    workspace(own / alive)
    assert await sweep.sweep(use_mtime=True) == [deleted]
    assert [p.name for p in own.iterdir()] == [alive]


async def test_an_expired_session_loses_its_workspace(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    sweep = sweeper(root, store, ttl=1.0)
    session = sid()
    await store.create_session(session, {"owner": "alice"})
    workspace(await sweep.resolve() / session, age=3600)
    assert await sweep.sweep(use_mtime=True) == []  # the session still exists

    async def expired() -> bool:
        return await store.get_meta(session) is None

    await poll_until(expired, "the store's idle TTL (1 s) deletes the session silently")
    assert await sweep.sweep(use_mtime=True) == [session]
    assert not (sweep.workspace(session)).exists()


async def test_another_stores_workspaces_are_never_swept(store: Store, tmp_path: Path) -> None:
    """Two stores on one root: each sweeps its own namespace only, even at start."""
    root = tmp_path / "workspaces"
    mine = sweeper(root, store)
    other_store = open_store(None, ttl=1.0)  # another process's memory store, say
    other = sweeper(root, other_store)
    try:
        theirs = sid()
        await other_store.create_session(theirs, {"owner": "bob"})
        workspace(other.workspace(theirs), age=3600)
        ours = await mine.resolve()
        assert ours != other.namespace
        assert await mine.sweep(use_mtime=False) == []
        assert (other.workspace(theirs) / "sub" / "file.txt").exists()
    finally:
        other.release()
        await other_store.close()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_nodes_of_one_redis_share_its_namespace_and_keep_it_after_a_flush(
    store: Store, redis_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "workspaces"
    first = await sweeper(root, store).resolve()
    second_store = open_store(redis_url, ttl=1.0)
    try:
        assert await sweeper(root, second_store).resolve() == first
    finally:
        await second_store.close()
    assert namespace_kind(first.name) == "store"
    # A Redis that lost its data is told the namespace again by the next sweep, so
    # nodes started after the loss share it with those that ran before.
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushall()
        running = sweeper(root, store)
        running.namespace = first
        await running.sweep(use_mtime=True)
        assert (await client.get(f"rtgw:secret:{NAMESPACE_KEY}")).decode() == first.name[6:]
    finally:
        await client.aclose()


async def test_a_dead_processes_memory_namespace_is_reclaimed_a_live_ones_is_not(
    store: Store, tmp_path: Path
) -> None:
    root = tmp_path / "workspaces"
    live_store = open_store(None, ttl=1.0)
    live = sweeper(root, live_store)
    try:
        live_ws = workspace(live.workspace(sid()))
        dead = root / namespace_name("memory", secrets.token_urlsafe(12))
        workspace(dead / sid())
        (root / f"{dead.name}.lock").write_text("12345\n")  # nobody holds its lock
        half = root / namespace_name("memory", secrets.token_urlsafe(12))
        workspace(half / sid())  # its lock already gone (a sweep stopped half-way)
        mine = sweeper(root, store)
        assert sorted(await mine.sweep(use_mtime=False)) == sorted([dead.name, half.name])
        assert live_ws.exists() and not dead.exists() and not half.exists()
        assert not (root / f"{dead.name}.lock").exists()
        # Once its process lets go of the lock, the live one goes too.
        assert live.namespace is not None
        lock = root / f"{live.namespace.name}.lock"
        with lock.open() as held, pytest.raises(BlockingIOError):
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        live.release()
        assert await mine.sweep(use_mtime=True) == [live.namespace.name]
        assert not live_ws.exists()
    finally:
        live.release()
        await live_store.close()


async def test_workspaces_from_before_namespaces_go_only_when_untouched_for_the_ttl(
    store: Store, tmp_path: Path
) -> None:
    root = tmp_path / "workspaces"
    old, young = sid(), sid()
    workspace(root / old, age=2 * DAY)
    workspace(root / young, age=3600)
    sweep = sweeper(root, store, ttl=DAY)
    assert await sweep.sweep(use_mtime=False) == [old]
    assert (root / young).exists()


async def test_a_shared_store_that_has_not_answered_yet_works_in_the_root(
    redis_url: str, tmp_path: Path
) -> None:
    """Before its namespace is known a node's workspaces go to the root, which only
    an age of ``session_ttl`` ever sweeps; from then on into the namespace."""
    root = tmp_path / "workspaces"
    shared = open_store(redis_url, ttl=1.0)
    try:
        sweep = sweeper(root, shared)
        early = sid()
        assert sweep.workspace(early) == root / early
        namespace = await sweep.resolve()
        assert sweep.workspace(early) == namespace / early
    finally:
        await shared.close()


async def test_a_starting_node_removes_workspaces_of_sessions_that_ended(
    store_kind: str, gateway_factory: GatewayFactory, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    root = tmp_path / "workspaces"
    if store_kind == "redis":  # a session of this store that ended
        earlier = open_store(request.getfixturevalue("redis_url"))
        stale = workspace(await sweeper(root, earlier).resolve() / sid())
        await earlier.close()
    else:  # the memory store of a process that is gone
        stale = workspace(root / namespace_name("memory", secrets.token_urlsafe(12)) / sid())
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        await client.turn("/tool write " + '{"path": "a.txt", "content": "x"}')
        mine = gw.node.workspaces.workspace(client.sid)
        # The sweep removes the session's directory, then its emptied namespace.
        gone = stale if store_kind == "redis" else stale.parent
        await poll_until(lambda: not gone.exists(), "the start sweep (in the background)")
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


def test_a_namespace_is_never_a_session_id_and_says_its_kind() -> None:
    identity = secrets.token_urlsafe(12)
    for kind in ("store", "memory"):
        name = namespace_name(kind, identity)  # type: ignore[arg-type]
        assert namespace_kind(name) == kind and not is_workspace_name(name)
    assert namespace_kind(identity) is None and namespace_kind("store.x") is None
    with pytest.raises(ValueError, match="cannot name a directory"):
        namespace_name("store", "../../etc")
