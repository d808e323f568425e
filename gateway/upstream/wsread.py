"""Reading the provider's frames without websockets' generator parser: websockets internals, here only.

Every token the model streams is one small text frame from the provider.
websockets parses each through a chain of generator-based coroutines
(``Protocol.parse`` → ``Frame.parse`` → ``StreamReader.read_exact``), a
measured share of the gateway's CPU per event at low load, where every event
is its own ``data_received`` (docs/performance.md). ``FastReadConnection``
reads the common frame itself: unmasked, final, no RSV bits (no extension is
negotiated: the gateway dials with ``compression=None``), text or binary,
outside a fragmented message, within ``max_size``. It hands that frame to the
same queue ``recv()`` reads (``recv_messages.put``). Every other frame (ping,
pong, close, fragments, anything odd) is handed whole to websockets' own
parser, which is always at a frame boundary when it gets one, so pings are
answered, closes handshaken and protocol errors reported exactly as before.

It starts reading only once the handshake is over and websockets' parser is
waiting for a new frame with nothing buffered (``_at_frame_boundary``), and
stops for good when the connection leaves the OPEN state.

Internals used: ``Connection.protocol`` (``state``, ``extensions``,
``current_size``, ``max_message_size``, ``parser``, ``reader``),
``Connection.recv_messages.put``, ``StreamReader.at_eof``.
``tests/upstream/test_wsread.py`` fails when a websockets release changes
them; pyproject.toml bounds the major.
"""

from __future__ import annotations

from websockets.asyncio.client import ClientConnection
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, State
from websockets.streams import StreamReader

__all__ = ["FastReadConnection"]

# First byte of a final, unfragmented text / binary frame with no RSV bit.
_TEXT = 0x81
_BINARY = 0x82
_AT_EOF = StreamReader.at_eof.__code__


def _at_frame_boundary(protocol: Protocol) -> bool:
    """websockets' parser is waiting for the first byte of a frame, with nothing buffered."""
    if protocol.reader.buffer:
        return False
    gen = protocol.parser
    while (inner := getattr(gen, "gi_yieldfrom", None)) is not None:
        gen = inner
    return getattr(gen, "gi_code", None) is _AT_EOF


class FastReadConnection(ClientConnection):
    """A client connection that reads the provider's plain data frames itself (see the module)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._fast = False
        self._rest = b""
        self.frames_read_fast = 0
        """Data frames this class read itself (the rest went through websockets)."""

    def data_received(self, data: bytes) -> None:
        if not self._fast:
            super().data_received(data)
            protocol = self.protocol
            if (
                protocol.state is State.OPEN
                and not protocol.extensions
                and _at_frame_boundary(protocol)
            ):
                self._fast = True
            return
        buf = self._rest + data if self._rest else data
        self._rest = b""
        protocol = self.protocol
        limit = protocol.max_message_size
        put = self.recv_messages.put
        pos = 0
        end_of_data = len(buf)
        while end_of_data - pos >= 2:
            first = buf[pos]
            length = buf[pos + 1]
            head = 2
            if length >= 126:  # also a set MASK bit (>= 0x80): websockets refuses it
                if length == 126:
                    if end_of_data - pos < 4:
                        break
                    length = int.from_bytes(buf[pos + 2 : pos + 4])
                    head = 4
                elif length == 127:
                    if end_of_data - pos < 10:
                        break
                    length = int.from_bytes(buf[pos + 2 : pos + 10])
                    head = 10
                else:
                    self._slow(buf[pos:])
                    return
            if limit is not None and length > limit:
                self._slow(buf[pos:])  # websockets closes with 1009, as before
                return
            end = pos + head + length
            if end > end_of_data:
                break
            if first in (_TEXT, _BINARY) and protocol.current_size is None:
                put(Frame(Opcode.TEXT if first == _TEXT else Opcode.BINARY, buf[pos + head : end]))
                self.frames_read_fast += 1
            else:
                super().data_received(buf[pos:end])  # exactly one frame: a boundary after it
                if protocol.state is not State.OPEN:
                    self._slow(buf[end:])
                    return
            pos = end
        if pos < end_of_data:
            self._rest = buf[pos:]

    def _slow(self, data: bytes) -> None:
        """From here on websockets parses everything (closing, or a frame it must refuse)."""
        self._fast = False
        self._rest = b""
        if data:
            super().data_received(data)
