"""One connection's share of the node's budget for large frames (``BudgetShare``),
driven by a reader stand-in on a clock the test moves: who counts as waiting, and
which window of a frame's arrival is judged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.wsfast.large import BudgetShare, FrameBudget

MIN_RATE = 1 << 20  # bytes a second
PATIENCE = 1.0  # seconds a window


class _Handle:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _Clock:
    """``time`` and ``call_later`` of a loop whose time the test moves (``advance``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(self.now + delay, callback)
        self.timers.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while due := sorted(
            (h for h in self.timers if not h.cancelled and h.when <= end), key=lambda h: h.when
        ):
            handle = due[0]
            self.timers.remove(handle)
            self.now = handle.when
            handle.callback()
        self.now = end


class _Transport:
    def __init__(self) -> None:
        self.reading, self.closing = True, False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing


class _Reader:
    """A connection gathering a large frame: ``arrived`` bytes of it so far."""

    def __init__(self, clock: _Clock) -> None:
        self.loop: Any = clock
        self.transport: Any = _Transport()
        self.queue_paused = False
        self.arrived: int | None = 0
        self.failed: tuple[int, str] | None = None

    def gathered(self) -> int | None:
        return self.arrived

    def may_read(self) -> bool:  # as FastReader's: the share asks it once it is not blocked
        return not self.queue_paused and not self.transport.closing

    def fail_connection(self, code: int, reason: str) -> None:
        self.failed = (code, reason)


def _budget() -> FrameBudget:
    return FrameBudget(2 << 20, min_rate=MIN_RATE, patience=PATIENCE)


def test_a_frame_that_stalls_while_another_waits_is_cut_and_only_then() -> None:
    clock = _Clock()
    budget = _budget()
    slow = _Reader(clock)
    BudgetShare(budget, slow).take(2 << 20)
    clock.advance(3 * PATIENCE)  # no one waits: a slow uplink is let be
    assert slow.failed is None
    BudgetShare(budget, _Reader(clock)).take(2 << 20)  # now someone does
    clock.advance(PATIENCE)
    assert slow.failed is not None
    assert slow.failed[0] == 1008 and "send it faster" in slow.failed[1]


def test_a_waiter_that_went_away_keeps_no_one_out() -> None:
    """A blocked connection that closes leaves the waiters: a slow frame is then let
    be, as on a quiet node, not cut for a client no longer there."""
    clock = _Clock()
    budget = _budget()
    slow, gone = _Reader(clock), _Reader(clock)
    BudgetShare(budget, slow).take(2 << 20)
    waiting = BudgetShare(budget, gone)
    waiting.take(2 << 20)
    assert budget.waiting == 1 and not gone.transport.reading
    gone.arrived, gone.transport.closing = None, True
    waiting.release()  # its connection was lost
    assert budget.waiting == 0
    clock.advance(3 * PATIENCE)
    assert slow.failed is None


def test_a_window_the_node_kept_the_connection_unread_is_not_judged() -> None:
    """Reading paused for the connection's unread messages most of a window, resumed
    just before its end: the window starts at the resume, so a sender that sends at
    once when read again is not cut; one that then stalls is."""
    clock = _Clock()
    budget = _budget()
    reader = _Reader(clock)
    share = BudgetShare(budget, reader)
    share.take(2 << 20)
    BudgetShare(budget, _Reader(clock)).take(2 << 20)  # someone waits for room
    reader.queue_paused = True
    clock.advance(0.9 * PATIENCE)
    reader.queue_paused = False
    share.resumed()
    reader.arrived = MIN_RATE // 5  # 0.2 s worth, in the 0.1 s left of the window
    clock.advance(0.1 * PATIENCE)
    assert reader.failed is None
    clock.advance(PATIENCE)  # nothing more came
    assert reader.failed is not None
