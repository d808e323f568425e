"""The messages an OpenAI client creates, held and sent in order (``TypedItems``)."""

from __future__ import annotations

from protocol.events import ContextMessage, ReplyNow, UserMessage
from protocol.openai_typed import TypedItems


def test_a_create_sends_what_came_before_the_last_user_messages_as_context_in_order() -> None:
    typed = TypedItems("item_c_")
    typed.hold("u1", "hello")
    typed.hold("s1", "Be brief.", "system")
    typed.hold("u2", "what time")
    typed.hold("u3", "is it?")
    sent = typed.send("said")
    assert [type(c) for c in sent] == [ContextMessage, ContextMessage, UserMessage]
    first, second, turn = sent
    assert isinstance(first, ContextMessage) and (first.role, first.item) == ("user", "u1")
    assert isinstance(second, ContextMessage) and (second.role, second.item) == ("system", "s1")
    assert isinstance(turn, UserMessage)
    assert (turn.content, turn.item, turn.id) == ("what time\nis it?", "u2", "said")
    # Each is in flight under its command id until logged or refused.
    assert isinstance(first.id, str) and typed.taken(first.id) == ["u1"]
    assert typed.taken("said") == ["u2", "u3"]
    # A system message last: the turn has no new message (a reply).
    typed.hold("s2", "Now greet.", "system")
    *contexts, reply = typed.send("again")
    assert [c.item for c in contexts] == ["s2"] and isinstance(reply, ReplyNow)  # type: ignore[union-attr]


def test_held_messages_ahead_of_a_user_message_go_when_released_or_all_on_speech() -> None:
    typed = TypedItems("item_c_")
    typed.hold("s1", "Mid.", "system")
    typed.hold("u1", "hi")
    typed.hold("s2", "After hi.", "system")
    [due] = typed.release()  # what is ahead of the first user message goes
    assert due.item == "s1" and [h[0] for h in typed.held] == ["u1", "s2"]
    assert typed.release() == []  # a user message is first: the rest waits for it
    due = typed.release(spoken=True)  # the user speaks: everything held goes, in order
    assert [(c.role, c.item) for c in due] == [("user", "u1"), ("system", "s2")]
    # A context the session refuses is taken back by its item, as a logged one is taken.
    assert typed.taken(due[0].id) == ["u1"]
    assert typed.refused(due[1].id, busy=False) is None  # refused() is the turn's
    assert typed.refused("unknown", busy=False) is None


def test_instructions_created_after_the_users_message_go_before_it() -> None:
    """pipecat-flows appends a node's task (system) with, or after, the user's message:
    the turn is the user's, with the instructions added before it."""
    typed = TypedItems("item_c_")
    typed.hold("u1", "book a table")
    typed.hold("s1", "Ask for the time.", "system")
    *contexts, turn = typed.send("said")
    assert [(c.role, c.item) for c in contexts] == [("system", "s1")]  # type: ignore[union-attr]
    assert isinstance(turn, UserMessage) and turn.item == "u1"
