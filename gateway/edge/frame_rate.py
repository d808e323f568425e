"""A per-connection limit on client frames: one client must not take a core.

Measured before this limit: one client sending ~11,000 frames/s kept a core
busy, and the node worked through that client's backlog for 12-15 s after it
had gone. A human-driven or scripted client sends a few frames a second (a
message, a cancel, a keepalive ping), so a token bucket of
``client_frames_per_second`` sustained with bursts of ``client_frame_burst``
never touches an honest client and bounds what a flooding one costs: a frame
over the limit is counted and dropped unread, and a client that keeps going
is closed (``CloseCode.RATE_LIMITED``).

Pure: the caller passes the clock reading, so the tests need no sockets.
"""

from __future__ import annotations

import enum

from gateway.edge.closes import CloseCode

__all__ = ["FRAME_UNIT", "FrameRate", "Verdict", "over_limit", "weight"]

FRAME_UNIT = 64 * 1024
"""Bytes of a frame that count as one frame more: decoding a frame costs by its size
(a 1 MiB event of 30,000 parts ~35 ms), and 50 of them a second, each one frame, held
a core; now a connection sends ~3 such frames a second, or 3 MiB/s of text."""


def weight(size: int) -> int:
    """How many frames a frame of ``size`` bytes counts as: one, and one per ``FRAME_UNIT``."""
    return 1 + size // FRAME_UNIT


class Verdict(enum.Enum):
    """What to do with one client frame."""

    ACCEPT = "accept"  # handle it
    REFUSE = "refuse"  # drop it and tell the client (first frame over the limit)
    DROP = "drop"  # drop it silently (the client has been told)
    CLOSE = "close"  # the client keeps flooding: close the connection


class FrameRate:
    """A token bucket: ``rate`` frames/s sustained, ``burst`` at once.

    After ``burst`` frames refused since the client last slowed down (its bucket
    half full again) the verdict is ``CLOSE``.
    ``rate`` 0 turns the limit off.
    """

    __slots__ = ("_last", "_tokens", "burst", "rate", "refusals", "refused")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._last = now
        self.refused = 0  # frames refused since the client last slowed down
        self.refusals = 0  # times a frame was refused after one was accepted (``REFUSE``)

    def check(self, now: float, cost: int = 1) -> Verdict:
        """The verdict on a frame received at ``now`` (seconds, monotonic) that counts
        as ``cost`` frames (``weight``)."""
        if self.rate <= 0:
            return Verdict.ACCEPT
        tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if tokens >= cost:
            self._tokens = tokens - cost
            if tokens * 2 >= self.burst:
                # Slowed down to well under the rate: the count starts over. Reset by
                # any frame let through, a client at twice the rate was never closed
                # (nor one at 140 times it, under a rate of 500).
                self.refused = 0
            return Verdict.ACCEPT
        self._tokens = tokens
        self.refused += 1
        if self.refused == 1:
            self.refusals += 1
            return Verdict.REFUSE
        if self.refused >= self.burst:
            return Verdict.CLOSE
        return Verdict.DROP

    def wait(self) -> float:
        """Seconds until the next frame would be accepted."""
        if self.rate <= 0:
            return 0.0
        return max(0.0, (1.0 - self._tokens) / self.rate)


def over_limit(what: str, rate: FrameRate, advice: str = "slow down", *, sized: bool = True) -> str:
    """The error of the first frame over ``rate``: a connection's frames (``sized``: each
    counted by its ``weight``), its audio, a door's events. One wording for every door:
    three had drifted apart."""
    per = f"; one more per {FRAME_UNIT // 1024} KiB a frame holds" if sized else ""
    return (
        f"too many {what}: at most {rate.rate:g} a second (bursts of {rate.burst}{per}); "
        f"those over it are dropped unread: wait {rate.wait():.1f} s and {advice}; a client "
        f"that keeps on is disconnected ({CloseCode.RATE_LIMITED})"
    )
