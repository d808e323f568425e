"""Files the client tools read that someone else may have written: bounded before parsing.

In CI a scenario file, and the recordings it starts from, come from pull
requests: ``gateway eval`` and ``gateway replay`` read them as untrusted
input. Every read here is bounded before any parsing: the file must be a
regular file or a pipe (``/dev/zero`` and other devices are refused before a
byte is read), and no more than ``limit`` bytes are read, whatever its size
claims (a pipe has none). What a limit refuses is one ``FileRefused`` line
that names the file, the limit and what to do. The limits are their
readers': ``replay_plan.MAX_RECORDING_BYTES``, ``evals.MAX_SCENARIO_BYTES``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["FileRefused", "read_bounded"]


class FileRefused(ValueError):
    """A file read as untrusted input is not one to parse; the message says why."""


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """``path``'s bytes, at most ``limit`` of them (``FileRefused`` past it, or when
    ``path`` is not a regular file or a pipe). ``what`` names it in messages
    ("a recording"). Raises ``OSError`` when it cannot be opened or read."""
    with open(path, "rb") as file:
        mode = os.fstat(file.fileno())
        if not (stat.S_ISREG(mode.st_mode) or stat.S_ISFIFO(mode.st_mode)):
            raise FileRefused(f"{path} is not a file ({_kind(mode.st_mode)}): give {what}")
        if mode.st_size > limit:
            raise FileRefused(_too_large(path, mode.st_size, limit, what))
        data = file.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(_too_large(path, None, limit, what))
    return data


def _too_large(path: Path, size: int | None, limit: int, what: str) -> str:
    has = f"{size:,} bytes" if size is not None else f"more than {limit:,} bytes"
    return f"{path} holds {has}: larger than {what} can be ({limit:,} bytes at most)"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
