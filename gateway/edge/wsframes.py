"""Writing a batch of text frames in one socket write: the one place that uses websockets' internals.

websockets' public API sends one message per ``await send()``, and its asyncio
connection hands the transport each frame's header and payload as separate
writes. A gateway node sends many tiny frames (a token chunk is ~60 bytes of
envelope around ~4 characters), usually several per delivery. Measured with
``tests/bench/ws_batch_bench.py`` (server in its own process, 40,000 frames,
median of 5, 2-core machine, websockets 15–16):

| frames per batch | public ``await send()`` | this module | ratio |
|---|---|---|---|
| 1 | 19.6 µs/frame | 16.6 µs/frame | 0.85 |
| 4 | 16.4 µs/frame | 8.1 µs/frame | 0.49 |
| 16 | 13.8 µs/frame | 5.8 µs/frame | 0.42 |

So the internals are used, here only: ``ServerConnection.protocol`` (the
sans-I/O ``Protocol``: ``send_text``, ``send_binary``, ``writes``, ``state``,
``extensions``), ``ServerConnection.send_data``, ``send_context``, ``paused``
and ``transport`` (``write_now`` frames uncompressed text itself).
``tests/edge/test_wsframes.py`` fails loudly when a websockets release
changes any of them; the version bound in pyproject.toml keeps an untested
major out.
"""

from __future__ import annotations

from collections.abc import Sequence

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from gateway.wsread import FastReader

__all__ = ["BatchingConnection", "can_write_now", "send_batch", "write_binary_now", "write_now"]


class BatchingConnection(FastReader, ServerConnection):
    """A server connection that hands the socket one write per batch of frames.

    It also reads its client's plain frames without websockets' parser
    (``gateway.wsread``): a voice client sends one binary frame per 20 ms.
    """

    def send_data(self) -> None:
        writes = self.protocol.writes
        if len(writes) > 1 and all(writes):  # an empty write means EOF: keep it apart
            self.protocol.writes = [b"".join(writes)]
        super().send_data()


def can_write_now(ws: ServerConnection) -> bool:
    """Open, and the socket buffer below its high-water mark (``write_now`` may be used)."""
    return not ws.paused and ws.protocol.state is State.OPEN


def write_now(ws: ServerConnection, frames: Sequence[bytes]) -> None:
    """Queue ``frames`` (UTF-8 JSON text) and write them now, without awaiting.

    For the caller that checked ``can_write_now``: nothing waits for the
    buffer to drain. Raises what the connection raises when it broke.
    """
    protocol = ws.protocol
    if protocol.extensions or protocol.writes:  # compressed, or websockets has bytes queued
        for data in frames:
            protocol.send_text(data)
        ws.send_data()
        return
    # A server's frame is a 2, 4 or 10-byte header and the payload, unmasked:
    # built here rather than by websockets' Frame.serialize (a measured share
    # of the CPU per event at low load, where every event is one frame).
    parts: list[bytes] = []
    for data in frames:
        n = len(data)
        if n < 126:
            parts.append(_SHORT_TEXT[n])
        elif n < 65536:
            parts.append(b"\x81\x7e" + n.to_bytes(2))
        else:
            parts.append(b"\x81\x7f" + n.to_bytes(8))
        parts.append(data)
    ws.transport.write(b"".join(parts))


# Headers of final, unmasked text frames of 0..125 bytes.
_SHORT_TEXT = [bytes((0x81, n)) for n in range(126)]


def write_binary_now(ws: ServerConnection, frame: bytes) -> None:
    """One binary frame (the model's speech), written now; as ``write_now``."""
    ws.protocol.send_binary(frame)
    ws.send_data()


async def send_batch(ws: ServerConnection, frames: Sequence[bytes]) -> None:
    """Send ``frames`` as one write and wait until the buffer drains below its limit."""
    if len(frames) == 1:
        await ws.send(frames[0], text=True)
        return
    async with ws.send_context():
        protocol = ws.protocol
        for data in frames:
            protocol.send_text(data)
