"""Removing the tool workspaces of sessions that ended.

A session's workspace (``workspace_root/SID``) outlives its process and,
without this, the session too: the store forgets a session silently when its
idle TTL runs out, so nothing tells a node the session is gone. Each node
therefore sweeps ``workspace_root``: at start (sessions that ended while no
node ran, all sessions of a memory store) and every ``every`` seconds after.

Other nodes may share the root, so a directory is removed only when the
store says its session does not exist (no meta) — never on a guess, never
while the store is down, never for a session this node drives. A
directory's mtime is a hint for the periodic sweeps: a session idles out
``session_ttl`` after its last activity, and creating or removing files in
the workspace is activity, so a directory touched within the TTL is skipped
without asking the store. Only names that can be session ids
(``tools.workspaces.is_workspace_name``) are ever considered.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from gateway.store.base import SessionMeta, StoreError
from tools.workspaces import is_workspace_name

__all__ = ["SWEEP_EVERY", "WorkspaceSweeper"]

log = logging.getLogger("gateway.sessions.workspaces")

SWEEP_EVERY: Final = 600.0
"""Seconds between two sweeps of a node (the first runs at start)."""


class WorkspaceSweeper:
    """Finds and removes workspaces whose session no longer exists (see the module docstring).

    ``driven(sid)`` tells whether this node drives ``sid`` (never removed);
    ``clock`` is wall time, compared with directory mtimes.
    """

    def __init__(
        self,
        root: Path,
        store: SessionMeta,
        *,
        driven: Callable[[str], bool],
        session_ttl: float,
        every: float = SWEEP_EVERY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.store = store
        self.driven = driven
        self.session_ttl = session_ttl
        self.every = every
        self.clock = clock

    async def run(self) -> None:
        """Sweep now, then every ``every`` seconds, until cancelled."""
        await self.sweep(use_mtime=False)
        while True:
            await asyncio.sleep(self.every)
            await self.sweep(use_mtime=True)

    async def sweep(self, *, use_mtime: bool) -> list[str]:
        """Remove the workspaces of sessions the store does not know; returns their ids.

        ``use_mtime``: skip directories touched within ``session_ttl`` (their
        session cannot have idled out yet) without asking the store.
        """
        try:
            candidates = await asyncio.to_thread(self._candidates, use_mtime)
        except OSError as exc:
            log.warning("cannot list the workspaces in %s: %s", self.root, exc)
            return []
        removed: list[str] = []
        for sid in candidates:
            if self.driven(sid):
                continue
            try:
                exists = await self.store.get_meta(sid) is not None
            except StoreError as exc:
                log.info("workspace sweep paused, the store is unavailable: %s", exc)
                break
            if exists or self.driven(sid):
                continue
            await asyncio.to_thread(shutil.rmtree, self.root / sid, True)
            removed.append(sid)
        if removed:
            log.info(
                "removed %d workspace(s) of sessions that ended: %s",
                len(removed),
                ", ".join(removed[:10]) + (" …" if len(removed) > 10 else ""),
            )
        return removed

    def _candidates(self, use_mtime: bool) -> list[str]:
        """Directory names under the root that could be sessions' (in a worker thread)."""
        if not self.root.is_dir():
            return []
        recent = self.clock() - self.session_ttl
        found: list[str] = []
        for entry in self.root.iterdir():
            name = entry.name
            if not is_workspace_name(name):
                continue
            try:
                info = entry.lstat()
            except OSError:
                continue
            if not entry.is_dir() or entry.is_symlink():
                continue
            if use_mtime and info.st_mtime > recent:
                continue
            found.append(name)
        return found
