"""What ``conversation.item.delete`` names to the gateway (a ``forget``): the seqs of the
first and last logged events each of the newest user messages and answers a client was
shown was made from. Pure."""

from __future__ import annotations

__all__ = ["Spans"]


class Spans:
    """The newest ``limit`` items' spans of seqs, by item id."""

    __slots__ = ("_spans", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._spans: dict[str, tuple[int, int]] = {}

    def add(self, iid: str, first: int, last: int) -> None:
        spans = self._spans
        spans[iid] = (first, last)
        if len(spans) > self.limit:
            del spans[next(iter(spans))]

    def get(self, iid: str) -> tuple[int, int] | None:
        return self._spans.get(iid)

    def gone(self, first: int, last: int) -> list[str]:
        """The items a ``forgotten`` of ``first``..``last`` took (no longer named)."""
        spans = self._spans
        ids = [iid for iid, (a, b) in spans.items() if first <= a and b <= last]
        for iid in ids:
            del spans[iid]
        return ids
