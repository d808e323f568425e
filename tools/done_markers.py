"""Built-ins that change the workspace (``write``, ``edit``, ``shell``) run once per key.

A call whose node died after the tool finished but before its outcome was
logged is run again by the node that takes over, under the same idempotency
key. For a tool of someone else's service, the key is passed on and the
service dedupes; the built-ins dedupe here: the first run that finishes
leaves its result under the key (``.rtgw-journal/KEY.json`` in the
workspace, written atomically), and a rerun of that key returns it without
doing the work again. The files go with the workspace when its session ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import msgspec

from protocol.calls import ToolResult

__all__ = ["MARKER_DIR", "recall", "record"]

MARKER_DIR: Final = ".rtgw-journal"
_KEY_CHARS: Final = frozenset("0123456789abcdef")
_decoder: Final = msgspec.json.Decoder(ToolResult)
_encoder: Final = msgspec.json.Encoder()


def _path(workspace: Path, key: str) -> Path | None:
    if not key or len(key) > 64 or not set(key) <= _KEY_CHARS:
        return None  # not a key the gateway made: never a path component
    return workspace / MARKER_DIR / f"{key}.json"


def recall(workspace: Path, key: str) -> ToolResult | None:
    """The result a finished run of ``key`` left (None: no run of it finished here)."""
    path = _path(workspace, key)
    if path is None:
        return None
    try:
        return _decoder.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def record(workspace: Path, key: str, result: ToolResult) -> None:
    """Keep ``result`` under ``key`` (best effort: a failure only loses the dedupe)."""
    path = _path(workspace, key)
    if path is None:
        return
    try:
        path.parent.mkdir(exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_bytes(_encoder.encode(result))
        os.replace(partial, path)
    except OSError:
        pass
