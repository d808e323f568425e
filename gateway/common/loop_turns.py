"""Turns at work too large for one loop pass, shared by every connection of a node.

A recording sent whole (15 MiB of audio in one OpenAI ``input_audio_buffer.append``)
is read and relayed a slice at a time, the loop free in between. But "in between" is
per connection: eight such appends at once each did a slice in the same pass, and the
node's other clients (and ``/healthz``) waited 140–250 ms for it. Work that takes a
turn here gets one piece into a loop pass, whoever it belongs to, so a pass holds at
most one slice of such work however many tenants send it.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["LoopTurns"]


class LoopTurns:
    """FIFO turns, one per loop pass: ``await take()``, then do one piece of work
    before the next ``await`` (it runs in the pass the turn came in). The next waiter's
    turn comes in a later pass, whatever the holder awaits after its piece, so a
    holder stuck on its own socket's backpressure keeps no one else waiting."""

    __slots__ = ("_busy", "_waiting")

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._busy = False  # a turn was given in this pass or the last

    async def take(self) -> None:
        """Wait for this task's turn (at once when no one else is working)."""
        loop = asyncio.get_running_loop()
        if not self._busy and not self._waiting:
            self._busy = True
            loop.call_soon(self._pass_on)
            return
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if not turn.done():  # given up while waiting: skipped by ``_pass_on``
                turn.cancel()
            raise

    def _pass_on(self) -> None:
        """A pass after a turn was given: the next waiter's turn, or no one's."""
        waiting = self._waiting
        while waiting:
            turn = waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                turn.get_loop().call_soon(self._pass_on)
                return
        self._busy = False
