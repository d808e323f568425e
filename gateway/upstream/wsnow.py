"""Writing one text frame to an upstream socket without awaiting: websockets internals, here only.

User audio goes to the provider 50 frames a second per voice session, each
an ``input_audio_buffer.append`` (or ``realtime_input``) text frame.
``await ws.send()`` enters an async context manager per frame whose cost is
mostly bookkeeping: with 100 voice sessions through one gateway process
(``tests/bench/voice_session_bench.py``, py-spy) it was half the time spent
relaying audio upstream. When the socket buffer is below its high-water mark
nothing needs awaiting, so the frame is handed to the sans-I/O protocol and
written at once; otherwise the caller falls back to ``await ws.send()``,
which waits for the buffer to drain (flow control is kept).

Every request of a turn (the user's message, ``response.create``, tool
results) takes the same path: at 50 streaming sessions websockets' ``send``
was 7% of the node's CPU (py-spy), a third of it ``Frame.serialize`` drawing
each frame's mask with its own ``getrandom`` syscall. ``write_text_now``
frames the text itself: header, a mask from a pool of ``os.urandom`` bytes
(as unpredictable as one drawn per frame, RFC 6455 §5.3), and the payload
masked by websockets' C ``apply_mask``, in one transport write.

Internals used: ``Connection.protocol`` (``state``, ``send_text``, ``side``,
``extensions``, ``writes``), ``Connection.send_data``, ``Connection.transport``,
``Connection.paused``, ``Connection.send_in_progress`` (a fragmented message
being sent). ``tests/upstream/test_wsnow.py`` fails when a websockets release
changes them; pyproject.toml bounds the major.
"""

from __future__ import annotations

import os

from websockets.asyncio.connection import Connection
from websockets.protocol import CLIENT, State

try:  # websockets' C masking, as its own framing uses
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build without the C extension
    from websockets.utils import apply_mask

__all__ = ["can_write_now", "write_text_now"]


class _Masks:
    """Masking keys cut from one ``os.urandom`` draw of 1,024 keys at a time."""

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def next(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = os.urandom(4096), 0
        self._at = at + 4
        return self._pool[at : at + 4]


_masks = _Masks()


def can_write_now(ws: Connection) -> bool:
    """Open, below the buffer's high-water mark, no fragmented message being
    sent: ``write_text_now`` may be used; otherwise ``await ws.send``."""
    return not ws.paused and ws.send_in_progress is None and ws.protocol.state is State.OPEN


def write_text_now(ws: Connection, data: bytes) -> None:
    """Write ``data`` (UTF-8 text) as one frame now, for a caller that checked
    ``can_write_now``. Raises what the transport raises when it broke."""
    protocol = ws.protocol
    if protocol.side is not CLIENT or protocol.extensions or protocol.writes:
        protocol.send_text(data)  # compressed, or bytes already queued: websockets frames it
        ws.send_data()
        return
    n = len(data)
    if n < 126:
        header = bytes((0x81, 0x80 | n))
    elif n < 65536:
        header = b"\x81\xfe" + n.to_bytes(2)
    else:
        header = b"\x81\xff" + n.to_bytes(8)
    mask = _masks.next()
    ws.transport.write(header + mask + apply_mask(data, mask))
