"""The per-session workspace quota: how many bytes its files hold, checked before growth.

A model once turned 110 kB of output into a 1 GB file with one ``edit``, and
nothing stopped a loop of ``write`` calls from filling the node's disk, which
every session on it shares. So every tool that grows the workspace
asks ``reserve`` first, under a per-workspace lock so that the calls of one
``<execute>`` batch, which run in parallel, cannot all pass the same check.

Usage is the apparent size (``st_size``) of the regular files under the
workspace, each inode counted once, symlinks not followed: what the files
hold, not the blocks the disk allocated (a sparse file counts in full, so the
measure errs towards refusing). Measuring walks the tree: ~0.04 s per 10,000
files, done in the tool's worker thread.

Every entry costs at least ``ENTRY_BYTES``, a filesystem block: a file, however
small, and a directory. Counted by bytes alone, empty files (and the parent
directories ``write`` makes) cost nothing, and a session made hundreds a minute:
inodes on a disk every session shares, without bound.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from .base import Limits, ToolFailure

__all__ = ["ENTRY_BYTES", "over_quota_message", "reserve", "workspace_usage"]

ENTRY_BYTES = 4096
"""What an entry of the workspace (a file, a directory, a link) counts at least."""

_locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_locks_guard = threading.Lock()


def workspace_usage(root: Path) -> int:
    """Bytes held by the regular files under ``root`` (hard links counted once)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                        total += ENTRY_BYTES
                    elif not stat.S_ISREG(st.st_mode):
                        total += ENTRY_BYTES
                    elif (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += max(st.st_size, ENTRY_BYTES)
        except OSError:
            continue  # unreadable or vanished directory
    return total


def over_quota_message(usage: int, limits: Limits) -> str:
    return (
        f"the workspace holds {usage:,} bytes, over its {limits.max_workspace_bytes:,}-byte "
        "quota; delete files you no longer need before writing more"
    )


@contextlib.contextmanager
def reserve(
    root: Path,
    limits: Limits,
    *,
    old_size: int | None,
    new_size: int,
    what: str,
    new_dirs: int = 0,
) -> Iterator[None]:
    """Hold the workspace's lock while a file of ``old_size`` bytes (None: none yet)
    becomes ``new_size``, with ``new_dirs`` directories made for it.

    Raises ``ToolFailure`` (before anything is written) if that would take
    the workspace over ``limits.max_workspace_bytes``. Shrinking is always
    allowed, so a model over its quota can still make room.
    """
    old = 0 if old_size is None else max(old_size, ENTRY_BYTES)
    new = max(new_size, ENTRY_BYTES) + new_dirs * ENTRY_BYTES
    with _lock_for(root):
        if new > old:
            usage = workspace_usage(root)
            after = usage - old + new
            if after > limits.max_workspace_bytes:
                raise ToolFailure(
                    f"cannot {what}: the workspace would hold {after:,} bytes, over its "
                    f"{limits.max_workspace_bytes:,}-byte quota (it holds {usage:,} now; "
                    f"every file and directory counts {ENTRY_BYTES:,} at least); "
                    "write less, or delete files you no longer need"
                )
        yield


def _lock_for(root: Path) -> threading.Lock:
    with _locks_guard:
        lock = _locks.get(str(root))
        if lock is None:
            lock = threading.Lock()
            _locks[str(root)] = lock
        return lock
