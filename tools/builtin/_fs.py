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
import os
import threading
from collections.abc import Callable, Iterator
from typing import Concatenate, ParamSpec, TypeVar

from tools.base import ToolFailure

__all__ = ["Stop", "decode_text", "in_thread", "os_errors", "read_whole", "write_whole"]

P = ParamSpec("P")
R = TypeVar("R")

Stop = threading.Event


async def in_thread(fn: Callable[Concatenate[Stop, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(stop, *args, **kwargs)`` in a worker thread; ``stop`` is set once we stop waiting."""
    stop = Stop()
    try:
        return await asyncio.to_thread(fn, stop, *args, **kwargs)
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
