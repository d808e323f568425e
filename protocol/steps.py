"""Turning one model step's token-mode events into history items.

The client sees think and respond text in many small chunks; history keeps one
item per block (the seed's "event mode"), so context assembly and storage stay
proportional to what the model said, not to how it was chunked. A step's items
are persisted together when the step completes (at its ``<end>``, with the
turn's ``end`` event, or at the response's end), so history only ever holds
whole steps: a crash mid-step leaves the history at the step's start, and the
step is rerun from there.

Each item carries the seq of the first logged event it holds (a ``forget``
names items by it): the recorder keeps that event, whose seq is stamped when
it is logged, and the item takes it when it is stored (``persist``).
"""

from __future__ import annotations

from protocol.assembly import HistoryItem
from protocol.events import Call, Event, Respond, Think
from protocol.turn_events import Persist

__all__ = ["StepRecorder"]


class StepRecorder:
    """Collects the think/call/respond events of one model step into history items."""

    __slots__ = ("_buf", "_first", "_firsts", "_items", "_kind", "emitted")

    def __init__(self) -> None:
        self._items: list[HistoryItem] = []
        self._firsts: list[Think | Respond | Call] = []  # each item's first event
        self._first: Think | Respond | None = None  # the open block's
        self._kind: type[Think] | type[Respond] | None = None
        self._buf: list[str] = []
        # True once the step showed the client anything (a rerun then needs an interrupt).
        self.emitted = False

    def chunk(self, event: Think | Respond) -> None:
        """A think or respond chunk (the hot path: one append unless the block kind changes)."""
        kind = type(event)
        if kind is not self._kind:
            self.emitted = True
            self._close_block()
            self._kind = kind
            self._first = event
        self._buf.append(event.content)

    def add(self, event: Event) -> None:
        kind = type(event)
        if kind is Think or kind is Respond:
            self.emitted = True
            if kind is not self._kind:
                self._close_block()
                self._kind = kind
                self._first = event  # type: ignore[assignment]
            self._buf.append(event.content)  # type: ignore[union-attr]
        elif isinstance(event, Call):
            self.emitted = True
            self._close_block()
            # With its id and who runs it: a takeover finds the batch in flight by them.
            self._items.append(
                Call(
                    content=event.content,
                    id=event.id,
                    runs_on=event.runs_on,
                    background=event.background,
                )
            )
            self._firsts.append(event)

    def _close_block(self) -> None:
        if self._kind is not None and self._buf and self._first is not None:
            self._items.append(self._kind(content="".join(self._buf)))
            self._firsts.append(self._first)
        self._kind = None
        self._first = None
        self._buf = []

    def finish(self) -> list[HistoryItem]:
        """The step's items, blocks merged (stamped with their first event's seq where
        it is logged already); the recorder is empty afterwards."""
        return list(self.persist().items)

    def persist(self, *more: HistoryItem) -> Persist:
        """Store the step's items, then ``more``: the items are stamped with their first
        event's seq as they are stored, after the events before them were logged."""
        self._close_block()
        items, self._items = self._items, []
        firsts, self._firsts = self._firsts, []
        for item, first in zip(items, firsts, strict=True):
            if first.seq:
                item.seq = first.seq
        return Persist((*items, *more), firsts=tuple(firsts))
