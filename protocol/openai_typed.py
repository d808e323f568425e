"""The messages an OpenAI client creates: shown at once, held until they may go,
named in the log. Pure.

OpenAI's service adds a created item to the conversation at once and says so
(``conversation.item.added``, ``done``), and clients wait for that by the item's id
(LiveKit's plugin, up to 5 s per item). The gateway's turn, though, starts with one
``user`` message, so the door shows each message when it is created and holds it:

- **user messages** until ``response.create`` sends what was held as the turn's
  message. The first held item's id goes with it (``UserMessage.item``) and is logged
  with the ``user`` event, so a resumed client, or another client of the session,
  shows the message under the id its creator knows (several messages held for one
  response become one item there: docs/openai-door.md, "Client item ids");
- **system and assistant messages** (and user messages not last before a
  ``response.create``) go as ``context`` commands: at once when no user message is
  held ahead of them (the session keeps one that comes while the model answers for
  the answer's end), else in order with the next ``response.create`` (``send``),
  when the user starts speaking, or once the user message ahead is deleted
  (``release``). One the session refuses is taken back (``taken`` names its item).
  One the client deletes while it is in flight is forgotten once it is logged
  (``delete_in_flight``, ``logged``): until then no span names it.

An id is the client's (``item.id``), or one the door makes: ``prefix`` (unique to the
connection, given by its shell) and a count, never ``item_SEQ``'s form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from protocol.events import (
    ITEM_ID_MAX,
    ContextMessage,
    Forget,
    ReplyNow,
    Role,
    ToolResultMessage,
    UserMessage,
)
from protocol.openai_events import ServerEvent
from protocol.openai_items import ShownItems, call_item, output_item

__all__ = ["HELD_CHARS_MAX", "HELD_MAX", "Held", "TypedItems", "id_refusal"]

JOINED: Final = "\n"  # between the texts of messages held for one response
HELD_MAX: Final = 64  # messages held for one response.create
HELD_CHARS_MAX: Final = 1 << 20  # their text, together: the gateway's own door's frame limit
PAST_CALLS_KEPT: Final = 256  # history calls whose output may still come
CONTEXT_ID: Final = "~"  # the door's own command ids for what it sends later: ~PREFIX N

Held = tuple[str, str, Role]
"""A created message not yet sent: ``(item id, text, role)``."""


class TypedItems:
    """One connection's created messages: ``held`` (not yet sent), ``sent`` (the command
    id of the turn a ``response.create`` sent and the user items it carries, until the
    session logs or refuses it), ``contexts`` (``context`` commands sent, by command id,
    until the same), ``due`` (commands for the shell to send now: contexts, and the
    ``forget`` of a context deleted in flight), ``doomed`` (those deletes' items)."""

    __slots__ = (
        "contexts",
        "doomed",
        "due",
        "held",
        "made",
        "outputs",
        "past_calls",
        "prefix",
        "sent",
    )

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.made = 0
        self.held: list[Held] = []
        self.sent: tuple[str, list[Held]] | None = None
        self.contexts: dict[str, Held] = {}
        self.due: list[ContextMessage | Forget | ToolResultMessage] = []
        self.doomed: set[str] = set()
        # Function call outputs shown when created and held for the response.create that
        # answers them (``hold_output``), with their events' ids.
        self.outputs: list[tuple[ToolResultMessage, str | None]] = []
        self.past_calls: dict[str, str] = {}  # a history's function calls: call_id → name

    def past(self, iid: str, item: Any) -> tuple[Role, str, dict[str, Any]]:
        """A ``function_call`` or its ``function_call_output`` from a client's history
        (LiveKit's plugin sends its chat context's calls again after a reconnect): the
        model gets it as what it did then, told in words (``(role, text)``); the client
        is shown the item as it sent it."""
        if item.type == "function_call":
            if item.call_id:
                self.past_calls[item.call_id] = item.name
                while len(self.past_calls) > PAST_CALLS_KEPT:
                    del self.past_calls[next(iter(self.past_calls))]
            text = f"(Earlier I called the tool {item.name} with {item.arguments}.)"
            return "assistant", text, call_item(iid, item.call_id, item.name, item.arguments)
        name = self.past_calls.pop(item.call_id, "")
        text = f"(The tool {name} returned: {item.output})"  # a note, not the user's words
        return "system", text, output_item(iid, item.call_id, item.output)

    def hold_output(
        self,
        output: ToolResultMessage,
        eid: str | None,
        shown: ShownItems,
        make: Callable[..., ServerEvent],
    ) -> list[ServerEvent]:
        """A ``function_call_output`` the client created (``eid``: its event), shown at
        once: OpenAI's service answers it only when asked (``response.create``; LiveKit's
        plugin sends one after the output's ``conversation.item.added`` and waits for the
        response it names), so it waits for that create (``take_outputs``) or for the
        door's grace (a client that never asks is answered all the same, as before). The
        events showing it (``make``: the conversation's)."""
        self.outputs.append((output, eid))
        return shown.show(make, output_item(str(output.item), output.id, str(output.content)))

    def take_outputs(self) -> list[ToolResultMessage]:
        """The outputs held, to send now (their turn goes on with them)."""
        outputs, self.outputs = self.outputs, []
        return [output for output, _ in outputs]

    def outputs_over(self) -> str | None:
        """The turn ended with outputs held (a cancel, a barge-in): they go now, and the
        session refuses them as it refuses one sent after its turn; the first one's
        event, for its refusal to name (None if none was held)."""
        eid = self.outputs[0][1] if self.outputs else None
        self.due += self.take_outputs()
        return eid

    def new_id(self) -> str:
        """An id for a message the client left unnamed."""
        self.made += 1
        return f"{self.prefix}{self.made}"

    def refusal(self, text: str) -> str | None:
        """Why ``text`` cannot be held with what is (bounded before anything is kept)."""
        if len(self.held) + len(self.contexts) >= HELD_MAX:
            return f"{HELD_MAX} messages wait for a response.create already: send one"
        if len(text) + sum(len(t) for _, t, _ in self.held) > HELD_CHARS_MAX:
            return (
                f"the messages waiting for a response.create would come to more than "
                f"{HELD_CHARS_MAX} characters: send response.create, or a shorter message"
            )
        return None

    def hold(self, iid: str, text: str, role: Role = "user") -> None:
        self.held.append((iid, text, role))

    def holds(self, iid: str) -> bool:
        return any(held[0] == iid for held in self.held)

    @property
    def waiting(self) -> bool:
        """A message is held: what is created after it waits behind it."""
        return bool(self.held)

    def drop(self, iid: str) -> bool:
        """Take back a held message (the client deleted it before it was sent)."""
        kept = [held for held in self.held if held[0] != iid]
        dropped = len(kept) != len(self.held)
        self.held = kept
        return dropped

    def delete_in_flight(self, iid: str) -> str | None:
        """The client deleted ``iid``, sent and not logged yet: ``""`` for a context (it
        is forgotten once logged: ``logged``; taken back if refused: ``taken``), why not
        for a message of the turn a ``response.create`` sent; None if not in flight."""
        if any(held[0] == iid for held in self.contexts.values()):
            self.doomed.add(iid)
            return ""
        if self.sent is not None and any(held[0] == iid for held in self.sent[1]):
            return (
                f"item {iid[:64]!r} is the message of the response being created: delete "
                "it once that response is done"
            )
        return None

    def logged(self, shown: ShownItems, iid: str, seq: int) -> None:
        """``iid`` was logged at ``seq`` (a span ``conversation.item.delete`` names); one
        deleted in flight is forgotten now."""
        shown.spans.add(iid, seq, seq)
        if iid in self.doomed:
            self.doomed.discard(iid)
            self.due.append(Forget(first=seq, last=seq))

    def context(self, held: Held, command_id: str = "") -> ContextMessage:
        """``held`` as a ``context`` command, in flight until logged or refused."""
        if not command_id:  # the connection's own: no other connection's, no event_id
            self.made += 1
            command_id = f"{CONTEXT_ID}{self.prefix}{self.made}"
        self.contexts[command_id] = held
        iid, text, role = held
        return ContextMessage(role=role, content=text, id=command_id, item=iid)

    def send(self, said_id: str) -> list[ContextMessage | UserMessage | ReplyNow]:
        """What a ``response.create`` sends (``said_id``: its turn's command id): the last
        run of user messages is the turn's message (its first item's id with it), and
        every other held message goes before it as a context message, in order (those
        created after that run too: the instructions a client adds with its user's
        message come before it); with no user message, a turn with no new one (``reply``)."""
        held, self.held = self.held, []
        last = max((i for i, h in enumerate(held) if h[2] == "user"), default=-1)
        first = last
        while first > 0 and held[first - 1][2] == "user":
            first -= 1
        said = held[first : last + 1] if last >= 0 else []
        others = held[:first] + held[last + 1 :] if last >= 0 else held
        out: list[ContextMessage | UserMessage | ReplyNow] = [self.context(h) for h in others]
        self.sent = (said_id, said)
        if said:
            text = JOINED.join(t for _, t, _ in said)
            out.append(UserMessage(content=text, id=said_id, item=said[0][0]))
        else:
            out.append(ReplyNow(id=said_id))
        return out

    def release(self, *, spoken: bool = False) -> list[ContextMessage]:
        """The held messages that go now, as context: those ahead of the first user
        message (nothing waits for them once the user message they waited behind was
        deleted); ``spoken``: every one, in order (the user started speaking, a turn of
        theirs follows, and OpenAI's service has them before the speech)."""
        cut = 0
        while cut < len(self.held) and (spoken or self.held[cut][2] != "user"):
            cut += 1
        go, self.held = self.held[:cut], self.held[cut:]
        return [self.context(h) for h in go]

    def taken(self, command_id: object) -> list[str] | None:
        """The session logged ``command_id``'s message: the ids of the items it carries,
        if it was sent from here (already shown: not shown again)."""
        sent = self.sent
        if sent is not None and command_id == sent[0]:
            self.sent = None
            return [held[0] for held in sent[1]]
        if isinstance(command_id, str) and (held := self.contexts.pop(command_id, None)):
            self.doomed.discard(held[0])  # refused: taken back, not forgotten
            return [held[0]]
        return None

    def refused(self, command_id: object, *, busy: bool) -> list[str] | None:
        """The session refused the turn sent (``command_id``); None if it was not that.
        ``busy`` (a turn already runs): its messages are held again, ahead of what was
        created since, for the next ``response.create`` (``[]``). Otherwise (a quota, a
        policy) they never reach the model: their ids, to be taken back. (A refused
        context is taken back as a logged one is taken: ``taken``.)"""
        sent = self.sent
        if sent is None or command_id != sent[0]:
            return None
        self.sent = None
        if busy:
            self.held[:0] = sent[1]
            return []
        return [held[0] for held in sent[1]]


def id_refusal(iid: str, shown: ShownItems, typed: TypedItems) -> tuple[str, str] | None:
    """``(message, code)`` refusing a client's item id, in OpenAI's words for a string
    parameter out of bounds, or one the conversation has already; None if it is taken."""
    if not iid:
        return (
            "Invalid 'item.id': empty string. Expected a string with minimum length 1, "
            "but got an empty string instead.",
            "empty_string",
        )
    if len(iid) > ITEM_ID_MAX:
        return (
            f"Invalid 'item.id': string too long. Expected a string with maximum length "
            f"{ITEM_ID_MAX}, but got a string with length {len(iid)} instead.",
            "string_above_max_length",
        )
    if iid in shown.items or shown.spans.get(iid) or typed.holds(iid):
        return (
            f"the conversation already has an item with id {iid!r}: give each item an id of "
            "its own (or leave item.id unset)",
            "invalid_request_error",
        )
    return None
