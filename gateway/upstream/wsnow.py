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

Internals used: ``Connection.protocol`` (``state``, ``send_text``),
``Connection.send_data``, ``Connection.paused``, ``Connection.send_in_progress``
(a fragmented message being sent). ``tests/upstream/test_wsnow.py`` fails
when a websockets release changes them; pyproject.toml bounds the major.
"""

from __future__ import annotations

from websockets.asyncio.connection import Connection
from websockets.protocol import State

__all__ = ["can_write_now", "write_text_now"]


def can_write_now(ws: Connection) -> bool:
    """Open, below the buffer's high-water mark, no fragmented message being
    sent: ``write_text_now`` may be used; otherwise ``await ws.send``."""
    return not ws.paused and ws.send_in_progress is None and ws.protocol.state is State.OPEN


def write_text_now(ws: Connection, data: bytes) -> None:
    """Write ``data`` (UTF-8 text) as one frame now, for a caller that checked
    ``can_write_now``. Raises what the transport raises when it broke."""
    ws.protocol.send_text(data)
    ws.send_data()
