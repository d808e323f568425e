"""The user messages an OpenAI client types: shown at once, held until its
``response.create``, named in the log. Pure.

OpenAI's service adds a created item to the conversation at once and says so
(``conversation.item.added``, ``done``), and clients wait for that by the item's id
(LiveKit's plugin, up to 5 s per item). The gateway's turn, though, starts with one
``user`` message, so the door shows each message when it is created and holds its
text until ``response.create`` sends what was held as the turn's message. The first
held item's id goes with it (``UserMessage.item``) and is logged with the ``user``
event, so a resumed client, or another client of the session, shows the message under
the id its creator knows (several messages held for one response become one item
there: docs/openai-door.md, "Client item ids").

An id is the client's (``item.id``), or one the door makes: ``prefix`` (unique to the
connection, given by its shell) and a count, never ``item_SEQ``'s form.
"""

from __future__ import annotations

from typing import Final

from protocol.events import ITEM_ID_MAX

__all__ = ["HELD_CHARS_MAX", "HELD_MAX", "TypedItems", "id_refusal"]

JOINED: Final = "\n"  # between the texts of messages held for one response
HELD_MAX: Final = 64  # messages held for one response.create
HELD_CHARS_MAX: Final = 1 << 20  # their text, together: the gateway's own door's frame limit


class TypedItems:
    """One connection's typed user messages: ``held`` (created, not yet sent, as
    ``(id, text)``) and ``sent`` (the command id of the message a ``response.create``
    sent and the items it carries, until the session logs or refuses it)."""

    __slots__ = ("held", "made", "prefix", "sent")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.made = 0
        self.held: list[tuple[str, str]] = []
        self.sent: tuple[str, list[tuple[str, str]]] | None = None

    def new_id(self) -> str:
        """An id for a message the client left unnamed."""
        self.made += 1
        return f"{self.prefix}{self.made}"

    def refusal(self, text: str) -> str | None:
        """Why ``text`` cannot be held with what is (bounded before anything is kept)."""
        if len(self.held) >= HELD_MAX:
            return f"{HELD_MAX} user messages wait for a response.create already: send one"
        if len(text) + sum(len(t) for _, t in self.held) > HELD_CHARS_MAX:
            return (
                f"the user messages waiting for a response.create would come to more than "
                f"{HELD_CHARS_MAX} characters: send response.create, or a shorter message"
            )
        return None

    def hold(self, iid: str, text: str) -> None:
        self.held.append((iid, text))

    def holds(self, iid: str) -> bool:
        return any(held == iid for held, _ in self.held)

    def drop(self, iid: str) -> bool:
        """Take back a held message (the client deleted it before it was sent)."""
        kept = [(held, text) for held, text in self.held if held != iid]
        dropped = len(kept) != len(self.held)
        self.held = kept
        return dropped

    def send(self, command_id: str) -> tuple[str, str]:
        """What was held, as one message: ``(text, the first item's id)``; ``sent``
        until the session logs it (``taken``) or refuses it (``refused``)."""
        items, self.held = self.held, []
        self.sent = (command_id, items)
        return JOINED.join(text for _, text in items), items[0][0]

    def send_reply(self, command_id: str) -> None:
        """A ``response.create`` with nothing held sent a turn with no message
        (``reply``): ``sent`` names it (it carries no item) until logged or refused."""
        self.sent = (command_id, [])

    def taken(self, command_id: object) -> list[str] | None:
        """The session logged the message of ``command_id``: the ids of the items it
        carries, if it was the one sent from here (already shown: not shown again)."""
        sent = self.sent
        if sent is None or command_id != sent[0]:
            return None
        self.sent = None
        return [iid for iid, _ in sent[1]]

    def refused(self, command_id: object, *, busy: bool) -> list[str] | None:
        """The session refused the turn sent (``command_id``); None if it was not that.
        ``busy`` (a turn already runs): its messages are held again, ahead of what was
        created since, for the next ``response.create`` (``[]``). Otherwise (a quota, a
        policy) they never reach the model: their ids, to be taken back."""
        sent = self.sent
        if sent is None or command_id != sent[0]:
            return None
        self.sent = None
        if busy:
            self.held[:0] = sent[1]
            return []
        return [iid for iid, _ in sent[1]]


def id_refusal(iid: str) -> tuple[str, str] | None:
    """``(message, code)`` refusing a client's item id, in OpenAI's words for a string
    parameter out of bounds; None if it is taken."""
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
    return None
