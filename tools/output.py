"""Capping a tool's output so one result cannot flood the model's context.

Every result is sent upstream and kept in the session's history, so an
unbounded ``read`` of a log or a chatty shell command would cost tokens on
every later turn. A string is cut at ``max_bytes`` of UTF-8 (never inside a
character); any other value is encoded to JSON text first and cut the same
way, so the model always gets valid text and a note saying how much it missed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

__all__ = ["NotJSON", "cap_output", "fit_output", "output_size", "truncation_note", "valid_text"]

_encoder: Final = msgspec.json.Encoder()


class NotJSON(TypeError):
    """A tool returned a value that cannot be encoded as JSON (a bug in the tool)."""


def truncation_note(total: int, shown: int) -> str:
    return f"\n[output truncated: {total:,} bytes, showing the first {shown:,}]"


def output_size(content: Any) -> int:
    """Bytes ``content`` counts as: a string's UTF-8, anything else's JSON (``cap_output``'s measure)."""
    return len(_as_bytes(content))


def fit_output(content: Any, max_bytes: int, scrub: Callable[[Any], Any] | None = None) -> Any:
    """A tool's ``content`` as the session may keep it: text without lone surrogates,
    ``scrub`` (its secrets) applied before the cut, then ``cap_output``.

    A lone surrogate (``"\ud800"``: valid JSON, but no character) passed the cut and
    failed the turn where its results were encoded, every time it was asked again; it
    is now a ``?``. A secret cut through at ``max_bytes`` before it was scrubbed was no
    longer found, and its first part reached the client."""
    if isinstance(content, str):
        content = valid_text(content)
    if scrub is not None:
        try:
            content = scrub(content)
        except (TypeError, ValueError, OverflowError) as exc:
            raise NotJSON(f"{type(exc).__name__}: {exc}") from exc
    return cap_output(content, max_bytes)


def valid_text(text: str) -> str:
    """``text`` with any lone surrogate as ``?`` (``text`` itself when it has none)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def _as_bytes(content: Any) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8", errors="replace")
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
