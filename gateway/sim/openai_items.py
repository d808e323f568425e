"""The OpenAI simulator's conversation: its items, and the client events that edit them.

``conversation.item.create`` (a message, a ``function_call`` for history, a
``function_call_output`` with a call's result) adds an item after
``previous_item_id``; ``.truncate`` cuts an assistant item's audio where the
user stopped hearing it; ``.delete`` removes one. Each is checked the API's way
and answered with its events (``conversation.item.added``/``done``,
``truncated``, ``deleted``) or an ``error``. Apart from the connection
(``gateway.sim.openai``), which writes responses from these items, because
editing the conversation is its own job; the items' shapes are
``gateway.sim.openai_state``'s.
"""

from __future__ import annotations

from typing import Literal, Protocol

from gateway.sim.model import Sim
from gateway.sim.openai_state import CONTENT_TYPES, Item, wire_item
from gateway.upstream import openai_wire as wire
from protocol.openai_items import unknown_item

__all__ = ["Conversation", "ConversationHost"]


class ConversationHost(Protocol):
    """The connection the conversation's events come in on and go out by."""

    def _eid(self) -> str: ...

    @property
    def ms_per_char(self) -> float:
        """Milliseconds of speech a character of an answer takes, at the session's speed."""

    def _new_id(self, prefix: str) -> str: ...

    async def _send(self, event: wire.ServerEvent) -> None: ...

    async def _error(
        self,
        message: str,
        *,
        code: str,
        kind: str = ...,
        param: str | None = ...,
        event_id: str | None = ...,
    ) -> None: ...


class Conversation:
    """One connection's items, in order (see the module docstring)."""

    __slots__ = ("host", "items", "sim")

    def __init__(self, host: ConversationHost, sim: Sim) -> None:
        self.host = host
        self.sim = sim
        self.items: dict[str, Item] = {}

    async def create(self, event: wire.ConversationItemCreate) -> None:
        item = event.item
        if item.type in ("function_call", "function_call_output"):
            await self._create_call(event)
            return
        if item.type != "message" or item.role not in CONTENT_TYPES:
            await self.host._error(
                f"The simulator supports message items with role user, assistant or system; "
                f"got type {item.type!r} role {item.role!r}.",
                code="invalid_value",
                param="item",
                event_id=event.event_id,
            )
            return
        allowed = CONTENT_TYPES[item.role]
        texts: list[str] = []
        for index, part in enumerate(item.content or ()):
            if part.type not in allowed:
                await self.host._error(
                    f"Invalid value: {part.type!r}. A {item.role} message's content must be "
                    + " or ".join(sorted(allowed))
                    + ".",
                    code="invalid_value",
                    param=f"item.content[{index}].type",
                    event_id=event.event_id,
                )
                return
            texts.append(part.text or "")
        item_id = item.id or self.host._new_id("item")
        if item_id in self.items:
            await self._exists(item_id, event.event_id)
            return
        previous = event.previous_item_id
        if previous is not None and previous != "root" and previous not in self.items:
            await self._not_found(previous, "previous_item_id", event.event_id)
            return
        new = Item(item_id, item.role, "".join(texts), "completed")
        await self.add(new, previous)

    async def _create_call(self, event: wire.ConversationItemCreate) -> None:
        """A ``function_call`` (history) or ``function_call_output`` (a call's result)."""
        item = event.item
        if not item.call_id:
            await self.host._error(
                f"Missing required parameter: 'item.call_id' (a {item.type} item needs it).",
                code="missing_required_parameter",
                param="item.call_id",
                event_id=event.event_id,
            )
            return
        if item.type == "function_call":
            new = Item(
                item.id or self.host._new_id("item"),
                "assistant",
                item.arguments or "",
                "completed",
                kind="function_call",
                call_id=item.call_id,
                name=item.name or "",
            )
        else:
            new = Item(
                item.id or self.host._new_id("item"),
                "user",
                item.output or "",
                "completed",
                kind="function_call_output",
                call_id=item.call_id,
            )
        if new.id in self.items:
            await self._exists(new.id, event.event_id)
            return
        await self.add(new, event.previous_item_id)

    async def add(self, new: Item, previous: str | None) -> None:
        previous = self._insert(new, previous)
        out = wire_item(new)
        await self.host._send(
            wire.ConversationItemAdded(
                event_id=self.host._eid(), item=out, previous_item_id=previous
            )
        )
        await self.host._send(
            wire.ConversationItemDone(
                event_id=self.host._eid(), item=out, previous_item_id=previous
            )
        )

    def _insert(self, new: Item, previous: str | None) -> str | None:
        """Put ``new`` after ``previous`` (``None``: at the end; ``"root"``: first).

        Returns the id of the item now before it.
        """
        if previous is None:
            last = next(reversed(self.items), None)
            self.items[new.id] = new
            return last
        ordered = list(self.items.values())
        at = 0 if previous == "root" else [i.id for i in ordered].index(previous) + 1
        ordered.insert(at, new)
        self.items = {i.id: i for i in ordered}
        return None if at == 0 else ordered[at - 1].id

    async def truncate(self, event: wire.ConversationItemTruncate) -> None:
        """Cut an assistant item's audio at ``audio_end_ms``: what the user heard of it.

        As the API does: only an assistant message with audio can be cut, and not
        past its audio's end; the item's transcript is dropped (the model keeps
        the audio it said up to there)."""
        item = self.items.get(event.item_id)
        if item is None:
            await self._not_found(event.item_id, "item_id", event.event_id)
            return
        if item.role != "assistant" or item.part != "output_audio":
            await self.host._error(
                "Only assistant messages with audio can be truncated.",
                code="invalid_value",
                param="item_id",
                event_id=event.event_id,
            )
            return
        duration = len(item.text) * self.host.ms_per_char
        if event.audio_end_ms > duration:
            await self.host._error(
                f"Audio content of {duration:.0f}ms is shorter than {event.audio_end_ms}ms.",
                code="invalid_value",
                param="audio_end_ms",
                event_id=event.event_id,
            )
            return
        item.text = item.text[: int(event.audio_end_ms / self.host.ms_per_char)]
        self.sim.stats.truncations.append(event.audio_end_ms)
        await self.host._send(
            wire.ConversationItemTruncated(
                event_id=self.host._eid(),
                item_id=item.id,
                content_index=event.content_index,
                audio_end_ms=event.audio_end_ms,
            )
        )

    async def delete(self, event: wire.ConversationItemDelete) -> None:
        if self.items.pop(event.item_id, None) is None:
            await self._invalid(event.item_id, "delete", event.event_id)
            return
        await self.host._send(
            wire.ConversationItemDeleted(event_id=self.host._eid(), item_id=event.item_id)
        )

    async def _exists(self, item_id: str, event_id: str | None) -> None:
        await self.host._error(
            f"Item with id {item_id!r} already exists.",
            code="item_already_exists",
            param="item.id",
            event_id=event_id,
        )

    async def _invalid(
        self, item_id: str, verb: Literal["delete", "retrieve"], event_id: str | None
    ) -> None:
        """An unknown item deleted or retrieved, in the service's words (``unknown_item``)."""
        message, code = unknown_item(item_id, verb)
        await self.host._error(message, code=code, param=None, event_id=event_id)

    async def _not_found(self, item_id: str, param: str, event_id: str | None) -> None:
        await self.host._error(
            f"Item with id {item_id!r} not found.",
            code="item_not_found",
            param=param,
            event_id=event_id,
        )
