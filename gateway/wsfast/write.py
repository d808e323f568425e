"""Writing WebSocket text frames without awaiting, and batches in one socket write.

websockets' public API sends one message per ``await send()``: an async
context manager per frame, ``Frame.serialize`` per frame, and its asyncio
connection hands the transport each frame's header and payload as separate
writes. Both directions of the gateway send many tiny frames, so when the
socket buffer is below its high-water mark (``can_write_now``) nothing needs
awaiting: the frames are framed here and written at once. Otherwise the
caller falls back to ``await ws.send()`` (or ``send_batch``), which waits for
the buffer to drain (flow control is kept).

**To clients** (server side, unmasked). A token chunk is ~60 bytes of envelope
around ~4 characters, usually several per delivery. Measured with
``tests/bench/ws_batch_bench.py`` (server in its own process, 40,000 frames,
median of 5, 2-core machine, websockets 15–16):

| frames per batch | public ``await send()`` | ``write_now`` | ratio |
|---|---|---|---|
| 1 | 19.6 µs/frame | 16.6 µs/frame | 0.85 |
| 4 | 16.4 µs/frame | 8.1 µs/frame | 0.49 |
| 16 | 13.8 µs/frame | 5.8 µs/frame | 0.42 |

**To providers** (client side, masked). User audio goes to the provider 50
frames a second per voice session, each an ``input_audio_buffer.append`` (or
``realtime_input``) text frame: with 100 voice sessions through one gateway
process (``tests/bench/voice_session_bench.py``, py-spy) ``await ws.send()``'s
bookkeeping was half the time spent relaying audio upstream. Every request of
a turn (the user's message, ``response.create``, tool results) takes the same
path: at 50 streaming sessions websockets' ``send`` was 7% of the node's CPU
(py-spy), a third of it ``Frame.serialize`` drawing each frame's mask with its
own ``getrandom`` syscall. ``write_text_now`` frames the text itself: header,
a mask from a pool of ``os.urandom`` bytes (as unpredictable as one drawn per
frame, RFC 6455 §5.3), and the payload masked by websockets' C
``apply_mask``, in one transport write; ``write_texts_now`` writes several so,
in one transport write.

Internals used: ``Connection.protocol`` (the sans-I/O ``Protocol``:
``state`` and the ``_state`` it returns, ``side``, ``extensions``, ``writes``,
``send_text``, ``send_binary``), ``Connection.send_data``, ``Connection.send_context``,
``Connection.transport``, ``Connection.paused``, ``Connection.send_in_progress``
(a fragmented message being sent), ``apply_mask``.
``tests/wsfast/test_canary.py`` fails when a websockets release changes them;
pyproject.toml bounds the major.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection
from websockets.protocol import CLIENT, State

try:  # websockets' C masking, as its own framing uses
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build without the C extension
    from websockets.utils import apply_mask

__all__ = [
    "BatchedWrites",
    "can_write_now",
    "send_batch",
    "write_binary_now",
    "write_now",
    "write_text_now",
    "write_texts_now",
]


_OPEN = State.OPEN  # a module constant: read per audio frame, not an enum class's attribute


def can_write_now(ws: Connection) -> bool:
    """Open, below the buffer's high-water mark, no fragmented message being
    sent: the ``write_*_now`` functions may be used; otherwise ``await ws.send``.

    Reads ``Protocol._state``, what the ``state`` property returns: called once per
    20 ms audio frame of every session, where the property was one more Python call."""
    return not ws.paused and ws.send_in_progress is None and ws.protocol._state is _OPEN


# ---------------------------------------------------------------- client side: to providers


def _more_masks() -> bytes:
    """A mask, and the pool refilled: 1,024 keys cut from one ``os.urandom`` draw."""
    pool = os.urandom(4096)
    _masks.extend(pool[at : at + 4] for at in range(4, 4096, 4))
    return pool[:4]


_masks: list[bytes] = []  # masking keys not used yet, taken with one ``pop`` a frame
# A masked text frame's header with its mask, packed in one call: 7, 16 or 64-bit length.
_HEAD7 = struct.Struct("!BB4s").pack
_HEAD16 = struct.Struct("!BBH4s").pack
_HEAD64 = struct.Struct("!BBQ4s").pack


def write_text_now(ws: Connection, data: bytes) -> None:
    """Write ``data`` (UTF-8 text) as one frame now, for a caller that checked
    ``can_write_now``. Raises what the transport raises when it broke."""
    protocol = ws.protocol
    if protocol.side is not CLIENT or protocol.extensions or protocol.writes:
        protocol.send_text(data)  # compressed, or bytes already queued: websockets frames it
        ws.send_data()
        return
    # ``_masked_text`` inlined: this is every audio frame's write, and the call cost
    # 0.15-0.2 µs of a frame's 4.2 (tests/bench/voice_frame_bench.py, warm).
    mask = _masks.pop() if _masks else _more_masks()
    n = len(data)
    if n < 126:
        head = _HEAD7(0x81, 0x80 | n, mask)
    elif n < 65536:
        head = _HEAD16(0x81, 0xFE, n, mask)
    else:
        head = _HEAD64(0x81, 0xFF, n, mask)
    ws.transport.write(head + apply_mask(data, mask))


def write_texts_now(ws: Connection, frames: Sequence[bytes]) -> None:
    """``write_text_now`` for several frames, in order, in one transport write: a
    long typed message goes to GPT-Live as hundreds of 1,500-character appends, and
    a write each (a syscall, or a TLS record) held the loop ~10 ms for 900 KB of text,
    against ~1.5 ms for one write of them all (``tests/upstream/test_live_adapter.py``)."""
    protocol = ws.protocol
    if protocol.side is not CLIENT or protocol.extensions or protocol.writes:
        for data in frames:
            protocol.send_text(data)
        ws.send_data()
        return
    ws.transport.write(b"".join([_masked_text(data) for data in frames]))


def _masked_text(data: bytes) -> bytes:
    """``data`` as one masked text frame: header, mask, masked payload."""
    mask = _masks.pop() if _masks else _more_masks()
    n = len(data)
    if n < 126:
        head = _HEAD7(0x81, 0x80 | n, mask)
    elif n < 65536:
        head = _HEAD16(0x81, 0xFE, n, mask)
    else:
        head = _HEAD64(0x81, 0xFF, n, mask)
    return head + apply_mask(data, mask)


# ---------------------------------------------------------------- server side: to clients


class BatchedWrites(Connection):
    """Mixed into a server connection: the socket gets one write per batch of frames."""

    def send_data(self) -> None:
        writes = self.protocol.writes
        if len(writes) > 1 and all(writes):  # an empty write means EOF: keep it apart
            self.protocol.writes = [b"".join(writes)]
        super().send_data()


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
    """One binary frame (the model's speech), written now; as ``write_now``.

    Framed here, header and payload in one transport write, as ``write_now``
    does for text: websockets' ``send_binary`` built a ``Frame`` and
    serialized it per 20 ms of speech.
    """
    protocol = ws.protocol
    if protocol.extensions or protocol.writes:  # compressed, or websockets has bytes queued
        protocol.send_binary(frame)
        ws.send_data()
        return
    n = len(frame)
    if n < 126:
        header = bytes((0x82, n))
    elif n < 65536:
        header = b"\x82\x7e" + n.to_bytes(2)
    else:
        header = b"\x82\x7f" + n.to_bytes(8)
    ws.transport.write(header + frame)


async def send_batch(ws: ServerConnection, frames: Sequence[bytes]) -> None:
    """Send ``frames`` as one write and wait until the buffer drains below its limit."""
    if len(frames) == 1:
        await ws.send(frames[0], text=True)
        return
    async with ws.send_context():
        protocol = ws.protocol
        for data in frames:
            protocol.send_text(data)
