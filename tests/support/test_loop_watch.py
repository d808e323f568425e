"""The loop watcher the stall tests measure with (``tests.support.stall.LoopWatch``)."""

from __future__ import annotations

import asyncio
import time

from tests.support.stall import LoopWatch


async def test_a_stall_that_ends_the_watched_block_is_seen() -> None:
    async with LoopWatch(0.02) as watch:
        await asyncio.sleep(0.1)  # the watch ticks
        time.sleep(1.5)  # noqa: ASYNC251 - the stall under test: the loop is held to the end
    assert watch.ticks >= 1
    assert watch.longest >= 1.4, watch.longest


async def test_a_stall_inside_the_block_is_seen() -> None:
    async with LoopWatch(0.02) as watch:
        time.sleep(0.5)  # noqa: ASYNC251 - the stall under test
        await asyncio.sleep(0.1)
    assert watch.longest >= 0.45, watch.longest
