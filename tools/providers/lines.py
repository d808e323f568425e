"""Newline-delimited JSON-RPC from an MCP server, in lines of bounded length.

A pure core (no I/O) for ``tools.providers.mcp_stdio``: ``LineFramer`` is fed
the child's stdout as it arrives and returns whole lines of at most
``max_line`` bytes. A longer line is never held: the framer keeps its first
and last few hundred bytes, reports ``Overlong`` once it passes the limit and
``OverlongEnd`` at its newline, and drops everything between, so a 100 MB line
costs one pass over its bytes and a few KiB of memory. (The SDK's own stdio
reader re-joins its whole buffer for every chunk, which is quadratic in the
length of a line: a 100 MB answer kept a core busy for the whole tool timeout.)

``overlong_answer`` then decides from those two ends which pending request
an overlong line answers, so that one call fails at once with a message
instead of waiting out its timeout.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from protocol.json_outline import too_many_values

__all__ = [
    "KEPT",
    "NOTE_EVERY",
    "DroppedNotes",
    "Line",
    "LineFramer",
    "Overlong",
    "OverlongEnd",
    "ServerPace",
    "overlong_answer",
    "overlong_kind",
    "too_wide",
]

KEPT: Final = 512
"""Bytes kept of each end of an overlong line: enough for JSON-RPC's scalar members."""

RequestId = int | str


@dataclass(frozen=True, slots=True)
class Line:
    """One whole line (without its newline), at most ``max_line`` bytes."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Overlong:
    """The current line just passed ``max_line`` bytes; ``head`` is its start."""

    head: bytes


@dataclass(frozen=True, slots=True)
class OverlongEnd:
    """The overlong line ended: its last bytes and its full length."""

    head: bytes
    tail: bytes
    size: int


Frame = Line | Overlong | OverlongEnd


class LineFramer:
    """Splits bytes into lines of at most ``max_line`` bytes, in time linear in the bytes fed."""

    def __init__(self, max_line: int) -> None:
        if max_line < KEPT:
            raise ValueError(f"max_line must be at least {KEPT} bytes")
        self.max_line = max_line
        self._line = bytearray()
        self._head = b""
        self._tail = b""
        self._size = 0  # > 0: inside an overlong line, this many bytes so far

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes (an incomplete last line is kept for the next call)."""
        frames: list[Frame] = []
        view = memoryview(data)
        start = 0
        while True:
            end = data.find(b"\n", start)
            piece = view[start:] if end < 0 else view[start:end]
            if self._size:
                self._skip(piece)
            elif len(self._line) + len(piece) <= self.max_line:
                self._line += piece
            else:
                self._begin_overlong(piece, frames)
            if end < 0:
                return frames
            self._end_line(frames)
            start = end + 1

    def _begin_overlong(self, piece: memoryview, frames: list[Frame]) -> None:
        self._size = len(self._line)
        self._head = bytes(self._line[:KEPT])
        if len(self._head) < KEPT:
            self._head += bytes(piece[: KEPT - len(self._head)])
        self._tail = bytes(self._line[-KEPT:])
        self._line = bytearray()  # release the buffer, not only empty it
        self._skip(piece)
        frames.append(Overlong(self._head))

    def _skip(self, piece: memoryview) -> None:
        self._size += len(piece)
        if len(piece) >= KEPT:
            self._tail = bytes(piece[-KEPT:])
        elif piece:
            self._tail = (self._tail + bytes(piece))[-KEPT:]

    def _end_line(self, frames: list[Frame]) -> None:
        if self._size:
            frames.append(OverlongEnd(self._head, self._tail, self._size))
            self._size = 0
            self._head = self._tail = b""
        elif self._line.strip():
            frames.append(Line(bytes(self._line)))
            self._line.clear()
        else:
            self._line.clear()


# ---------------------------------------------------------------------- which request

_KEY: Final = re.compile(rb'\s*"((?:[^"\\]|\\.)*)"\s*:\s*')
_SCALAR: Final = re.compile(
    rb'("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)\s*([,}])\s*'
)
_LAST_MEMBER: Final = re.compile(
    rb'[{,]\s*"((?:[^"\\]|\\.)*)"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)\s*\}\s*$'
)


def _leading(head: bytes) -> tuple[dict[bytes, bytes], bytes | None]:
    """The scalar members an object starts with, and the key of the first other one.

    ``{"jsonrpc":"2.0","id":7,"result":{…`` gives ``({jsonrpc: "2.0", id: 7}, result)``.
    """
    opening = re.match(rb"\s*\{", head)
    if opening is None:
        return {}, None
    scalars: dict[bytes, bytes] = {}
    pos = opening.end()
    while True:
        key = _KEY.match(head, pos)
        if key is None:
            return scalars, None
        value = _SCALAR.match(head, key.end())
        if value is None:
            return scalars, key[1]
        scalars[key[1]] = value[1]
        if value[2] == b"}":
            return scalars, None
        pos = value.end()


def overlong_kind(head: bytes) -> str:
    """``"answer"``, ``"message"`` (a request or notification) or ``"unknown"``, from a line's start."""
    scalars, first_big = _leading(head)
    if b"method" in scalars or first_big in (b"params", b"method"):
        return "message"
    if first_big in (b"result", b"error") or b"error" in scalars or b"result" in scalars:
        return "answer"
    return "unknown"


def overlong_answer(
    head: bytes, tail: bytes | None, pending: Collection[RequestId]
) -> RequestId | None:
    """The id of the pending request an overlong line answers, if its ends tell.

    Servers put ``id`` near the start (the Python SDK: ``{"jsonrpc","id","result"}``)
    or last (the TypeScript SDK: ``{"result",…,"jsonrpc","id"}``); only an
    id among ``pending`` counts, so a stray ``"id"`` inside a result cannot
    fail somebody else's call.
    """
    if overlong_kind(head) != "answer":
        return None
    scalars, _ = _leading(head)
    candidates = [scalars.get(b"id")]
    if tail is not None:
        last = _LAST_MEMBER.search(tail)
        if last is not None and last[1] == b"id":
            candidates.append(last[2])
    for raw in candidates:
        if raw is None:
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, int | str) and not isinstance(value, bool) and value in pending:
            return value
    return None


class ServerPace:
    """How many requests, notifications and unreadable lines a server may send a second.

    A server's answers are paced by the gateway's own requests; what it sends of
    its own accord is not. A child writing ``roots/list`` requests, log
    notifications or junk lines as fast as it could took the node's core (31 s
    of CPU in 34 s) and slowed every call of that server to 2-3 s. Past
    ``rate`` a second (bursts of twice that) such lines are dropped unread:
    the counting is all they cost.
    """

    __slots__ = ("_at", "_tokens", "dropped", "rate")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self._tokens = 2 * rate
        self._at = now
        self.dropped = 0  # in all: while it grows, an HTTP event stream is read slower

    def admit_message(self, message: bytes, now: float) -> bool:
        """Whether to read ``message``: an answer always (the gateway's requests pace
        them), anything else within ``rate``."""
        return overlong_kind(message[:KEPT]) == "answer" or self.admit(now)

    def admit(self, now: float) -> bool:
        self._tokens = min(2 * self.rate, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.dropped += 1
        return False


def too_wide(message: bytes) -> str | None:
    """Why a large message is not read (``protocol.json_outline``: an array of over
    1,024 values), as "a message in which result.tools holds 20,001 values, more than
    this gateway reads in one array (1,024)"; None when it may be read."""
    crowded = too_many_values(message, "id")
    if crowded is None:
        return None
    return "a message in which " + crowded[0].partition(";")[0]


NOTE_EVERY: Final = 10.0
"""Seconds between two warnings about what one server sent that was dropped."""


class DroppedNotes:
    """Warnings about a server's dropped messages, one every ``NOTE_EVERY`` seconds at
    most, counting the rest: one per line of a server writing junk made 7 MB of log
    in 11 s. Both transports (stdio lines, HTTP events) warn through one."""

    __slots__ = ("_at", "_dropped", "_log", "_server")

    def __init__(self, logger: logging.Logger, server: str) -> None:
        self._log = logger
        self._server = server
        self._at = -NOTE_EVERY  # the last warning (monotonic seconds)
        self._dropped = 0  # messages dropped since it

    def note(self, what: str, data: bytes) -> None:
        """``what`` happened to ``data`` (a dropped message): warned now, or counted."""
        now = time.monotonic()
        if now - self._at < NOTE_EVERY:
            self._dropped += 1
            return
        more = f" ({self._dropped:,} more dropped since the last warning)" if self._dropped else ""
        self._log.warning("mcp server %s %s%s: %.200r", self._server, what, more, data)
        self._at, self._dropped = now, 0
