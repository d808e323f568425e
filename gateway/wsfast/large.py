"""Large frames from clients: unmasked as they arrive, and counted against one
node-wide allowance.

**Unmasking.** A frame of ``UNMASK_AS_IT_COMES`` bytes or more is unmasked in
place, each read's share as it arrives (``unmask_arrived``): a 20 MiB append
unmasked whole once complete held the loop ~25 ms in one C call, with its copy.

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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

try:  # websockets' C unmasking, as its own parser uses
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build without the C extension
    from websockets.utils import apply_mask

__all__ = ["BUDGETED", "UNMASK_AS_IT_COMES", "FrameBudget", "Gathering", "unmask_arrived"]

UNMASK_AS_IT_COMES = 256 * 1024
"""A masked data frame at least this large is unmasked piece by piece as it arrives."""

BUDGETED = 1 << 20
"""A masked data frame at least this large is counted against the budget."""


class FrameBudget:
    """Bytes of large frames held at once (gathered or read and not yet taken)."""

    __slots__ = ("_waiting", "capacity", "held")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
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

    @property
    def waiting(self) -> int:
        """Connections whose reading waits for room."""
        return len(self._waiting)


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
