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
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from tools.base import Limits, ToolFailure
from tools.sandbox import is_binary

__all__ = ["Stop", "in_thread", "os_errors", "read_text_file", "require_file"]

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
        raise ToolFailure(f"cannot {action} {raw!r}: {exc.strerror or exc}") from None


def require_file(path: Path, raw: str, action: str) -> int:
    """The size of ``path``, which must be an existing regular file."""
    with os_errors(action, raw):
        st = path.stat()
    if path.is_dir():
        raise ToolFailure(
            f"cannot {action} {raw!r}: it is a directory; use list to see what it contains"
        )
    if not path.is_file():
        raise ToolFailure(f"cannot {action} {raw!r}: it is not a regular file")
    return st.st_size


def read_text_file(path: Path, raw: str, action: str, limits: Limits) -> str:
    """The whole text of a UTF-8 file, refusing binary files and files over the size cap."""
    size = require_file(path, raw, action)
    if size > limits.max_read_bytes:
        raise ToolFailure(
            f"cannot {action} {raw!r}: it is {size:,} bytes, over the "
            f"{limits.max_read_bytes:,}-byte limit for this tool"
        )
    with os_errors(action, raw):
        if is_binary(path):
            raise ToolFailure(
                f"cannot {action} {raw!r}: it is a binary file ({size:,} bytes); "
                "this tool works on text files only"
            )
        data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolFailure(
            f"cannot {action} {raw!r}: it is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
            "this tool works on UTF-8 text files only"
        ) from None
