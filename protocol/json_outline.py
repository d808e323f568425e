"""A large JSON frame's arrays counted before it is decoded (pure).

A typed decode builds every element of an array before its ``max_length`` is
checked: a 780 KB ``configure`` of 60,000 tools took 190 ms to refuse (each name
checked, each tool built), and an OpenAI-door item of 30,000 one-character parts
35 ms a frame. Split into raw values, the same frames take 3-12 ms: each array of
the frame's object, and of the objects it holds (``item.content``,
``response.input``), is counted first, and one past ``MAX_VALUES`` refuses the
frame before any element is built.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["LARGE_FRAME", "MAX_VALUES", "too_many_values"]

LARGE_FRAME: Final = 64 * 1024
"""Frames at least this long are outlined first; a smaller one decodes in well under a
millisecond whatever it holds."""
MAX_VALUES: Final = 1024
"""Values one array of a frame (or of an object in it) may hold: above any field's own
limit (64 tools, 128 items), so the field's own refusal names it."""

_fields: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_values: Final = msgspec.json.Decoder(list[msgspec.Raw])
_ident: Final = msgspec.json.Decoder(object)


def too_many_values(data: bytes | str, ident: str) -> tuple[str, str | None] | None:
    """What is wrong with a large frame whose arrays hold too many values, and the
    frame's ``ident`` field (``id``, ``event_id``) when it is a short string, for the
    answer to name; None when nothing is (also for a frame that is not a JSON object:
    its decode says why)."""
    if len(data) < LARGE_FRAME:
        return None
    try:
        fields = _fields.decode(data)
        problem = _counted(fields, "", 2)
        if problem is None:
            return None
        raw = fields.get(ident)
        named = _ident.decode(raw) if raw is not None else None
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return problem, named if isinstance(named, str) and 0 < len(named) <= 128 else None


def _counted(fields: dict[str, msgspec.Raw], where: str, levels: int) -> str | None:
    for name, raw in fields.items():
        with memoryview(raw) as view:  # a raw value starts at its first byte
            first = view[:1].tobytes()
        if first == b"[":
            count = len(_values.decode(raw))
            if count > MAX_VALUES:
                return (
                    f"{where}{name} holds {count:,} values, more than this gateway reads in "
                    f"one array ({MAX_VALUES:,}); send fewer"
                )
        elif first == b"{" and levels > 1:
            problem = _counted(_fields.decode(raw), f"{where}{name}.", levels - 1)
            if problem is not None:
                return problem
    return None
