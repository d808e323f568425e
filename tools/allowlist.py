"""Which tools one API key's sessions may call: an operator's per-tenant limit.

A key may carry an allow-list (``tools=read,calc.*`` on its keys-file line, or
in the Redis keys hash): glob patterns over tool names, ``*`` matching any run
of characters. A tool it does not allow is left out of the session's prompt
and a call to it is a failure result that says so; no list means every tool.
Patterns are matched by ``tools.globs`` (linear, never a backtracking regex).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from .globs import Glob, compile_glob

__all__ = ["AllowList", "KeyAllowLists", "parse_allow_list"]

_PATTERN: Final = re.compile(r"[A-Za-z0-9_.*?-]{1,64}")


@dataclass(frozen=True, slots=True)
class AllowList:
    """Tool-name patterns; ``allows(name)`` is True when one of them matches."""

    patterns: tuple[str, ...]
    _globs: tuple[Glob, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_globs", tuple(compile_glob(p) for p in self.patterns))

    def allows(self, name: str) -> bool:
        return any(glob.matches(name) for glob in self._globs)

    def filter(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if self.allows(name)]

    def __str__(self) -> str:
        return ",".join(self.patterns)


def parse_allow_list(text: str) -> AllowList:
    """``read,calc.*`` → an ``AllowList``; raises ``ValueError`` saying what a good list is.

    An empty list is valid and allows no tool at all.
    """
    patterns = tuple(p.strip() for p in text.split(",") if p.strip())
    for pattern in patterns:
        if _PATTERN.fullmatch(pattern) is None:
            raise ValueError(
                f"tools={text!r}: {pattern!r} is not a tool name pattern; write comma-separated "
                "names or globs of letters, digits, `_.-` and `*`, e.g. tools=read,calc.*"
            )
    return AllowList(patterns)


class KeyAllowLists:
    """The allow-lists of the API keys seen at this node's handshakes (key id → list).

    The edge records a key's list when it authenticates it; the node stores it
    with each session that key creates, so whichever node drives the session
    later enforces the same list. A key with no list is not kept (None: all tools).
    """

    def __init__(self) -> None:
        self._lists: dict[str, AllowList] = {}

    def see(self, key_id: str, allowed: AllowList | None) -> None:
        if allowed is None:
            self._lists.pop(key_id, None)
        else:
            self._lists[key_id] = allowed

    def get(self, key_id: str) -> AllowList | None:
        return self._lists.get(key_id)
