"""``LoopTurns``: the node's large appends take turns, one slice of work a loop pass,
whoever sends them (eight clients' 15 MiB appends at once each did a slice in the
same pass, and ``/healthz`` waited 140-250 ms)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.common.loop_turns import LoopTurns

pytestmark = pytest.mark.timeout(10)


class _Passes:
    """The loop pass now: advanced once a pass by a callback that schedules itself."""

    def __init__(self) -> None:
        self.now = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._next)

    def _next(self) -> None:
        self.now += 1
        self._handle = self._loop.call_soon(self._next)

    def stop(self) -> None:
        self._handle.cancel()


async def test_pieces_of_work_never_share_a_loop_pass() -> None:
    turns, passes = LoopTurns(), _Passes()
    done: list[tuple[str, int]] = []

    async def work(name: str, pieces: int, stuck: asyncio.Event | None = None) -> None:
        for _ in range(pieces):
            await turns.take()
            done.append((name, passes.now))
            if stuck is not None:  # its own socket's backpressure, after its piece
                await stuck.wait()

    stuck = asyncio.Event()
    workers = [asyncio.create_task(work(name, 3)) for name in "abcd"]
    held = asyncio.create_task(work("held", 2, stuck))
    await asyncio.gather(*workers)
    stuck.set()
    await held
    passes.stop()
    seen = [at for _, at in done]
    assert len(seen) == len(set(seen)), done  # no two pieces in one pass
    assert [name for name, _ in done].count("held") == 2
    # Everyone else finished while "held" waited on its own: it kept no one out.
    assert [name for name, _ in done][-1] == "held"
    # Turns are taken in order: the first (at once) then each one's in turn.
    assert [name for name, _ in done[:6]] == ["a", "a", "b", "c", "d", "held"]


async def test_a_task_cancelled_while_waiting_gives_its_turn_up() -> None:
    turns = LoopTurns()
    first = asyncio.create_task(turns.take())  # has the turn at once
    waiting = asyncio.create_task(turns.take())
    after = asyncio.create_task(turns.take())
    await asyncio.sleep(0)  # all three started: the other two wait
    assert first.done() and not waiting.done()
    waiting.cancel()
    async with asyncio.timeout(1):
        await after  # the cancelled waiter is skipped
    assert waiting.cancelled()


async def test_alone_a_task_works_one_piece_a_pass_and_goes_on_at_once() -> None:
    turns, passes = LoopTurns(), _Passes()
    seen = []
    for _ in range(5):
        await turns.take()
        seen.append(passes.now)
    passes.stop()
    assert len(set(seen)) == 5 and seen[-1] - seen[0] <= 12  # a pass or two apart
