"""``RedisRecordings``: sessions' recordings in Redis, beside the session they record.

A recording is one string, ``{prefix}:{SID}:rec``, under the session's hash
tag (a Cluster keeps it on the session's slot, so its script is single-slot)
and removed by the session's ``DELETE`` script. A round's writes (one per
recording session) go out as one pipeline of ``RECORD`` scripts: the
recorder's writes ride the log writer's rounds, never an append's round trip.
Export pages are ``GETRANGE``s: a page never holds more than asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from gateway.store.base import RecordingChunk, whole_lines
from gateway.store.redis_core import ERRORS, RedisCore
from gateway.store.redis_scripts import RECORD

__all__ = ["RedisRecordings"]


class RedisRecordings:
    """Sessions' recordings (``Recordings``) in Redis (see the module docstring)."""

    def __init__(self, core: RedisCore) -> None:
        self._core = core

    def _recording_keys(self, sid: str) -> tuple[str, str]:
        return self._core.key(sid, "meta"), self._core.key(sid, "rec")

    async def append_recordings(self, chunks: Sequence[RecordingChunk], limit: int) -> list[int]:
        core = self._core
        if not chunks:
            return []
        try:
            async with core.client.pipeline(transaction=False) as pipe:
                for sid, lines, cut in chunks:
                    pipe.execute_command(
                        "EVALSHA",
                        RECORD.sha,
                        2,
                        *self._recording_keys(sid),
                        core.ttl_ms,
                        limit,
                        lines,
                        cut,
                    )
                replies: list[Any] = await pipe.execute(raise_on_error=False)
        except ERRORS as exc:
            raise core.error(exc, "writing recordings") from exc
        if any(isinstance(r, NoScriptError) for r in replies):
            # A flushed script cache: the single-call path loads the script again.
            replies = [
                await core.eval(RECORD, self._recording_keys(sid), core.ttl_ms, limit, lines, cut)
                for sid, lines, cut in chunks
            ]
        sizes: list[int] = []
        for reply in replies:
            if isinstance(reply, Exception):
                raise core.error(reply, "writing recordings")
            sizes.append(int(reply))
        return sizes

    async def read_recording(self, sid: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        core = self._core
        key = core.key(sid, "rec")
        try:
            async with core.client.pipeline(transaction=False) as pipe:
                pipe.strlen(key)
                pipe.getrange(key, offset, offset + max_bytes - 1)
                size, page = await pipe.execute()
        except ERRORS as exc:
            raise core.error(exc, "reading a recording") from exc
        return whole_lines(page), int(size)
