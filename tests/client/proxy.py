"""A TCP proxy on loopback whose connections a test can cut mid-stream.

Cutting aborts both sockets (RST, no close frame), which is what a client sees
when a network path dies: the WebSocket ends with 1006 and whatever was in
flight is lost. The client must get it back by resuming from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

__all__ = ["TcpProxy"]


class TcpProxy:
    """``async with TcpProxy(port) as proxy``: ``proxy.url(path)`` dials through it."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._pipes: set[asyncio.Task[None]] = set()

    def url(self, path: str = "/v1/realtime") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        for task in list(self._pipes):
            task.cancel()
        for task in list(self._pipes):
            with contextlib.suppress(BaseException):
                await task

    def cut(self) -> int:
        """Abort every open connection; how many there were."""
        pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            a.transport.abort()
            b.transport.abort()
        return len(pairs)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._pairs.append((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(_pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        dst.transport.abort() if src.at_eof() is False else dst.close()
