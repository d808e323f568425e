"""Sending a recording as a microphone would: PCM16 frames at real-time pace, then the
end of the spoken turn (``Client.speak``).

Its own room because the pacing is the part with rules of its own: each frame goes at
its due time counted from the start (a late frame does not push the rest back, so
there is no drift), and the turn is ended the way the session's turn detection
needs: a ``commit`` when the client ends turns itself, else silence at the same pace
until the gateway's VAD heard the speech end (``speech_ended``), for a bounded time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.client.dial import ClientError
from gateway.common.pcm import silence

__all__ = ["first_of", "stream_speech"]

T = TypeVar("T")


async def stream_speech(
    send_audio: Callable[[bytes], Awaitable[None]],
    commit: Callable[[], Awaitable[None]] | None,
    speech_ended: asyncio.Event,
    pcm16: bytes,
    rate: int,
    frame_ms: int,
    end_timeout: float,
) -> None:
    """Send ``pcm16`` in ``frame_ms`` frames, each at its due time, then end the turn:
    ``commit`` (if given), or silence until ``speech_ended`` is set (``end_timeout`` s)."""
    size = rate * frame_ms // 1000 * 2
    start = time.monotonic()
    index = 0
    for index, at in enumerate(range(0, len(pcm16), size)):
        delay = start + index * frame_ms / 1000 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await send_audio(pcm16[at : at + size])
    if commit is not None:
        await commit()
        return
    quiet = silence(frame_ms / 1000, rate)
    for extra in range(1, int(end_timeout * 1000 / frame_ms) + 1):
        if speech_ended.is_set():
            return
        delay = start + (index + extra) * frame_ms / 1000 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await send_audio(quiet)


async def first_of(getter: asyncio.Future[T], sender: asyncio.Task[None], end_timeout: float) -> T:
    """What ``getter`` gets first; once the audio and its end are sent (``sender`` done),
    for ``end_timeout`` seconds at most. The sender's failure is raised."""
    if not sender.done():
        pending: list[asyncio.Future[Any]] = [getter, sender]
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    failure = sender.exception() if sender.done() and not sender.cancelled() else None
    if failure is not None:
        getter.cancel()
        raise failure
    if getter.done():
        return getter.result()
    try:
        async with asyncio.timeout(end_timeout):
            return await getter
    except TimeoutError:
        raise ClientError(
            f"no spoken turn started within {end_timeout:g}s after the audio: the "
            "gateway heard no speech in it (too quiet?)"
        ) from None
