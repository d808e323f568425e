"""Large frames from clients: unmasked as they arrive, and counted against one
node-wide allowance.

**Unmasking.** A frame of ``UNMASK_AS_IT_COMES`` bytes or more is unmasked in
place, each read's share as it arrives (``unmask_arrived``): a 20 MiB append
unmasked whole once complete held the loop ~25 ms in one C call, with its copy.

**A pass's share.** libuv reads a ready socket until it runs dry (up to 32 reads a
pass), so a connection that sends a burst (a large frame, or a provider's thousands of
frames at once) has its reading paused for the rest of a loop pass after one large
read (``PassReads``, ``READ_PER_PASS``): no pass copies, unmasks or parses megabytes
of one peer's while the node's other clients wait.

**The budget.** A connection's own limits bound what one client makes the node hold: a frame
of at most its ``max_size``, gathered, and reading paused above
``QUEUED_BYTES_HIGH`` of unread messages. An OpenAI-door client may send
appends of 20 MiB, and one holds ~80 MB while two of them are read: ten clients
at once grew a node from 112 to 927 MB, a hundred would take 8 GB. A
``FrameBudget`` is shared by the connections given it (``FastReader.share_budget``):
a large frame is gathered only once the budget has room for it, else its
connection stops being read until a held frame is done with (its reader asked
for the next message: it worked on the last one until then), and the bytes
come to the node in turn. A frame larger than the whole budget is taken
when nothing else is held, so every frame is read in the end.

**Slow senders.** A frame holds its share from its first bytes to its last: a
client that trickled a 20 MiB frame held 21 MiB for as long as it liked, and
eight of them left every other client's large append unread. So while others
wait for room, a frame that comes slower than ``MIN_RATE`` over a window of
``PATIENCE`` seconds (not one in which the node itself stopped reading the
connection) fails its connection (1008, saying why). With no one waiting, a
slow uplink is let be: it keeps nobody out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Protocol

try:  # websockets' C unmasking, as its own parser uses
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build without the C extension
    from websockets.utils import apply_mask

__all__ = [
    "BUDGETED",
    "BURST_READ",
    "MIN_RATE",
    "PATIENCE",
    "READ_PER_PASS",
    "UNMASK_AS_IT_COMES",
    "BudgetShare",
    "FrameBudget",
    "Gathering",
    "PassReads",
    "unmask_arrived",
]

UNMASK_AS_IT_COMES = 256 * 1024
"""A masked data frame at least this large is unmasked piece by piece as it arrives."""

BUDGETED = 1 << 20
"""A masked data frame at least this large is counted against the budget."""

MIN_RATE = 256 * 1024
"""Bytes a second a budgeted frame must come at while other connections wait for
room: 2 Mbit/s, a slow mobile uplink's; a 20 MiB append then takes 80 s at most."""

PATIENCE = 5.0
"""Seconds of a budgeted frame's arrival in each window its rate is judged over."""

_POLICY_VIOLATION = 1008
_TOO_SLOW = "large frame under {rate:g} KiB/s while others wait: send it faster or under 1 MiB"


class FrameBudget:
    """Bytes of large frames held at once (gathered or read and not yet taken)."""

    __slots__ = ("_waiting", "capacity", "held", "min_rate", "patience")

    def __init__(
        self, capacity: int, *, min_rate: float = MIN_RATE, patience: float = PATIENCE
    ) -> None:
        self.capacity = capacity
        self.held = 0
        self.min_rate = min_rate
        self.patience = patience
        self._waiting: deque[Callable[[], bool]] = deque()

    def take(self, size: int) -> bool:
        """Hold ``size`` bytes if there is room (or nothing is held); False otherwise."""
        if self.held and self.held + size > self.capacity:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        """``size`` bytes are no longer held: the connections waiting try again, in
        the order they came, until one finds no room."""
        self.held -= size
        waiting = self._waiting
        while waiting and waiting[0]():
            waiting.popleft()

    def wait(self, retry: Callable[[], bool]) -> None:
        """Call ``retry`` when bytes are given back; it returns False to keep waiting
        (no room yet), True once it took its bytes or no longer needs them."""
        self._waiting.append(retry)

    def cancel(self, retry: Callable[[], bool]) -> None:
        """``retry``'s connection no longer waits (it went away): it keeps no one out."""
        with contextlib.suppress(ValueError):
            self._waiting.remove(retry)

    @property
    def waiting(self) -> int:
        """Connections whose reading waits for room."""
        return len(self._waiting)

    def too_slow(self, arrived: int, seconds: float) -> bool:
        """A held frame of which ``arrived`` bytes came in ``seconds`` keeps others out
        too long: they wait, and it comes slower than ``min_rate``."""
        return bool(self._waiting) and arrived < self.min_rate * seconds


READ_PER_PASS = 1 << 17
"""Bytes read from one connection in a loop pass before its reading stops until the
next: in effect one read (uvloop's are up to 256 KB). libuv reads a ready socket up
to 32 times a pass: eight clients' 20 MiB appends at once had megabytes each copied
and unmasked in one pass (/healthz 150-250 ms), and a provider that wrote 100,000
text deltas at once had them all turned into events in one (375 ms)."""

BURST_READ = 1 << 16
"""A read this large is counted against ``READ_PER_PASS``: a burst. Smaller ones (a
voice frame, a few deltas) are not, so the common read pays no bookkeeping; a pass
of them is bounded by the socket's buffer."""


class SharingReader(Protocol):
    """What a ``BudgetShare`` needs of its connection's reader (``FastReader``)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def transport(self) -> asyncio.Transport: ...
    @property
    def queue_paused(self) -> bool: ...
    def gathered(self) -> int | None: ...
    def fail_connection(self, code: int, reason: str) -> None: ...
    def may_read(self) -> bool: ...


class BudgetShare:
    """One connection's part of a ``FrameBudget``: the bytes its frame being gathered
    holds, its reading stopped while it waits for room, and that frame's pace
    watched while others wait (``FrameBudget.too_slow``)."""

    __slots__ = ("_pace", "_pace_from", "_reader", "_retry_take", "budget", "held")

    def __init__(self, budget: FrameBudget, reader: SharingReader) -> None:
        self.budget = budget
        self.held = 0  # bytes the frame being gathered holds
        self._reader = reader
        self._pace: asyncio.TimerHandle | None = None  # the next look at the frame's rate
        self._pace_from = (0.0, 0)  # since when its rate is measured, and its bytes then
        self._retry_take: Callable[[], bool] | None = None  # its place among the waiting

    @property
    def blocked(self) -> bool:
        """Reading waits for room (the connection is among the budget's waiting)."""
        return self._retry_take is not None

    def take(self, size: int) -> None:
        """The frame being gathered needs ``size`` bytes: hold them, or stop reading
        until another connection's reader gives some back."""
        if self.budget.take(size):
            self._holding(size)
            return
        self._reader.transport.pause_reading()
        self._retry_take = lambda: self._retry(size)
        self.budget.wait(self._retry_take)

    def _retry(self, size: int) -> bool:
        reader = self._reader
        if reader.gathered() is None or reader.transport.is_closing():
            self._retry_take = None
            return True  # gone, or failed: nothing to hold
        if not self.budget.take(size):
            return False
        self._holding(size)
        self._retry_take = None
        if reader.may_read():  # not held for its unread messages (nor, now, the budget)
            reader.transport.resume_reading()
        return True

    def _holding(self, size: int) -> None:
        self.held = size
        self._stop_pace()
        loop = self._reader.loop
        self._pace_from = (loop.time(), self._reader.gathered() or 0)
        self._pace = loop.call_later(self.budget.patience, self._check_pace)

    def _check_pace(self) -> None:
        self._pace = None
        reader, budget = self._reader, self.budget
        arrived = reader.gathered()
        if not self.held or arrived is None:
            return  # whole, or dropped
        now = reader.loop.time()
        since, arrived_then = self._pace_from
        # Judged window by window: a frame sent fast at first, then stalled, would
        # otherwise keep its early average for minutes. Not while the node itself
        # stopped reading it (its unread messages): that is not the sender's pace.
        if not reader.queue_paused and budget.too_slow(arrived - arrived_then, now - since):
            reader.fail_connection(_POLICY_VIOLATION, _TOO_SLOW.format(rate=budget.min_rate / 1024))
            return
        self._pace_from = (now, arrived)
        self._pace = reader.loop.call_later(budget.patience, self._check_pace)

    def _stop_pace(self) -> None:
        if self._pace is not None:
            self._pace.cancel()
            self._pace = None

    def hand_over(self) -> int:
        """The frame is whole and handed to the queue, with the bytes it holds."""
        self._stop_pace()
        held, self.held = self.held, 0
        return held

    def resumed(self) -> None:
        """The node reads the connection again (its unread messages were read): the pace
        is measured from now, not over a window the node itself kept it waiting."""
        arrived = self._reader.gathered()
        if self._pace is not None and arrived is not None:
            self._pace_from = (self._reader.loop.time(), arrived)

    def release(self) -> None:
        """The frame being gathered is dropped (or its connection gone): its bytes go
        back, and a connection that waited for room waits no more."""
        if self._retry_take is not None:
            self.budget.cancel(self._retry_take)
            self._retry_take = None
        held = self.hand_over()
        if held:
            self.budget.give(held)


class Gathering:
    """A large masked data frame being gathered in ``FastReader._rest``: where its
    payload lies in it, its masking key, and how much of it is unmasked already."""

    __slots__ = ("done", "end", "key", "start")

    def __init__(self, start: int, end: int, key: bytes) -> None:
        self.start = start
        self.end = end
        self.key = key
        self.done = 0


def unmask_arrived(rest: bytearray, gathering: Gathering) -> None:
    """Unmask, in place, the part of the frame's payload that arrived since the last read."""
    start = gathering.start + gathering.done
    stop = min(len(rest), gathering.end)
    if stop <= start:
        return
    phase = gathering.done % 4  # the masking key runs on from the payload's first byte
    key = gathering.key[phase:] + gathering.key[:phase]
    with memoryview(rest) as view:
        clear = apply_mask(view[start:stop], key)
    rest[start:stop] = clear
    gathering.done = stop - gathering.start


class PassReads:
    """A connection's burst reads in the current loop pass: past ``READ_PER_PASS`` its
    reading stops until the next pass, so a pass takes a bounded share of each peer's
    burst, however many send one at once."""

    __slots__ = ("_paused", "_read", "_reader")

    def __init__(self, reader: SharingReader) -> None:
        self._reader = reader
        self._read = 0  # bytes read in this pass
        self._paused = False  # reading stopped for the pass (not for another reason)

    def read(self, size: int) -> None:
        """``size`` bytes came in this pass."""
        if not self._read:
            self._reader.loop.call_soon(self._next_pass)
        self._read += size
        if self._read >= READ_PER_PASS and not self._paused:
            self._paused = True
            self._reader.transport.pause_reading()

    def _next_pass(self) -> None:
        self._read = 0
        if self._paused:
            self._paused = False
            if self._reader.may_read():  # not held for its unread messages or the budget
                self._reader.transport.resume_reading()
