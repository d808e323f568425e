"""The items an OpenAI client was shown, by id: what ``conversation.item.retrieve``
shows, what ``conversation.item.delete`` names to the gateway (a ``forget``: the seqs
of the first and last logged events a user message or answer was made from), and
the last one (the next item's ``previous_item_id``). Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

from protocol.openai_events import ServerEvent
from protocol.openai_ids import EventIds

__all__ = [
    "CREATED",
    "KEPT_ITEMS",
    "ShownItems",
    "Spans",
    "answer_item",
    "call_item",
    "created",
    "message_item",
    "output_item",
    "text_item",
    "unknown_item",
    "user_item",
    "user_shown",
]

KEPT_ITEMS = 256  # items conversation.item.retrieve can show (the newest)
KEPT_WEIGHT = 4 * 2**20
"""What those items may hold together, in characters (a content part counts 256 more):
one connection's 256 items of 30,000 one-character parts each held 2 GB."""
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
    """The newest items as last shown (``…item.added``/``done``): ``KEPT_ITEMS`` at most,
    of ``KEPT_WEIGHT`` together (the newest is kept whatever it weighs); their spans, and
    the id of the last item appended (``last``)."""

    __slots__ = ("_weights", "items", "last", "spans", "weight")

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self._weights: dict[str, int] = {}
        self.weight = 0  # of the items kept
        self.spans = Spans(KEPT_ITEMS)
        self.last: str | None = None

    def remember(self, events: list[ServerEvent]) -> None:
        """Keep the items ``events`` show."""
        items = self.items
        for ev in events:
            if ev["type"] in _SHOWS_ITEM:
                item = ev["item"]
                iid = item["id"]
                self._forget(iid)
                items[iid] = item
                self._weights[iid] = weight = _weight(item)
                self.weight += weight
                while len(items) > KEPT_ITEMS or (self.weight > KEPT_WEIGHT and len(items) > 1):
                    self._forget(next(iter(items)))

    def append(self, make: Callable[..., ServerEvent], item: dict[str, Any]) -> list[ServerEvent]:
        """``item`` created after the last item (``created``): it is the last now."""
        prev, self.last = self.last, item["id"]
        return created(make, item, prev)

    def show(self, make: Callable[..., ServerEvent], item: dict[str, Any]) -> list[ServerEvent]:
        """``item`` a client created, shown at once (``append``) and kept (``remember``):
        retrieved, or named by a later event, before the session logs it."""
        events = self.append(make, item)
        self.remember(events)
        return events

    def forget(self, first: int, last: int) -> list[str]:
        """The items a ``forgotten`` of ``first``..``last`` took, no longer shown."""
        gone = self.spans.gone(first, last)
        for iid in gone:
            self.drop(iid)
        return gone

    def drop(self, iid: str) -> None:
        """``iid`` is no longer shown (forgotten, or a held message taken back)."""
        self._forget(iid)
        if self.last == iid:
            self.last = next(reversed(self.items), None)

    def clear(self) -> None:
        """Nothing is shown any more (the connection ended)."""
        self.items.clear()
        self._weights.clear()
        self.weight = 0

    def _forget(self, iid: str) -> None:
        if self.items.pop(iid, None) is not None:
            self.weight -= self._weights.pop(iid)


def _weight(item: dict[str, Any]) -> int:
    """About what an item holds: its texts' characters, and 256 a content part (a part's
    own dict and strings cost that much however short its text)."""
    total = 256 + sum(len(v) for v in item.values() if isinstance(v, str))
    for part in item.get("content") or ():
        total += 256 + sum(len(v) for v in part.values() if isinstance(v, str))
    return total


def unknown_item(item_id: str, verb: Literal["delete", "retrieve"]) -> tuple[str, str]:
    """OpenAI's words for an item it does not have, deleted or retrieved: ``(message,
    code)`` (docs/openai-door.md, "Unknown items"). The door and the simulator say them."""
    message = f"Error {verb[:-1]}ing item: the item with id {item_id!r} does not exist."
    return message, f"item_{verb}_invalid_item_id"


CREATED: Final = ("conversation.item.added", "conversation.item.done")


def created(
    make: Callable[..., ServerEvent], item: dict[str, Any], prev: str | None
) -> list[ServerEvent]:
    """``item`` shown as OpenAI's service shows an item it took, after ``prev``:
    ``conversation.item.added`` then ``done`` (``make``: logged ids or unlogged)."""
    return [make(kind, item=item, previous_item_id=prev) for kind in CREATED]


def message_item(iid: str, role: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A message item, as OpenAI's service shows one."""
    item = {"id": iid, "object": "realtime.item", "type": "message", "role": role}
    return item | {"status": "completed", "content": parts}


def text_item(iid: str, role: str, text: str) -> dict[str, Any]:
    """A message of ``role`` with its text, in the content type the role takes."""
    kind = "output_text" if role == "assistant" else "input_text"
    return message_item(iid, role, [{"type": kind, "text": text}])


def answer_item(iid: str, text: str, status: str, *, audio: bool) -> dict[str, Any]:
    """A response's assistant message: its content once completed (spoken: a transcript)."""
    part = (
        {"type": "output_audio", "transcript": text}
        if audio
        else {"type": "output_text", "text": text}
    )
    return message_item(iid, "assistant", [part] if status == "completed" else []) | {
        "status": status
    }


def call_item(
    iid: str, call: str | None, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    """A ``function_call`` item."""
    item = {"id": iid, "object": "realtime.item", "type": "function_call", "status": status}
    return item | {"name": name, "call_id": call, "arguments": arguments}


def output_item(iid: str, call: str, output: str) -> dict[str, Any]:
    """A ``function_call_output`` item."""
    item = {"id": iid, "object": "realtime.item", "status": "completed"}
    return item | {"type": "function_call_output", "call_id": call, "output": output}


def user_item(iid: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A user message item."""
    return message_item(iid, "user", parts)


def user_shown(
    ids: EventIds, iid: str, prev: str | None, content: str, *, spoken: bool
) -> list[ServerEvent]:
    """The events that show a logged user message ``iid`` after ``prev``: typed, or
    spoken (``content``: its transcript)."""
    if not spoken:
        return created(ids.event, user_item(iid, [{"type": "input_text", "text": content}]), prev)
    part = {"type": "input_audio", "transcript": content}
    # ``added`` before its transcript, as OpenAI's service sends it at the commit
    # (LiveKit's plugin appends the transcription to what ``added`` held).
    return [
        ids.event("input_audio_buffer.committed", item_id=iid, previous_item_id=prev),
        ids.event(
            "conversation.item.added",
            item=user_item(iid, [{**part, "transcript": None}]),
            previous_item_id=prev,
        ),
        ids.event("conversation.item.done", item=user_item(iid, [part]), previous_item_id=prev),
        # The provider's transcript comes whole (it is logged once, with the user's
        # turn): a client that shows transcription deltas gets it as one delta.
        ids.event(
            "conversation.item.input_audio_transcription.delta",
            item_id=iid,
            content_index=0,
            delta=content,
        ),
        ids.event(
            "conversation.item.input_audio_transcription.completed",
            item_id=iid,
            content_index=0,
            transcript=content,
            usage={"type": "duration", "seconds": 0},
        ),
    ]
