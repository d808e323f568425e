"""Confining file tools to the session's workspace directory.

The model chooses every path, so a path is untrusted input: an absolute path,
a ``..`` that climbs out, or a symlink inside the workspace that points
elsewhere would otherwise let it read or overwrite any file the gateway can.
Every path argument goes through ``resolve``: it is joined to the workspace,
fully resolved (symlinks followed, including a dangling one whose target does
not exist yet, so a write cannot create a file through it), and must still be
inside the resolved workspace. Tools then open the *resolved* path with
``open_beneath``: from a descriptor of the workspace, one component at a time,
each with ``O_NOFOLLOW`` relative to its parent's descriptor (``openat``). So a
directory or file swapped for a symlink between the check and the use makes
the open fail instead of leading outside (a probe escaped in 6-31 of 3,000
racing attempts when the resolved path was opened by name). Files
are opened ``O_NONBLOCK`` (a FIFO cannot hang the worker) and must be regular
files; a file with more than one hard link is never written, since another
of its names may be outside the workspace. Reading one is allowed: making
such a link to a file one could not read needs a shell, which can read it anyway.

Walking tools (``list``, ``find``, ``search``) use ``walk``/``entry_inside``,
which never descend into a symlinked directory and skip any symlink that
resolves outside, so they neither reveal nor reach files outside.

This confines the built-in file tools; it does not confine ``shell``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from .base import ToolFailure

__all__ = [
    "display",
    "entry_inside",
    "is_binary",
    "open_beneath",
    "open_regular",
    "resolve",
    "walk",
    "workspace_root",
]

_SNIFF_BYTES = 8192


def workspace_root(workspace: Path) -> Path:
    """The workspace, resolved; a missing workspace is a failure the operator must fix."""
    root = workspace.resolve()
    if not root.is_dir():
        raise ToolFailure(
            f"the session workspace {workspace} does not exist; "
            "the gateway operator must create it before tools can use files"
        )
    return root


def resolve(root: Path, raw: str) -> Path:
    """The resolved path for the model's ``raw`` path, refused if it leaves ``root``.

    ``root`` must already be resolved (``workspace_root``). Raises
    ``ToolFailure`` for an absolute path, a path that climbs out with ``..``,
    and a path that reaches outside through a symlink (for an existing or a
    not-yet-existing target, and through a symlinked parent directory).
    """
    if "\0" in raw:
        raise ToolFailure(f"path {raw!r} contains a NUL byte; send a plain relative path")
    if os.path.isabs(raw):
        raise ToolFailure(
            f"path {raw!r} is absolute; paths are relative to the workspace root "
            "(for example 'src/main.py', or '.' for the root itself)"
        )
    joined = root / raw
    try:
        resolved = joined.resolve()
    except (OSError, RuntimeError) as exc:  # symlink loop
        raise ToolFailure(f"path {raw!r} cannot be resolved ({exc}); use another path") from None
    if not resolved.is_relative_to(root):
        raise ToolFailure(
            f"path {raw!r} is outside the workspace; "
            "use a path relative to the workspace root that stays inside it"
        )
    # Redundant after a full resolve, but cheap and it states the rule for writes:
    # the directory a file is created in must itself be inside the workspace.
    if resolved != root and not resolved.parent.resolve().is_relative_to(root):
        raise ToolFailure(
            f"path {raw!r} is in a directory outside the workspace; "
            "use a path relative to the workspace root that stays inside it"
        )
    return resolved


def open_beneath(root: Path, path: Path, flags: int, *, make_parents: bool = False) -> int:
    """A descriptor for ``path`` (resolved, inside ``root``), never through a symlink.

    Each directory from ``root`` down is opened with ``O_NOFOLLOW |
    O_DIRECTORY`` relative to the previous one, and the last component with
    ``flags | O_NOFOLLOW``; a symlink anywhere raises ``OSError(ELOOP)`` (or
    ``ENOTDIR``). ``make_parents`` creates missing directories on the way,
    with ``mkdir`` relative to the parent's descriptor (which does not follow
    a symlink either). The caller owns the returned descriptor.
    """
    parts = path.relative_to(root).parts
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is the workspace root")
    directory_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, directory_flags, dir_fd=fd)
            except FileNotFoundError:
                if not make_parents:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
                child = os.open(part, directory_flags, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=fd)
    finally:
        os.close(fd)


def open_regular(
    root: Path, path: Path, flags: int, *, make_parents: bool = False, for_writing: bool = False
) -> tuple[int, os.stat_result]:
    """``open_beneath`` for a regular file (``O_NONBLOCK``), with its ``fstat``.

    Raises ``IsADirectoryError`` for a directory, ``ToolFailure`` for any
    other non-regular file, and, with ``for_writing``, for a file with more
    than one hard link.
    """
    fd = open_beneath(root, path, flags | os.O_NONBLOCK, make_parents=make_parents)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ToolFailure(
                f"{display(root, path)!r} is not a regular file (a device, socket or FIFO); "
                "file tools only open regular files"
            )
        if for_writing and st.st_nlink > 1:
            raise ToolFailure(
                f"{display(root, path)!r} has {st.st_nlink} hard links, and another of its names "
                "may be outside the workspace, so it is not written; write a new file instead"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def display(root: Path, path: Path) -> str:
    """``path`` as the model should write it: relative to the root, with ``/``."""
    rel = path.relative_to(root)
    return PurePosixPath(rel).as_posix() if rel.parts else "."


def entry_inside(root: Path, entry: os.DirEntry[str]) -> bool:
    """False for a symlink whose target is outside ``root`` (or cannot be resolved)."""
    if not entry.is_symlink():
        return True
    try:
        return Path(entry.path).resolve().is_relative_to(root)
    except (OSError, RuntimeError):
        return False


def walk(root: Path, top: Path) -> Iterator[Path]:
    """Every regular file under ``top`` (resolved, inside ``root``), in sorted order.

    Directories are visited depth-first with names sorted, so output is
    stable and a cap keeps a predictable prefix. Symlinked directories are not
    descended into (no loops, no escapes); a symlinked file is yielded under
    its link name if its target is a regular file inside ``root``.
    """
    if top.is_file():
        yield top
        return
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue  # unreadable or vanished directory: skip, as find/grep do
        subdirs = []
        for entry in entries:
            if not entry_inside(root, entry):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=True):
                    yield Path(entry.path)
            except OSError:
                continue
        stack.extend(reversed(subdirs))


def is_binary(fd: int) -> bool:
    """Whether the open file looks binary: a NUL byte in its first 8 KiB, as git and grep decide."""
    return b"\0" in os.pread(fd, _SNIFF_BYTES, 0)
