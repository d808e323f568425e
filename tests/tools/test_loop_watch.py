"""The loop watcher the tools tests measure stalls with (``helpers.LoopWatch``)."""

from __future__ import annotations

import asyncio
import time

from .helpers import watching_the_loop


async def test_a_stall_that_ends_the_watched_block_is_seen() -> None:
    async with watching_the_loop() as watch:
        await asyncio.sleep(0.1)  # the watch ticks
        time.sleep(1.5)  # noqa: ASYNC251 - the stall under test: the loop is held to the end
    assert watch.ticks >= 1
    assert watch.max_gap >= 1.4, watch.max_gap


async def test_a_stall_inside_the_block_is_seen() -> None:
    async with watching_the_loop() as watch:
        time.sleep(0.5)  # noqa: ASYNC251 - the stall under test
        await asyncio.sleep(0.1)
    assert watch.max_gap >= 0.45, watch.max_gap
