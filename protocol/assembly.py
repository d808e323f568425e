"""Context assembly: stored history → the messages an upstream model sees.

History holds semantic units *without* markers (the seed's Storage section):
``user``, ``think``, ``call``, ``result``, ``respond``, ``cancelled``, ``context``
(a message added without a turn), and ``forgotten`` (a client took messages out of
what the model sees: the user, context and respond items stamped with a seq in its
range are left out). The markers
are synthesized here, so the model always sees the protocol written the same
way, whichever node, upstream connection or provider produced the history. The
gateway uses this both to open an upstream session and to rebuild one after an
upstream drop or a node takeover, so both paths give the model the same context.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from protocol.events import (
    Call,
    Cancelled,
    Context,
    Error,
    Forget,
    Forgotten,
    Respond,
    Result,
    Role,
    Think,
    User,
)

__all__ = [
    "BARGED_IN_NOTE",
    "CANCELLED_NOTE",
    "HistoryItem",
    "Message",
    "assemble",
    "assistant_text",
    "context_message",
    "decode_history_item",
    "encode_history_item",
    "forgets",
    "forgetting",
    "is_note",
    "results_message",
]

HistoryItem = User | Think | Call | Result | Respond | Cancelled | Forgotten | Context

# What the model is told when the user cancelled its previous response.
CANCELLED_NOTE: Final = "(The user cancelled your previous response before it finished.)"
# ... and when the user spoke over its spoken answer, having heard ``heard_ms`` of it.
BARGED_IN_NOTE: Final = (
    "(The user spoke over your previous response after hearing {seconds:.1f} s of its "
    "audio; they did not hear the rest.)"
)


def is_note(message: Message) -> bool:
    """Whether ``message`` is one of the gateway's notes (not the user's own words)."""
    return message.role == "user" and (
        message.content == CANCELLED_NOTE or message.content.startswith(_BARGED_IN_START)
    )


_BARGED_IN_START: Final = BARGED_IN_NOTE.split("{", 1)[0]


class Message(msgspec.Struct, frozen=True):
    """One upstream conversation message (``context``: one a client added without a
    turn, which starts none: ``protocol.budget`` keeps the turn it came in)."""

    role: Role
    content: str
    context: bool = False


_history_encoder: Final = msgspec.json.Encoder()
_history_decoder: Final = msgspec.json.Decoder(HistoryItem)


def encode_history_item(item: HistoryItem) -> bytes:
    return _history_encoder.encode(item)


def decode_history_item(data: bytes | str) -> HistoryItem:
    return _history_decoder.decode(data)


def results_message(results_json: str) -> Message:
    """The user message that hands a batch's results back to the model.

    ``results_json`` is a ``result`` event's content: the JSON array of
    ``{"tool", "status", "content"}`` objects, in call order.
    """
    return Message(role="user", content=f"<results>\n{results_json}\n</results>")


def assistant_text(steps: Sequence[Think | Call | Respond], *, ended: bool = False) -> str:
    """One assistant message's text: thinks, one execute block of the calls, the response.

    Consecutive think (or respond) chunks are joined; all calls of the step go
    into one ``<execute>`` block, in order, as the model wrote them.
    """
    parts: list[str] = []
    calls: list[str] = []
    kind = ""
    buf: list[str] = []

    def flush() -> None:
        if not buf:
            return
        text = "".join(buf)
        if kind == "think":
            parts.append(f"<think>{text}</think>")
        elif text.strip():
            parts.append(text.strip())
        buf.clear()

    for item in steps:
        if isinstance(item, Call):
            flush()
            kind = "call"
            calls.append(item.content)
            continue
        if calls:
            parts.append(_execute_block(calls))
            calls = []
        this = "think" if isinstance(item, Think) else "respond"
        if this != kind:
            flush()
            kind = this
        buf.append(item.content)
    flush()
    if calls:
        parts.append(_execute_block(calls))
    text = "\n\n".join(parts)
    if ended and not calls:
        text = f"{text}\n<end>" if text else "<end>"
    return text


def _execute_block(calls: list[str]) -> str:
    return "<execute>\n[" + ",\n".join(calls) + "]\n</execute>"


def forgets(item: HistoryItem, forgotten: Sequence[Forgotten]) -> bool:
    """Whether ``item`` is one a ``forgotten`` took out of what the model sees: a user
    message, a context message or answer text whose seq (its first logged event's) is
    in its range."""
    seq = item.seq
    return (
        seq > 0
        and isinstance(item, User | Respond | Context)
        and any(f.first <= seq <= f.last for f in forgotten)
    )


def forgetting(history: Sequence[HistoryItem], message: Forget, *, idle: bool) -> Forgotten | Error:
    """The ``forgotten`` event ``message`` makes, or the refusal saying what to send instead.

    History items carry the seq of the first logged event they hold
    (``SessionLog.persist``), so a client names a user message by its ``user``
    event's seq and an answer by its first and last ``respond`` chunks. A
    ``forgotten`` is appended, never an item removed: the log and the store stay
    append-only, and resume and takeover read the same history."""
    if not idle:
        return Error(
            code="turn_active",
            content="messages are forgotten between turns: wait for the turn's end (or "
            "cancel it), then send forget again",
        )
    first, last = message.first, message.last
    if first > last:
        return Error(code="bad_frame", content="forget takes first <= last (seqs of the log)")
    done = [item for item in history if isinstance(item, Forgotten)]
    if not any(
        isinstance(item, User | Respond | Context)
        and first <= item.seq <= last
        and not forgets(item, done)
        for item in history
    ):
        return Error(
            code="unknown_item",
            content=f"the model holds no user message or answer text logged from seq {first} "
            f"through {last} (forgotten already, or none there): name a user event's seq, or "
            "an answer's first and last respond chunks",
        )
    return Forgotten(first=first, last=last)


def context_message(item: Context) -> Message:
    """A ``context`` as the model is given it: an assistant line is written as an
    answer of its own is (with ``<end>``), so the protocol reads the same throughout."""
    if item.role == "assistant":
        text = assistant_text([Respond(content=item.content)], ended=True)
        return Message(role="assistant", content=text, context=True)
    return Message(role=item.role, content=item.content, context=True)


def _ends(step: Sequence[Think | Call | Respond]) -> bool:
    """A step followed by a message ended its turn, unless it stopped at its calls (a
    ``context`` added while the turn waited for them)."""
    return not step or type(step[-1]) is not Call


def assemble(history: Iterable[HistoryItem]) -> list[Message]:
    """Turn stored history into upstream messages with synthesized markers.

    - ``user`` → a user message;
    - a run of ``think``/``call``/``respond`` → one assistant message; a run that
      is answered by a new ``user`` message (the turn ended) gets ``<end>``;
    - ``result`` → a user message ``<results>\\n[...]\\n</results>``;
    - ``cancelled`` → a user message telling the model it was cut off (after a
      barge-in, how much of its spoken answer the user heard);
    - ``context`` → a message of its role (``context_message``); the step before it keeps its ``<end>``
      unless it stopped at its calls (added while the turn waited for them);
    - a user message or answer text a ``forgotten`` names → nothing (an assistant
      message left with only its thoughts goes too).
    """
    history = list(history)
    forgotten = [item for item in history if isinstance(item, Forgotten)]
    messages: list[Message] = []
    step: list[Think | Call | Respond] = []
    answer_gone = False  # the step's answer text was forgotten

    def close_step(*, ended: bool) -> None:
        nonlocal answer_gone
        if answer_gone and not any(type(item) is not Think for item in step):
            step.clear()
        answer_gone = False
        if step:
            text = assistant_text(step, ended=ended)
            if text:
                messages.append(Message(role="assistant", content=text))
            step.clear()

    for item in history:
        if forgotten and (isinstance(item, Forgotten) or forgets(item, forgotten)):
            if isinstance(item, User | Context):  # the answer before it still ended its turn
                close_step(ended=isinstance(item, User) or _ends(step))
            elif isinstance(item, Respond):
                answer_gone = True
            continue
        if isinstance(item, Think | Call | Respond):
            step.append(item)
        elif isinstance(item, User):
            close_step(ended=True)
            messages.append(Message(role="user", content=item.content))
        elif isinstance(item, Result):
            close_step(ended=False)
            messages.append(results_message(item.content))
        elif isinstance(item, Context):
            close_step(ended=_ends(step))
            messages.append(context_message(item))
        elif isinstance(item, Cancelled):
            close_step(ended=False)
            heard = item.heard_ms
            note = (
                CANCELLED_NOTE
                if isinstance(heard, msgspec.UnsetType)
                else BARGED_IN_NOTE.format(seconds=heard / 1000)
            )
            messages.append(Message(role="user", content=note))
    close_step(ended=False)
    return messages
