"""The messages ``recv()`` reads: ``MessageQueue``, in place of websockets' ``Assembler``.

The fast path (``gateway.wsfast.read``) appends a whole message (no
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

A message is at most ``MAX_FRAGMENTS`` frames (1009 past it), and a text message
must be UTF-8 (1007 otherwise): ``gateway.wsfast.read`` says why.

Internals used: websockets' ``Frame`` and ``Opcode`` (the slow path's frames), and
``ConcurrencyError``, as its ``Assembler`` raises it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from websockets.exceptions import ConcurrencyError
from websockets.frames import Frame, Opcode

from gateway.wsfast.large import FrameBudget

__all__ = ["MAX_FRAGMENTS", "QUEUED_BYTES_HIGH", "Fail", "MessageQueue"]

MAX_FRAGMENTS = 4096
"""Frames one message may come in (websockets' ``Assembler`` refuses past 4,096 too)."""
QUEUED_BYTES_HIGH = 4 * 2**20
"""Reading pauses while the messages not yet read hold more than this many bytes, as
well as above ``max_queue`` messages: 16 queued messages of an OpenAI-door client
may be 16 appends of 20 MiB each."""

Fail = Callable[[int, str], None]
"""``(close code, reason)``: fail the connection (RFC 6455 §7.1.7)."""

_MESSAGE_TOO_BIG = 1009
_INVALID_DATA = 1007


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
