"""The tool workspaces of a node's store: where they live, and removing those of ended sessions.

A session's workspace outlives its process and, without this, the session
too: the store forgets a session silently when its idle TTL runs out, so
nothing tells a node the session is gone. Each node therefore sweeps: at
start and every ``every`` seconds after.

Several nodes may share ``workspace_root`` — nodes of one store (they may
drive each other's sessions) and nodes of other stores (a second gateway on
the same machine with its default root). A node asks its own store whether a
session exists, and another store's sessions are unknown to it, so each
store's workspaces live in a directory of their own,
``workspace_root/NAMESPACE/SID`` (``tools.workspaces.namespace_name``), and a
node sweeps only its store's:

- ``store.ID``: a shared store (Redis). ``ID`` is kept in the store (the
  first node's random candidate wins, ``Store.shared_secret``), so every node
  of the store agrees on it and a session keeps its files when it moves
  between nodes on one machine (or on shared storage).
- ``memory.ID``: an in-process store, whose sessions end with its process.
  The process holds an ``flock`` on ``memory.ID.lock`` for its life; a
  namespace whose lock anyone can take belongs to a dead process and is
  removed whole by whichever node sweeps next.

In its own namespace a node removes a directory only when the store says its
session does not exist (no meta) — never on a guess, never while the store is
down, never for a session this node drives. A directory's mtime is a hint
for the periodic sweeps: a session idles out ``session_ttl`` after its last
activity, and creating or removing files in the workspace is activity, so a
directory touched within the TTL is kept unless its session was deleted
(``Store.were_deleted``, the delete's fence): a turn that raced the delete
on a node that missed the ``Deleted`` message (its subscription was down
while the store restarted) may have written it again after every node
removed it. Directories straight under the root are from before namespaces:
whichever store they belonged to, they are removed once untouched for
``session_ttl``. Another shared store's namespace is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from gateway.store.base import Store, StoreError
from tools.workspaces import is_workspace_name, namespace_kind, namespace_name, workspace_dir

__all__ = ["NAMESPACE_KEY", "SWEEP_EVERY", "WorkspaceSweeper"]

log = logging.getLogger("gateway.sessions.workspaces")

SWEEP_EVERY: Final = 600.0
"""Seconds between two sweeps of a node (the first runs at start)."""
NAMESPACE_KEY: Final = "workspace-namespace"
"""The name under which a shared store keeps the identity of its workspaces' namespace."""
_LOCK: Final = ".lock"


class WorkspaceSweeper:
    """This node's store's workspaces: where a session's is, and the sweeps (module docstring).

    ``driven(sid)`` tells whether this node drives ``sid`` (never removed);
    ``clock`` is wall time, compared with directory mtimes.
    """

    def __init__(
        self,
        root: Path,
        store: Store,
        *,
        driven: Callable[[str], bool],
        session_ttl: float,
        every: float = SWEEP_EVERY,
        retry_delay: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.store = store
        self.driven = driven
        self.session_ttl = session_ttl
        self.every = every
        self.retry_delay = retry_delay
        self.clock = clock
        # A memory store's sessions end with this process: its namespace is claimed
        # with a lock here, at once; a shared store's is read from the store.
        self._in_process = store.kind == "memory"
        self.namespace: Path | None = None  # this store's directory, once known
        self._lock_fd: int | None = None
        self._warned_early = False

    # ------------------------------------------------------------------ where

    def workspace(self, sid: str) -> Path:
        """The workspace directory of ``sid`` (not created); ``InvalidSessionId`` for a bad id.

        Until a shared store has answered with its namespace (the node's first
        sweep asks it at start, before any session is served unless the
        store was down then) the root itself is used: a workspace there is
        only ever removed once untouched for ``session_ttl``.
        """
        namespace = self.namespace
        if namespace is None and self._in_process:
            namespace = self._claim()
        if namespace is None:
            if not self._warned_early:
                self._warned_early = True
                log.warning(
                    "the store has not named this node's workspace namespace yet; "
                    "session %s works in %s",
                    sid,
                    self.root,
                )
            namespace = self.root
        return workspace_dir(namespace, sid)

    async def remove(self, sid: str) -> None:
        """The session was deleted: its workspace goes (from before namespaces too)."""
        try:
            paths = [self.workspace(sid), workspace_dir(self.root, sid)]
        except ValueError:
            return
        for path in paths:
            if path.is_dir():
                await asyncio.to_thread(shutil.rmtree, path, True)

    async def resolve(self) -> Path:
        """This store's namespace directory, asking a shared store once. Raises ``StoreError``."""
        if self.namespace is not None:
            return self.namespace
        if self._in_process:
            return self._claim()
        identity = await self._identity(secrets.token_urlsafe(12))
        if self.namespace is None:
            self.namespace = self.root / namespace_name("store", identity)
            log.info("workspaces of this store: %s", self.namespace)
        return self.namespace

    async def _identity(self, candidate: str) -> str:
        stored = await self.store.shared_secret(NAMESPACE_KEY, candidate.encode())
        identity = stored.decode(errors="replace")
        if not is_workspace_name(identity):  # not one of ours: a name derived from it
            identity = hashlib.sha256(stored).hexdigest()[:32]
        return identity

    def _claim(self) -> Path:
        """A new ``memory.ID`` namespace, locked for this process's life.

        The lock file is made under a hidden name, locked, then renamed into
        place, so no sweep ever sees it unlocked while this process lives.
        """
        if self.namespace is not None:
            return self.namespace
        self.root.mkdir(parents=True, exist_ok=True)
        name = namespace_name("memory", secrets.token_urlsafe(12))
        hidden = self.root / f".{name}{_LOCK}"
        fd = os.open(hidden, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, f"{os.getpid()}\n".encode())
            os.rename(hidden, self.root / f"{name}{_LOCK}")
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(hidden)
            raise
        self._lock_fd = fd
        self.namespace = self.root / name
        self.namespace.mkdir(exist_ok=True)
        log.info("workspaces of this process's memory store: %s", self.namespace)
        return self.namespace

    def release(self) -> None:
        """Let the in-process namespace go (the next sweep of any node removes it)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    # ------------------------------------------------------------------ sweeps

    async def run(self) -> None:
        """Sweep now, then every ``every`` seconds, until cancelled."""
        try:
            while True:
                try:
                    await self.resolve()
                    break
                except StoreError as exc:
                    log.info("workspace namespace unknown, the store is unavailable: %s", exc)
                    await asyncio.sleep(self.retry_delay)
            await self.sweep(use_mtime=False)
            while True:
                await asyncio.sleep(self.every)
                await self.sweep(use_mtime=True)
        finally:
            self.release()

    async def sweep(self, *, use_mtime: bool) -> list[str]:
        """Remove what belongs to no live session; returns what went.

        Session ids (this store's workspaces and those from before
        namespaces) and namespace names (dead processes' memory stores).
        ``use_mtime``: a workspace of this store touched within
        ``session_ttl`` goes only if its session was deleted.
        """
        try:
            namespace = await self.resolve()
            if not self._in_process:
                await self._still_named(namespace)
        except StoreError as exc:
            log.info("workspace sweep skipped, the store is unavailable: %s", exc)
            return []
        try:
            removed = await self._sweep_own(namespace, use_mtime)
            removed += await asyncio.to_thread(self._sweep_root)
        except OSError as exc:
            log.warning("cannot sweep the workspaces in %s: %s", self.root, exc)
            return []
        if removed:
            log.info(
                "removed %d workspace(s) of sessions that ended: %s",
                len(removed),
                ", ".join(removed[:10]) + (" …" if len(removed) > 10 else ""),
            )
        return removed

    async def _still_named(self, namespace: Path) -> None:
        """Tell the store our namespace again: one that lost its data takes it back, so
        nodes started after the loss share it; if another won meanwhile, say so."""
        identity = await self._identity(namespace.name.partition(".")[2])
        if namespace_name("store", identity) != namespace.name:
            log.warning(
                "the store now names its workspaces %s (it lost its data?); this node "
                "keeps %s until it restarts",
                identity,
                namespace,
            )

    async def _sweep_own(self, namespace: Path, use_mtime: bool) -> list[str]:
        listing = await asyncio.to_thread(_workspaces_in, namespace)
        recent = self.clock() - self.session_ttl
        touched: list[str] = []
        untouched: list[str] = []
        for sid, mtime in listing:
            if not self.driven(sid):
                (touched if use_mtime and mtime > recent else untouched).append(sid)
        ended: list[str] = []
        try:
            if touched:
                deleted = await self.store.were_deleted(touched)
                ended += [sid for sid, gone in zip(touched, deleted, strict=True) if gone]
            for sid in untouched:
                if await self.store.get_meta(sid) is None:
                    ended.append(sid)
        except StoreError as exc:
            log.info("workspace sweep paused, the store is unavailable: %s", exc)
        removed: list[str] = []
        for sid in ended:
            if self.driven(sid):
                continue
            await asyncio.to_thread(shutil.rmtree, namespace / sid, True)
            removed.append(sid)
        return removed

    def _sweep_root(self) -> list[str]:
        """Directories from before namespaces, and dead processes' namespaces (in a thread)."""
        if not self.root.is_dir():
            return []
        recent = self.clock() - self.session_ttl
        own = self.namespace.name if self.namespace is not None else ""
        removed: list[str] = []
        for entry in self.root.iterdir():
            name = entry.name
            if is_workspace_name(name):
                info = _dir_info(entry)
                if info is not None and info < recent and not self.driven(name):
                    shutil.rmtree(entry, True)
                    removed.append(name)
            elif name.endswith(_LOCK) and namespace_kind(name[: -len(_LOCK)]) == "memory":
                namespace = name[: -len(_LOCK)]
                if namespace != own and _reclaim(self.root, namespace):
                    removed.append(namespace)
            elif (
                namespace_kind(name) == "memory"
                and name != own
                and not (self.root / f"{name}{_LOCK}").exists()
                and entry.is_dir()
            ):
                # Its lock went with a sweep that stopped half-way: its process is dead.
                shutil.rmtree(entry, True)
                removed.append(name)
        return removed


def _dir_info(entry: Path) -> float | None:
    """The mtime of a real directory (not a symlink); None otherwise."""
    try:
        info = entry.lstat()
    except OSError:
        return None
    if not entry.is_dir() or entry.is_symlink():
        return None
    return info.st_mtime


def _workspaces_in(namespace: Path) -> list[tuple[str, float]]:
    """``(sid, mtime)`` of the directories in a namespace that can be workspaces."""
    if not namespace.is_dir():
        return []
    found: list[tuple[str, float]] = []
    for entry in namespace.iterdir():
        if is_workspace_name(entry.name):
            mtime = _dir_info(entry)
            if mtime is not None:
                found.append((entry.name, mtime))
    return found


def _reclaim(root: Path, namespace: str) -> bool:
    """Remove a memory namespace whose lock nobody holds (its process died)."""
    lock = root / f"{namespace}{_LOCK}"
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its process lives
        shutil.rmtree(root / namespace, True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        return True
    finally:
        os.close(fd)
