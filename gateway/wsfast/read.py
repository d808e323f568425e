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

**Messages queue.** What ``recv()`` reads is a ``MessageQueue`` in place of
websockets' ``Assembler``: the fast path appends a whole message (no
``Frame`` object), and ``recv()`` returns a queued message without awaiting.
The ``Assembler`` took a frame through three coroutine layers and a future
per message (``Assembler.get`` → ``SimpleQueue.get``, then ``maybe_resume``
and a join): about 9% of the node's CPU at 50 streaming sessions, measured
with py-spy (docs/performance.md). The queue keeps what the ``Assembler``
gave: fragmented messages (from websockets' parser) are joined in order,
reading pauses above ``max_queue`` messages (or ``QUEUED_BYTES_HIGH`` bytes)
and resumes below the low marks, messages queued before the close are still
returned, then ``recv()`` raises ``ConnectionClosed`` as before, and two
concurrent ``recv()`` calls are refused. Large frames: ``gateway.wsfast.large``.

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
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from websockets.asyncio.connection import Connection
from websockets.exceptions import ConcurrencyError, ProtocolError
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

try:  # websockets' C unmasking, as its own parser uses
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build without the C extension
    from websockets.utils import apply_mask

__all__ = [
    "MAX_FRAGMENTS",
    "PINGS_PER_SECOND",
    "PING_BURST",
    "QUEUED_BYTES_HIGH",
    "FastReader",
    "MessageQueue",
    "at_frame_boundary",
]

MAX_FRAGMENTS = 4096
"""Frames one message may come in (websockets' ``Assembler`` refuses past 4,096 too)."""
QUEUED_BYTES_HIGH = 4 * 2**20
"""Reading pauses while the messages not yet read hold more than this many bytes, as
well as above ``max_queue`` messages: 16 queued messages of an OpenAI-door client
may be 16 appends of 20 MiB each."""
PING_BURST = 100
"""Pings (and unsolicited pongs) a peer may send at once; then ``PINGS_PER_SECOND``."""
PINGS_PER_SECOND = 10.0
"""Sustained pings a peer may send: a keepalive pings every few seconds or minutes."""

Fail = Callable[[int, str], None]
"""``(close code, reason)``: fail the connection (RFC 6455 §7.1.7)."""

_MESSAGE_TOO_BIG = 1009
_INVALID_DATA = 1007
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


class MessageQueue:
    """Whole messages for ``recv()``, in place of websockets' ``Assembler`` (see the module)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        high: int | None,
        low: int | None,
        pause: Callable[[], Any],
        resume: Callable[[], Any],
        fail: Fail | None = None,
    ) -> None:
        self._loop = loop
        self._fail = fail
        if high is not None and low is None:
            low = high // 4
        self._high = high
        self._low = low or 0
        self._bytes = 0  # of the queued messages: reading also pauses above QUEUED_BYTES_HIGH
        self.budget: FrameBudget | None = None  # what held messages are counted against
        self._in_use = 0  # the budget the message last returned holds, until the next get
        self._pause = pause
        self._resume = resume
        self._paused = False
        # (payload, is_text, budget bytes it holds) of every whole message not yet returned.
        self._messages: deque[tuple[bytes, bool, int]] = deque()
        self._fragments: list[Frame] = []  # a fragmented message being joined
        self._waiter: asyncio.Future[None] | None = None
        self._getting = False
        self._nudged = False
        self.closed = False
        self.failing = False  # the connection was failed: nothing more from it is queued
        self.intercept: Callable[[bytes, bool], bool] | None = None
        """Offered each message that arrives while a reader waits on an empty
        queue; True: it took the message (the reader keeps waiting). See ``nudge``."""

    def put(self, frame: Frame) -> None:
        """A data frame from websockets' parser (``Connection.process_event``)."""
        if self.closed:
            raise EOFError("stream of frames ended")
        if self.failing:
            return
        if frame.fin and not self._fragments:
            self.put_message(bytes(frame.data), frame.opcode is Opcode.TEXT)
            return
        if len(self._fragments) >= MAX_FRAGMENTS:
            self.failed(
                _MESSAGE_TOO_BIG,
                f"a message in more than {MAX_FRAGMENTS} fragments; send it in fewer",
            )
            return
        self._fragments.append(frame)
        if frame.fin:
            frames, self._fragments = self._fragments, []
            data = b"".join(f.data for f in frames)
            self.put_message(data, frames[0].opcode is Opcode.TEXT)

    def put_message(self, data: bytes, text: bool, held: int = 0) -> None:
        """A whole message (the fast path's frames come straight here); a text one that
        is not UTF-8 fails the connection (1007) instead. ``held``: bytes of the
        ``budget`` it holds until it is read."""
        if self.failing:
            self._give(held)
            return
        if text and not data.isascii():
            try:
                data.decode()
            except UnicodeDecodeError as exc:
                self._give(held)
                self.failed(
                    _INVALID_DATA,
                    f"a text message is not UTF-8 ({exc.reason} at byte {exc.start})",
                )
                return
        waiter = self._waiter
        intercept = self.intercept
        if waiter is not None and intercept is not None and intercept(data, text):
            self._give(held)
            return
        messages = self._messages
        messages.append((data, text, held))
        self._bytes += len(data)
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        if not self._paused and (
            self._bytes > QUEUED_BYTES_HIGH
            or (self._high is not None and len(messages) > self._high)
        ):
            self._paused = True
            self._pause()

    async def get(self, decode: bool | None = None) -> Any:
        """The next message: ``str`` for text (unless ``decode`` is False), else ``bytes``."""
        if self._getting:
            raise ConcurrencyError("get() is already running")
        if self._in_use:  # the reader is done with the message it had: its budget goes back
            self._give(self._in_use)
            self._in_use = 0
        messages = self._messages
        if not messages:
            if self.closed:
                raise EOFError("stream of frames ended")
            self._getting = True
            try:
                while not messages:
                    if self.closed:
                        raise EOFError("stream of frames ended")
                    if self._nudged:
                        return None
                    waiter = self._waiter = self._loop.create_future()
                    await waiter
            finally:
                self._getting = False
                self._waiter = None
                self._nudged = False  # a message that came meanwhile wakes the reader as well
        data, text, held = messages.popleft()
        self._bytes -= len(data)
        self._in_use = held  # held while the reader works on it
        if self._paused and len(messages) <= self._low and self._bytes <= QUEUED_BYTES_HIGH // 4:
            self._paused = False
            self._resume()
        if decode is None:
            decode = text
        return data.decode() if decode else data

    @property
    def paused(self) -> bool:
        """Reading is paused for this queue's marks."""
        return self._paused

    def _give(self, held: int) -> None:
        if held and self.budget is not None:
            self.budget.give(held)

    def failed(self, code: int, reason: str) -> None:
        """Fail the connection with ``code`` (nothing more is queued from it)."""
        self.failing = True
        self._fragments = []
        if self._fail is not None:
            self._fail(code, reason)

    def take_ready(self) -> list[bytes]:
        """Every whole message received and not read yet, taken now (no wait): what
        an adapter still reads of a connection it is about to close."""
        taken = [data for data, _, _ in self._messages]
        self._give(self._in_use + sum(held for _, _, held in self._messages))
        self._in_use = 0
        self._messages.clear()
        self._bytes = 0
        if self._paused:
            self._paused = False
            self._resume()
        return taken

    def nudge(self) -> None:
        """Make the waiting ``get()`` return ``None`` (no message): what an
        ``intercept`` that took a message calls when the reader must look at
        its work now. Nothing happens when no reader waits."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._nudged = True
            self._waiter = None
            waiter.set_result(None)

    async def get_iter(self, decode: bool | None = None) -> AsyncIterator[Any]:
        """``recv_streaming()``: the whole message, as one piece."""
        yield await self.get(decode)

    def close(self) -> None:
        """The connection is gone: queued messages are still returned, then EOFError."""
        if self.closed:
            return
        self.closed = True
        # What is still queued may be read, but the node's budget is not held for it.
        self._give(self._in_use + sum(held for _, _, held in self._messages))
        self._in_use = 0
        self._messages = deque((data, text, 0) for data, text, _ in self._messages)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class FastReader(Connection):
    """Mixed into a websockets connection class: reads its peer's plain data frames (see the module)."""

    _fast = False
    _rest: bytearray | None = None  # the start of a frame not yet whole
    _gathering: Gathering | None = None  # that frame, when it is unmasked as it comes
    _need = 0  # bytes ``_rest`` must hold before it is worth parsing again
    _share: BudgetShare | None = None  # its part of the node's budget (``share_budget``)
    _pass_reads: PassReads  # a burst's bytes read in this loop pass
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
            and (share is None or not share.blocked)
            and not self.transport.is_closing()
        )

    @property
    def queue_paused(self) -> bool:
        """Reading stopped for the messages not yet read."""
        return self.recv_messages.paused

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
        self._fast = False
        self._rest = None
        self._gathering = None
        self._release()
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
        if rest is not None:
            rest += data  # amortised: a large frame is gathered in linear time
            if self._gathering is not None:
                unmask_arrived(rest, self._gathering)
            if len(rest) < self._need:
                return
            self._rest = None
            unmasked = self._gathering is not None
            self._gathering = None
            buf = rest
        protocol = self.protocol
        masked = protocol.side is SERVER  # a client masks every frame; a server never does
        mask_bit = 0x80 if masked else 0
        key = 4 if masked else 0  # the masking key's bytes after the length
        limit = protocol.max_message_size
        queue = self.recv_messages
        pos = 0
        end_of_data = len(buf)
        need = 2
        gathering: Gathering | None = None
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
            self._need = need
            if gathering is not None:
                self._gathering = gathering
                unmask_arrived(self._rest, gathering)
                if self._share is not None and gathering.end - gathering.start >= BUDGETED:
                    self._share.take(gathering.end - gathering.start)

    @staticmethod
    def _may_start(protocol: Protocol) -> bool:
        """Open, no extension, and websockets' parser waits for a frame's first byte."""
        return (
            protocol.state is State.OPEN and not protocol.extensions and at_frame_boundary(protocol)
        )

    def _slow(self, data: bytes | bytearray) -> None:
        """From here on websockets parses everything (closing, or a frame it must refuse)."""
        self._fast = False
        self._rest = None
        self._gathering = None  # a frame unmasked as it came is never handed over (see there)
        self._release()
        if data:
            super().data_received(bytes(data))


def _set_connection_exc(connection: Any, exc: BaseException) -> None:
    """Record why the connection failed, so ``recv()`` raises from it: websockets 17
    calls this ``set_connection_exc``, 16 ``set_recv_exc`` (the lock holds 16.1.1,
    the gateway's range allows 17; tests/wsfast/test_canary.py checks one exists)."""
    setter = getattr(connection, "set_connection_exc", None) or connection.set_recv_exc
    setter(exc)
