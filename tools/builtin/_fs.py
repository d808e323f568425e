"""Helpers the file tools share: OS errors as ``ToolFailure``, work in a thread.

File I/O blocks, and one big read or a walk over a large tree must not stall
the event loop that streams every other session's tokens, so each tool does
its file work in one synchronous function run by ``in_thread``. A thread
cannot be killed, so walking functions get a ``threading.Event`` that is set
when the call ends (timeout or user cancel) and check it between files.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Concatenate, Final, ParamSpec, TypeVar

from tools.base import ToolFailure

__all__ = ["Stop", "decode_text", "in_thread", "os_errors", "read_whole", "write_whole"]

P = ParamSpec("P")
R = TypeVar("R")

Stop = threading.Event


TOOL_THREADS: Final = 8
"""Threads the file tools of all sessions share: their own, not the loop's default
executor, which also inflates request bodies and removes workspaces."""
THREADS_PER_WORKSPACE: Final = 2
"""Of those, a session's (its workspace's) at most: eight slow regex searches of one
session held every thread, and every other session's ``list`` timed out."""

_pool: Final = ThreadPoolExecutor(TOOL_THREADS, thread_name_prefix="file-tool")
_shares: Final[weakref.WeakValueDictionary[Path, asyncio.Semaphore]] = weakref.WeakValueDictionary()


async def in_thread(
    fn: Callable[Concatenate[Stop, Path, P], R], workspace: Path, *args: P.args, **kwargs: P.kwargs
) -> R:
    """``fn(stop, workspace, *args, **kwargs)`` in a file-tool thread, at most
    ``THREADS_PER_WORKSPACE`` at once for ``workspace``; ``stop`` is set once we stop
    waiting (a timeout counts the wait for a thread too)."""
    share = _shares.get(workspace)
    if share is None:
        share = _shares[workspace] = asyncio.Semaphore(THREADS_PER_WORKSPACE)
    stop = Stop()
    try:
        async with share:
            call = functools.partial(fn, stop, workspace, *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(_pool, call)
    finally:
        stop.set()


@contextlib.contextmanager
def os_errors(action: str, raw: str) -> Iterator[None]:
    """Turn an ``OSError`` while doing ``action`` on ``raw`` into a failure the model can act on."""
    try:
        yield
    except FileNotFoundError:
        raise ToolFailure(
            f"cannot {action} {raw!r}: no such file or directory; "
            "use list or find to see which paths exist"
        ) from None
    except NotADirectoryError:
        raise ToolFailure(
            f"cannot {action} {raw!r}: a part of the path is a file, not a directory; "
            "check the path with list"
        ) from None
    except IsADirectoryError:
        raise ToolFailure(
            f"cannot {action} {raw!r}: it is a directory; use list to see what it contains"
        ) from None
    except PermissionError:
        raise ToolFailure(
            f"cannot {action} {raw!r}: permission denied; choose another path"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolFailure(
                f"cannot {action} {raw!r}: a part of the path became a symlink while it was "
                "being opened (file tools never follow one there); check it with list"
            ) from None
        if exc.errno == errno.ENXIO:  # a FIFO with no reader, opened O_NONBLOCK
            raise ToolFailure(
                f"cannot {action} {raw!r}: it is not a regular file (a device, socket or FIFO); "
                "file tools only open regular files"
            ) from None
        if exc.errno == errno.EFBIG:
            raise ToolFailure(
                f"cannot {action} {raw!r}: the file would be too large for this system"
            ) from None
        raise ToolFailure(f"cannot {action} {raw!r}: {exc.strerror or exc}") from None


def read_whole(fd: int, size: int) -> bytes:
    """All ``size`` bytes of an open file (fewer if it shrank meanwhile)."""
    chunks: list[bytes] = []
    offset = 0
    while offset < size and (chunk := os.pread(fd, min(size - offset, 1 << 20), offset)):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def write_whole(fd: int, data: bytes) -> None:
    """Make the open file hold exactly ``data``: write it from the start, then cut the tail.

    Writing before truncating means the file is never seen empty in between.
    """
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)
    os.ftruncate(fd, len(data))


def decode_text(data: bytes, raw: str, action: str) -> str:
    """``data`` as UTF-8, or a failure saying the tool only works on UTF-8 text."""
    if b"\0" in data[:8192]:
        raise ToolFailure(
            f"cannot {action} {raw!r}: it is a binary file ({len(data):,} bytes); "
            "this tool works on text files only"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolFailure(
            f"cannot {action} {raw!r}: it is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
            "this tool works on UTF-8 text files only"
        ) from None
