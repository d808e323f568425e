"""Reading plain WebSocket data frames without websockets' generator parser.

Every token the model streams is one small text frame from the provider, and
every 20 ms of a voice client's speech one binary frame to the gateway.
websockets parses each through a chain of generator-based coroutines
(``Protocol.parse`` → ``Frame.parse`` → ``StreamReader.read_exact``), a
measured share of the gateway's CPU per event at low load, where every frame
is its own ``data_received`` (docs/performance.md). ``FastReader`` reads the
common frame itself: final, no RSV bits (no extension is negotiated: both
sides run with ``compression=None``), text or binary, outside a fragmented
message, within ``max_size``, masked exactly when the peer must mask (a
client's frames to a server). It hands that frame to the same queue
``recv()`` reads (``recv_messages.put``). Every other frame (ping, pong,
close, fragments, anything odd) is handed whole to websockets' own parser,
which is always at a frame boundary when it gets one, so pings are answered,
closes handshaken and protocol errors reported exactly as before.

It starts reading only once the handshake is over and websockets' parser is
waiting for a new frame with nothing buffered (``at_frame_boundary``), and
stops for good when the connection leaves the OPEN state.

**Messages queue.** What ``recv()`` reads is a ``MessageQueue``
(``gateway.wsfast.messages``) in place of websockets' ``Assembler``. Large frames:
``gateway.wsfast.large``.

**Limits** (one peer once froze the node for everyone). A message is
at most ``MAX_FRAGMENTS`` frames (websockets' own ``Assembler`` refuses past
4,096 too; its parser already bounds the bytes of a message by ``max_size``):
a message in 1,048,574 one-byte fragments held ``/healthz`` 12.2 s and grew
the node 286 MB; past the limit the connection is failed with 1009. A text
message must be UTF-8 (RFC 6455 §8.1): 1007 otherwise, on both sides (a
provider's invalid frame was skipped by its adapter). Pings and unsolicited
pongs are a token bucket (``PING_BURST`` at once, ``PINGS_PER_SECOND``
sustained): every ping owes a pong, so a peer that pings without reading its
pongs (108 MB of pings: ``/healthz`` 5.8 s, +155 MB) is closed with 1008
instead of filling the node's write buffer. A large frame is gathered in a
``bytearray`` that is parsed once whole: gathering it by concatenation was
quadratic (64 MiB in 256 KiB reads: 8.4 s of one core, 0.08 s now).

**Intercept.** A message that arrives while a reader waits on an empty queue
is first offered to ``intercept`` (when set), in the read callback: the
upstream adapters hand the running response's text deltas to the session
there (``Upstream.stream_text_to``), with no task resumed per token; the
client and phone edges relay user audio frames there (one per 20 ms per
session, ``tests/bench/voice_cost_bench.py``). An
intercept that took a message may ``nudge()`` the reader, whose ``recv()``
then returns ``None``. Only an empty queue is intercepted, so the order of
messages is kept.

Internals used: ``Connection.protocol`` (``state``, ``side``, ``extensions``,
``current_size``, ``max_message_size``, ``parser``, ``reader``),
``Connection.recv_messages`` (its ``put``, ``get``, ``get_iter`` and ``close``,
as ``Connection`` calls them), ``Connection.max_queue_high``/``max_queue_low``,
``StreamReader.at_eof``, ``apply_mask``; to fail a connection from the read
callback, ``Protocol.fail``, ``Connection.send_data``, ``close_timeout``,
``connection_lost_waiter``, ``set_connection_exc`` (16: ``set_recv_exc``). ``tests/wsfast/test_canary.py``
fails when a websockets release changes them; pyproject.toml bounds the major.
"""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.connection import Connection
from websockets.exceptions import ProtocolError
from websockets.frames import Frame, Opcode
from websockets.protocol import SERVER, Protocol, State
from websockets.streams import StreamReader

from gateway.wsfast.large import (
    BUDGETED,
    BURST_READ,
    UNMASK_AS_IT_COMES,
    BudgetShare,
    FrameBudget,
    Gathering,
    PassReads,
    unmask_arrived,
)
from gateway.wsfast.messages import MessageQueue

try:  # websockets' C unmasking, as its own parser uses
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build without the C extension
    from websockets.utils import apply_mask

__all__ = [
    "DISCARDED_AT_MOST",
    "FRAMES_PER_CALL",
    "PINGS_PER_SECOND",
    "PING_BURST",
    "FastReader",
    "at_frame_boundary",
]

FRAMES_PER_CALL = 256
"""Data frames one read callback takes: a 256 KB read of 2-byte frames is 32,000 of them,
which held the loop 40-80 ms, and 1,024 voice frames relayed at once ~30 ms; the rest are
taken in the next loop passes, reading paused meanwhile."""
DISCARDED_AT_MOST = 2**20
"""Bytes read and dropped of a peer failed for flooding (``fail_discarding``) while it
has not closed: enough for the frames in flight when an honest client reads the close."""
PING_BURST = 100
"""Pings (and unsolicited pongs) a peer may send at once; then ``PINGS_PER_SECOND``."""
PINGS_PER_SECOND = 10.0
"""Sustained pings a peer may send: a keepalive pings every few seconds or minutes."""

_POLICY_VIOLATION = 1008
_PING_FLOOD = (
    f"more than {PING_BURST} pings at once or {PINGS_PER_SECOND:g} a second, each owing "
    "a pong: ping less often, and read the pongs"
)
_PING = 0x9
_PONG = 0xA

# First byte of a final, unfragmented text / binary frame with no RSV bit.
_TEXT = 0x81
_BINARY = 0x82
_AT_EOF = StreamReader.at_eof.__code__


def at_frame_boundary(protocol: Protocol) -> bool:
    """websockets' parser is waiting for the first byte of a frame, with nothing buffered."""
    if protocol.reader.buffer:
        return False
    gen = protocol.parser
    while (inner := getattr(gen, "gi_yieldfrom", None)) is not None:
        gen = inner
    return getattr(gen, "gi_code", None) is _AT_EOF


class FastReader(Connection):
    """Mixed into a websockets connection class: reads its peer's plain data frames (see the module)."""

    _fast = False
    _rest: bytearray | None = None  # the start of a frame not yet whole
    _rest_at = 0  # where in ``_rest`` its frames start (the frames before it were taken)
    _gathering: Gathering | None = None  # that frame, when it is unmasked as it comes
    _need = 0  # bytes ``_rest`` must hold before it is worth parsing again
    _share: BudgetShare | None = None  # its part of the node's budget (``share_budget``)
    _pass_reads: PassReads  # a burst's bytes read in this loop pass
    _parse_later = False  # frames left of a read over ``FRAMES_PER_CALL``: reading paused
    _discard_left: int | None = None  # bytes still read and dropped (``fail_discarding``)
    _ping_tokens = float(PING_BURST)
    _ping_time = 0.0
    frames_read_fast = 0
    """Data frames this class read itself (the rest went through websockets)."""

    recv_messages: MessageQueue  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.recv_messages = MessageQueue(
            asyncio.get_running_loop(),
            self.max_queue_high,
            self.max_queue_low,
            self.transport.pause_reading,
            self._queue_resumes,
            self.fail_connection,
        )
        self._ping_time = self.loop.time()
        self._pass_reads = PassReads(self)
        # On the instance, not only the class: a class attribute read through an instance
        # is not specialised by the interpreter, and ``data_received`` reads it per frame.
        self._rest = None

    def share_budget(self, budget: FrameBudget) -> None:
        """Count this connection's large frames against the node's ``budget``."""
        self._share = BudgetShare(budget, self)
        self.recv_messages.budget = budget

    def _queue_resumes(self) -> None:
        share = self._share
        if self._parse_later:
            return  # its frames still to parse resume the reading
        if share is None:
            self.transport.resume_reading()
        elif not share.blocked:
            share.resumed()
            self.transport.resume_reading()

    def gathered(self) -> int | None:
        """Bytes arrived of the large frame being gathered (None: none is)."""
        rest = self._rest
        return len(rest) if rest is not None and self._gathering is not None else None

    def may_read(self) -> bool:
        """Nothing but a loop pass's share holds its reading back."""
        share = self._share
        return (
            not self.recv_messages.paused
            and not self._parse_later
            and (self._discard_left is None or self._discard_left > 0)
            and (share is None or not share.blocked)
            and not self.transport.is_closing()
        )

    @property
    def queue_paused(self) -> bool:
        """Reading stopped for the messages not yet read."""
        return self.recv_messages.paused

    def _leave_fast_path(self) -> None:
        """Nothing more is read here (failed, closing, or websockets parses from now on):
        what was kept of a frame is dropped, a frame unmasked as it came never handed
        over, and its bytes of the budget go back."""
        self._fast = False
        self._rest = None
        self._gathering = None
        self._release()

    def _release(self) -> None:
        """The frame being gathered is dropped: its bytes of the budget go back."""
        if self._share is not None:
            self._share.release()

    def connection_lost(self, exc: Exception | None) -> None:
        self._gathering = None
        self._release()
        super().connection_lost(exc)

    def fail_connection(self, code: int, reason: str) -> None:
        """Fail the connection (RFC 6455 §7.1.7) from a read callback: the close frame
        is written now and nothing more is read."""
        self._leave_fast_path()
        self.recv_messages.failing = True
        protocol = self.protocol
        if protocol.state is not State.OPEN:
            return
        _set_connection_exc(self, ProtocolError(reason))
        protocol.fail(code, reason)
        try:
            self.send_data()
        except Exception as exc:  # pragma: no cover - the socket broke under the write
            _set_connection_exc(self, exc)
        # Nothing more is read (RFC 6455 §7.1.7): the close frame is flushed, then the
        # socket closed; a peer that never reads it is cut off after ``close_timeout``.
        self.transport.close()
        timeout = self.close_timeout if self.close_timeout is not None else 10.0
        self.loop.call_later(timeout, self._cut_off)

    def fail_discarding(self, code: int, reason: str) -> None:
        """Fail the connection of a peer that floods it: the close frame and the end of
        the stream are written now, messages not read yet are dropped, and what the peer
        sends on is discarded a read at a time, unparsed, until it closes (its EOF ends the
        connection) or ``DISCARDED_AT_MOST`` bytes were dropped (then nothing more is read:
        the caller aborts it after a while).

        Closed with a handshake, a flooding client went on being parsed frame by frame
        until it answered: 2-byte frames at full speed held the loop 50-80 ms a read for
        the 2 s the node waited. Closing the socket at once may reset it before the peer
        reads why (unread data turns the FIN into a RST)."""
        self._leave_fast_path()
        queue = self.recv_messages
        queue.take_ready()  # dropped; a queue that paused reading resumes it
        queue.failing = True
        protocol = self.protocol
        if protocol.state is not State.OPEN:
            return
        self._discard_left = DISCARDED_AT_MOST
        protocol.fail(code, reason)  # its parser now discards until the peer's EOF
        try:
            self.send_data()
        except Exception as exc:  # pragma: no cover - the socket broke under the write
            _set_connection_exc(self, exc)
        if not self.transport.is_closing():
            self.transport.resume_reading()  # whatever else held it: nothing is kept now

    def _cut_off(self) -> None:
        if not self.connection_lost_waiter.done():
            self.transport.abort()

    def process_event(self, event: Any) -> None:
        """Frames websockets parsed (the slow path): pings and pongs are held to the
        same bucket as on the fast path. The fast path starts only at a frame
        boundary, and a peer whose writes never end on one (131-byte pings in
        64 KiB writes, read in 256 KiB chunks under load) kept every ping on this
        path, unlimited: the node answered 20 MiB of pings with 20 MiB of pongs
        nobody read. A chunk's pongs are written before its frames come here, so
        at most one read's worth (a few hundred) escape the limit."""
        if (
            isinstance(event, Frame)
            and event.opcode in (Opcode.PING, Opcode.PONG)
            and not self._ping_allowed()
        ):
            self.fail_connection(
                _POLICY_VIOLATION,
                _PING_FLOOD,
            )
            return
        super().process_event(event)

    def _ping_allowed(self) -> bool:
        """A token of the ping bucket (``PING_BURST``, ``PINGS_PER_SECOND``)."""
        now = self.loop.time()
        tokens = min(PING_BURST, self._ping_tokens + (now - self._ping_time) * PINGS_PER_SECOND)
        self._ping_time = now
        if tokens < 1.0:
            self._ping_tokens = tokens
            return False
        self._ping_tokens = tokens - 1.0
        return True

    def data_received(self, data: bytes) -> None:
        if not self._fast:
            if self._discard_left is not None:
                self._discard_left -= len(data)
                if self._discard_left <= 0:  # it is not closing: read no more of it
                    self.transport.pause_reading()
            protocol = self.protocol
            if not self._may_start(protocol):
                super().data_received(data)
                if self._may_start(protocol):
                    self._fast = True
                return
            # The handshake ended with the last read: this one starts with a frame. Given
            # to websockets, a client's first frame, a recording sent whole, was parsed by
            # it, and every later read until one ended on a frame's end.
            self._fast = True
        if len(data) >= BURST_READ:  # a burst: its share of this loop pass is bounded
            self._pass_reads.read(len(data))
        buf: bytes | bytearray = data
        rest = self._rest
        unmasked = False  # the gathered frame at buf[0] was unmasked as it came
        pos = 0
        if rest is not None:
            rest += data  # amortised: a large frame is gathered in linear time
            if self._gathering is not None:
                unmask_arrived(rest, self._gathering)
            if len(rest) < self._need:
                return
            self._rest = None
            pos = self._rest_at  # what is before it was taken (``FRAMES_PER_CALL``)
            self._rest_at = 0
            unmasked = self._gathering is not None
            self._gathering = None
            buf = rest
        protocol = self.protocol
        masked = protocol.side is SERVER  # a client masks every frame; a server never does
        mask_bit = 0x80 if masked else 0
        key = 4 if masked else 0  # the masking key's bytes after the length
        limit = protocol.max_message_size
        queue = self.recv_messages
        end_of_data = len(buf)
        need = 2
        gathering: Gathering | None = None
        taken = 0  # data frames: ``FRAMES_PER_CALL`` at most
        while end_of_data - pos >= 2:
            first = buf[pos]
            second = buf[pos + 1]
            if second & 0x80 != mask_bit:
                self._slow(buf[pos:])  # websockets refuses it (1002), as before
                return
            length = second & 0x7F
            head = 2
            if length == 126:
                if end_of_data - pos < 4:
                    need = 4
                    break
                length = buf[pos + 2] << 8 | buf[pos + 3]  # no slice: a voice frame's case
                head = 4
            elif length == 127:
                if end_of_data - pos < 10:
                    need = 10
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10])
                head = 10
            if limit is not None and length > limit:
                self._slow(buf[pos:])  # websockets closes with 1009, as before
                return
            start = pos + head + key
            end = start + length
            if end > end_of_data:
                need = end - pos
                if (
                    masked
                    and length >= UNMASK_AS_IT_COMES
                    and first in (_TEXT, _BINARY)
                    and protocol.current_size is None
                ):
                    gathering = Gathering(start - pos, end - pos, bytes(buf[start - 4 : start]))
                break
            if first in (_TEXT, _BINARY) and protocol.current_size is None:
                held = 0  # bytes of the node's budget the message holds until it is read
                if unmasked and pos == 0:  # done piece by piece as it came
                    with memoryview(buf) as view:
                        payload = bytes(view[start:end])
                    held = self._share.hand_over() if self._share is not None else 0
                elif masked:  # the C unmasking gives bytes, from bytes or a bytearray
                    payload = apply_mask(buf[start:end], buf[start - 4 : start])
                elif buf is data:
                    payload = data[start:end]
                else:  # a gathered frame: one copy out of the bytearray
                    with memoryview(buf) as view:
                        payload = bytes(view[start:end])
                queue.put_message(payload, first == _TEXT, held)
                self.frames_read_fast += 1
                if not self._fast:  # the message failed the connection
                    return
                taken += 1
                if taken >= FRAMES_PER_CALL and end < end_of_data:
                    self._parse_in_next_pass(buf, end)
                    return
            else:
                if first & 0x0F in (_PING, _PONG) and not self._ping_allowed():
                    self.fail_connection(
                        _POLICY_VIOLATION,
                        _PING_FLOOD,
                    )
                    return
                super().data_received(bytes(buf[pos:end]))  # one frame: a boundary after it
                if protocol.state is not State.OPEN or not self._fast:
                    self._slow(buf[end:])
                    return
            pos = end
        else:
            need = 2
        if pos < end_of_data:
            tail = buf[pos:]
            self._rest = tail if isinstance(tail, bytearray) else bytearray(tail)
            self._rest_at = 0
            self._need = need
            if gathering is not None:
                self._gathering = gathering
                unmask_arrived(self._rest, gathering)
                if self._share is not None and gathering.end - gathering.start >= BUDGETED:
                    self._share.take(gathering.end - gathering.start)

    def _parse_in_next_pass(self, buf: bytes | bytearray, at: int) -> None:
        """Keep ``buf`` from ``at`` (whole frames, maybe a partial one) for the next loop
        pass, and read nothing more until it is parsed."""
        if isinstance(buf, bytearray):  # kept, not copied: one read may take many passes
            self._rest, self._rest_at = buf, at
        else:
            with memoryview(buf) as view:
                self._rest = bytearray(view[at:])
            self._rest_at = 0
        self._need = 0
        if not self._parse_later:
            self._parse_later = True
            self.transport.pause_reading()
        self.loop.call_soon(self._parse_rest)

    def _parse_rest(self) -> None:
        self._parse_later = False
        if self._fast and self._rest is not None:
            self.data_received(b"")  # may keep a rest for the pass after again
        if not self._parse_later and self.may_read():
            self.transport.resume_reading()

    @staticmethod
    def _may_start(protocol: Protocol) -> bool:
        """Open, no extension, and websockets' parser waits for a frame's first byte."""
        return (
            protocol.state is State.OPEN and not protocol.extensions and at_frame_boundary(protocol)
        )

    def _slow(self, data: bytes | bytearray) -> None:
        """From here on websockets parses everything (closing, or a frame it must refuse)."""
        self._leave_fast_path()
        if data:
            super().data_received(bytes(data))


def _set_connection_exc(connection: Any, exc: BaseException) -> None:
    """Record why the connection failed, so ``recv()`` raises from it: websockets 17
    calls this ``set_connection_exc``, 16 ``set_recv_exc`` (the lock holds 16.1.1,
    the gateway's range allows 17; tests/wsfast/test_canary.py checks one exists)."""
    setter = getattr(connection, "set_connection_exc", None) or connection.set_recv_exc
    setter(exc)
