"""Capping a tool's output so one result cannot flood the model's context.

Every result is sent upstream and kept in the session's history, so an
unbounded ``read`` of a log or a chatty shell command would cost tokens on
every later turn. A string is cut at ``max_bytes`` of UTF-8 (never inside a
character); any other value is encoded to JSON text first and cut the same
way, so the model always gets valid text and a note saying how much it missed.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = ["NotJSON", "cap_output", "output_size", "truncation_note"]

_encoder: Final = msgspec.json.Encoder()


class NotJSON(TypeError):
    """A tool returned a value that cannot be encoded as JSON (a bug in the tool)."""


def truncation_note(total: int, shown: int) -> str:
    return f"\n[output truncated: {total:,} bytes, showing the first {shown:,}]"


def output_size(content: Any) -> int:
    """Bytes ``content`` counts as: a string's UTF-8, anything else's JSON (``cap_output``'s measure)."""
    return len(_as_bytes(content))


def _as_bytes(content: Any) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8", errors="surrogatepass")
    try:
        return _encoder.encode(content)
    except (TypeError, ValueError, OverflowError) as exc:
        raise NotJSON(f"{type(exc).__name__}: {exc}") from exc


def cap_output(content: Any, max_bytes: int) -> Any:
    """``content`` unchanged if it fits in ``max_bytes``, else a truncated string.

    Strings are measured as their UTF-8 text (what the model reads); other
    values as their JSON encoding. Raises ``NotJSON`` if ``content`` cannot be
    encoded, so the caller can report that instead of failing later when the
    whole batch is encoded.
    """
    data = _as_bytes(content)
    if len(data) <= max_bytes:
        return content
    shown = data[:max_bytes].decode("utf-8", errors="ignore")
    return shown + truncation_note(len(data), max_bytes)
