"""The items an OpenAI client was shown, by id: what ``conversation.item.retrieve``
shows, what ``conversation.item.delete`` names to the gateway (a ``forget``: the seqs
of the first and last logged events a user message or answer was made from), and
the last one (the next item's ``previous_item_id``). Pure."""

from __future__ import annotations

from typing import Any, Literal

from protocol.openai_events import ServerEvent

__all__ = ["KEPT_ITEMS", "ShownItems", "Spans", "unknown_item"]

KEPT_ITEMS = 256  # items conversation.item.retrieve can show (the newest)
_SHOWS_ITEM = frozenset(
    (
        "conversation.item.added",
        "conversation.item.done",
        "response.output_item.added",
        "response.output_item.done",
    )
)


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


class ShownItems:
    """The newest ``KEPT_ITEMS`` items as last shown (``…item.added``/``done``), their
    spans, and the id of the last item appended (``last``)."""

    __slots__ = ("items", "last", "spans")

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.spans = Spans(KEPT_ITEMS)
        self.last: str | None = None

    def remember(self, events: list[ServerEvent]) -> None:
        """Keep the items ``events`` show."""
        items = self.items
        for ev in events:
            if ev["type"] in _SHOWS_ITEM:
                item = ev["item"]
                items.pop(item["id"], None)
                items[item["id"]] = item
                if len(items) > KEPT_ITEMS:
                    del items[next(iter(items))]

    def forget(self, first: int, last: int) -> list[str]:
        """The items a ``forgotten`` of ``first``..``last`` took, no longer shown."""
        gone = self.spans.gone(first, last)
        for iid in gone:
            self.items.pop(iid, None)
        if self.last in gone:
            self.last = next(reversed(self.items), None)
        return gone


def unknown_item(item_id: str, verb: Literal["delete", "retrieve"]) -> tuple[str, str]:
    """OpenAI's words for an item it does not have, deleted or retrieved: ``(message,
    code)`` (docs/openai-door.md, "Unknown items"). The door and the simulator say them."""
    message = f"Error {verb[:-1]}ing item: the item with id {item_id!r} does not exist."
    return message, f"item_{verb}_invalid_item_id"
