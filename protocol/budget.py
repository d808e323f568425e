"""Bounded context: the history a provider is given, cut to a token budget.

A session's history grows without bound, but a realtime model's context does
not (tens of thousands of tokens), and a long history replayed whole on every
reconnect, takeover or provider fallback costs time and money. ``fit`` cuts
the assembled messages to a budget, in this order:

1. nothing, when they fit;
2. older tool results are shortened first (they are the bulk of most long
   sessions, and the model already acted on them), oldest first, to a head of
   ``RESULT_HEAD`` characters and a note that says how much was cut;
3. then whole older messages are dropped, oldest first, starting at a user
   message so the conversation still reads in turns, and a note leading the
   first kept message tells the model that earlier conversation was cut.

The latest turn (from the last user message that is not a tool result on)
is always kept whole, even when it alone exceeds the budget: the model must
see what it is answering. The system prompt is not in the messages: the
caller subtracts its size from the budget.

Tokens are estimated from characters (``context_tokens_estimate``), which is what a
gateway that serves several providers without their tokenizers can do; the
estimate errs high for English text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from protocol.assembly import Message, is_note

__all__ = ["CUT_NOTE", "RESULT_HEAD", "context_tokens_estimate", "fit"]

RESULT_HEAD: Final = 400
"""Characters of an old tool result's content kept when results are shortened."""

CUT_NOTE: Final = (
    "(Earlier conversation — {count} messages — was left out to fit the context "
    "budget. Ask the user if you need something from it.)"
)
_RESULT_START: Final = "<results>\n"


def context_tokens_estimate(text: str) -> int:
    """About one token per 3.5 characters, rounded up (errs high, never zero for text)."""
    return (len(text) * 2 + 6) // 7


def _is_turn_start(message: Message) -> bool:
    return (
        message.role == "user"
        and not message.context
        and not message.content.startswith(_RESULT_START)
        and not is_note(message)
    )


def _shorten_result(message: Message) -> Message:
    body = message.content
    if len(body) <= RESULT_HEAD + 200:
        return message
    cut = len(body) - RESULT_HEAD
    return Message(
        role="user",
        content=(
            f"{body[:RESULT_HEAD]}\n[… {cut} more characters of these tool results were "
            "cut to fit the context budget; run the tools again if you need them]\n</results>"
        ),
    )


def fit(
    messages: Sequence[Message],
    budget: int,
    *,
    estimate: Callable[[str], int] = context_tokens_estimate,
) -> list[Message]:
    """``messages`` cut to ``budget`` tokens (see the module docstring); never reordered."""
    sizes = [estimate(m.content) for m in messages]
    total = sum(sizes)
    if total <= budget:
        return list(messages)
    last_turn = next(
        (i for i in range(len(messages) - 1, -1, -1) if _is_turn_start(messages[i])), 0
    )
    out = list(messages)
    # 2. Shorten older tool results, oldest first.
    for i in range(last_turn):
        if total <= budget:
            return out
        if out[i].role == "user" and out[i].content.startswith(_RESULT_START):
            shorter = _shorten_result(out[i])
            new_size = estimate(shorter.content)
            total += new_size - sizes[i]
            sizes[i] = new_size
            out[i] = shorter
    if total <= budget:
        return out
    # 3. Drop whole older messages, oldest first, resuming at a turn start.
    note_size = estimate(CUT_NOTE.format(count=len(out)))
    start = 0
    while start < last_turn and total + note_size > budget:
        total -= sizes[start]
        start += 1
    while start < last_turn and not _is_turn_start(out[start]):
        total -= sizes[start]
        start += 1
    if start == 0:
        return out
    # The note leads the first kept message (a user turn), so roles still alternate.
    first = out[start]
    noted = Message(role=first.role, content=f"{CUT_NOTE.format(count=start)}\n\n{first.content}")
    return [noted, *out[start + 1 :]]
