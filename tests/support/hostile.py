"""What an attacker sends from outside, and what it costs the node.

``gzip_bomb(n)`` is a gzip body that inflates to ``n`` zero bytes (about ``n / 1000``
bytes as sent); ``raw_flood`` opens a WebSocket by hand and writes frames without
reading (``fragments``, ``PING``); ``PeakRss`` samples a process's resident memory and
CPU while a block runs.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import zlib
from typing import Final

__all__ = ["PING", "PeakRss", "cpu_seconds", "fragments", "gzip_bomb", "raw_flood", "rss"]

_CHUNK = bytes(1 << 20)


@functools.cache
def gzip_bomb(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` zero bytes (cached: building 1 GB takes ~1 s)."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    parts = []
    left = inflated
    while left > 0:
        piece = _CHUNK if left >= len(_CHUNK) else _CHUNK[:left]
        parts.append(deflater.compress(piece))
        left -= len(piece)
    parts.append(deflater.flush())
    return b"".join(parts)


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used: what a probe cost the node,
    whatever else the machine runs meanwhile."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class PeakRss:
    """The highest RSS of a process while the block runs (sampled every 5 ms), and the
    CPU seconds it used (``cpu``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = rss(pid)
        self.cpu_before = cpu_seconds(pid)
        self.cpu = 0.0
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def grew(self) -> int:
        return self.peak - self.before

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss(self.pid))
        self.cpu = cpu_seconds(self.pid) - self.cpu_before

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss(self.pid))
        self.cpu = cpu_seconds(self.pid) - self.cpu_before


HANDSHAKE = (
    b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def raw_flood(url: str, payload: bytes, block: int) -> str:
    """Open a WebSocket by hand, write ``payload`` in ``block``-byte writes without
    reading, then read what the node says: its close frame's code and reason."""
    host, port = url.removeprefix("ws://").split("/", 1)[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(HANDSHAKE)
    await reader.readuntil(b"\r\n\r\n")
    await reader.readuntil(b"}")  # the session frame's JSON (small)
    sent = 0
    try:
        while sent < len(payload):
            writer.write(payload[sent : sent + block])
            sent += block
            await writer.drain()
    except ConnectionError as exc:
        return f"cut off after {sent >> 20} MiB written ({exc.__class__.__name__})"
    try:
        async with asyncio.timeout(30):
            data = await reader.read()  # to the end: pongs may come before the close
    except (ConnectionError, TimeoutError) as exc:
        return f"all {sent >> 20} MiB written; then {exc.__class__.__name__}"
    at = data.rfind(b"\x88")
    if at < 0:
        return f"all {sent >> 20} MiB written; closed without a close frame"
    close = data[at + 2 : at + 2 + data[at + 1]]
    return f"all {sent >> 20} MiB written; closed {int.from_bytes(close[:2])} {close[2:]!r}"


def fragments(count: int) -> bytes:
    """One text message from a client in ``count`` one-byte frames (masked with zeros)."""
    mask = b"\x00\x00\x00\x00"
    return (
        b"\x01\x81"
        + mask
        + b"a"
        + (b"\x00\x81" + mask + b"a") * (count - 2)
        + b"\x80\x81"
        + mask
        + b"a"
    )


PING: Final = b"\x89\xfd\x00\x00\x00\x00" + b"p" * 125
"""A client's ping (masked with zeros) of 125 bytes, the most a control frame holds."""
