"""Commands between nodes: a client on one node, its session driven on another.

A client may be attached to a node that only follows the session's log (the
lease is held elsewhere, e.g. by the node a second browser tab is on, or by
the node still finishing a turn after this client reconnected). Its ``user``
and ``cancel`` messages are forwarded to the driving node over the store's
publish/subscribe channel ``node:<node_id>``; an error that the driving node
answers with (``turn_active``, ``no_turn``) comes back the same way to the
client's connection. Delivery is best effort: what matters reaches the client
through the log (a started turn's ``user`` event, a ``cancelled`` event).
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = [
    "BROADCAST_CHANNEL",
    "ControlMessage",
    "Deleted",
    "Forward",
    "Reply",
    "decode_control",
    "encode_control",
    "node_channel",
]


class Forward(msgspec.Struct, tag_field="kind", tag="forward", frozen=True):
    """A client command for the node driving ``sid``."""

    sid: str
    command: bytes  # the client's frame, as it sent it (already validated)
    origin: str  # node id to send a reply to
    conn: str  # connection id on the origin node


class Reply(msgspec.Struct, tag_field="kind", tag="reply", frozen=True):
    """An answer to a forwarded command, for one connection.

    ``error`` is an encoded error event for the client; ``retry`` is the
    command to dispatch again instead, when the session stopped being driven
    by the replying node while the command was on its way (its lease is being
    released: the origin node can take the session over now).
    """

    conn: str
    error: bytes = b""
    retry: bytes = b""


class Deleted(msgspec.Struct, tag_field="kind", tag="deleted", frozen=True):
    """The session ``sid`` was deleted: every node lets go of it (on ``BROADCAST_CHANNEL``)."""

    sid: str


ControlMessage = Forward | Reply | Deleted

BROADCAST_CHANNEL: Final = "nodes"
"""The channel every node listens on, for what concerns all of them (a deletion)."""

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(ControlMessage)


def encode_control(message: ControlMessage) -> bytes:
    return _encoder.encode(message)


def decode_control(data: bytes) -> ControlMessage | None:
    """The message, or None for garbage on the channel (logged by the caller)."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def node_channel(node_id: str) -> str:
    return f"node:{node_id}"
