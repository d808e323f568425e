"""Connections that have not authenticated yet, bounded per client address and in all.

A connection holds a file descriptor from its first byte, and until it
authenticates (a WebSocket handshake admitted, an HTTP API request with a
valid key) nothing says whose it is. A client that opens connections and
sends its request slowly, or never ("slowloris"), holds them as long as the
server lets it: once the process has no descriptor left, accept() fails and
nobody else gets in, not even ``/healthz``. Three bounds stop that:

- ``header_timeout``: each such connection lives that long at most (the
  servers' own timeouts: websockets' ``open_timeout``, aiohttp's keep-alive);
- ``per_address``: one address holds at most that many at once;
- ``total``: all addresses together hold at most that many (half the
  descriptors the process may open, by default), so a crowd of addresses
  cannot take them all either.

Past a bound the *oldest* such connection is closed, not the new one: a
stalled connection is old by definition, while a real client's handshake
is a few milliseconds old, so a client sharing an attacker's address (a
NAT, an office) still gets in.

Both ports share one ``PendingConnections``: the WebSocket server's
connection class reports to it (``watched``), and the HTTP API's
protocols are wrapped in ``WatchedProtocol``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Final

from gateway.wsfast import BatchingConnection

__all__ = ["PendingConnections", "WatchedProtocol", "peer_address", "watched"]

log = logging.getLogger("gateway.edge.pending")

WARN_EVERY: Final = 10.0
"""Seconds between two warnings about closed connections (one line sums them up)."""


def peer_address(transport: asyncio.BaseTransport) -> str:
    """The client's IP address as text (IPv4-mapped IPv6 as IPv4); "" when unknown."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return ""
    host = str(peer[0])
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class PendingConnections:
    """The connections of a node that have not authenticated yet, oldest first.

    ``opened`` when a connection is made (it may close older ones to stay
    within the bounds), ``settled`` once it authenticated or closed.
    ``on_close(reason)`` is told of each connection closed to make room
    (``reason``: ``unauthenticated_per_address`` or ``unauthenticated_total``).
    A bound of 0 is no bound.
    """

    def __init__(
        self,
        per_address: int,
        total: int,
        on_close: Callable[[str], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_address = per_address
        self.total = total
        self._on_close = on_close
        self._clock = clock
        # Insertion order is age: the first entry is the oldest.
        self._all: dict[asyncio.BaseTransport, str] = {}
        self._by_address: dict[str, dict[asyncio.BaseTransport, None]] = {}
        self._closed_since_warning: dict[str, int] = {}
        self._warned_at = -WARN_EVERY

    def __len__(self) -> int:
        return len(self._all)

    def held_by(self, address: str) -> int:
        """How many pending connections ``address`` holds now."""
        return len(self._by_address.get(address, ()))

    def opened(self, transport: asyncio.BaseTransport) -> None:
        address = peer_address(transport)
        mine = self._by_address.get(address)
        if 0 < self.per_address <= len(mine or ()):
            assert mine is not None
            self._close(next(iter(mine)), "unauthenticated_per_address", address)
        if 0 < self.total <= len(self._all):
            oldest = next(iter(self._all))
            self._close(oldest, "unauthenticated_total", self._all[oldest])
        self._all[transport] = address
        self._by_address.setdefault(address, {})[transport] = None

    def settled(self, transport: asyncio.BaseTransport) -> None:
        """No longer pending: it authenticated, or it closed. Idempotent."""
        address = self._all.pop(transport, None)
        if address is None:
            return
        mine = self._by_address[address]
        del mine[transport]
        if not mine:
            del self._by_address[address]

    def _close(self, transport: asyncio.BaseTransport, reason: str, address: str) -> None:
        self.settled(transport)
        abort: Callable[[], object] = getattr(transport, "abort", transport.close)
        abort()  # no close handshake, nothing left to flush: the descriptor is free now
        if self._on_close is not None:
            self._on_close(reason)
        self._closed_since_warning[address] = self._closed_since_warning.get(address, 0) + 1
        now = self._clock()
        if now - self._warned_at >= WARN_EVERY:
            self._warned_at = now
            counts = sorted(self._closed_since_warning.items(), key=lambda kv: -kv[1])
            self._closed_since_warning = {}
            shown = ", ".join(f"{a or '?'}: {n}" for a, n in counts[:5])
            log.warning(
                "closed unauthenticated connections to stay within %d per address and %d in "
                "all (--unauthenticated-per-address; slow or stalled requests) — %s",
                self.per_address,
                self.total,
                shown,
            )


class WatchedProtocol(asyncio.Protocol):
    """A server protocol whose connection is counted in ``PendingConnections``.

    Wraps the HTTP API's aiohttp protocol (``aiohttp.web.Server`` is a
    protocol factory): only the connection's start and end are observed,
    everything else is passed on. The API settles the connection itself once
    a request of it authenticated.
    """

    __slots__ = ("_inner", "_pending", "_transport")

    def __init__(self, inner: asyncio.Protocol, pending: PendingConnections) -> None:
        self._inner = inner
        self._pending = pending
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._inner.connection_made(transport)
        self._pending.opened(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._pending.settled(self._transport)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def watched(pending: PendingConnections) -> type[BatchingConnection]:
    """The WebSocket port's connection class, counted in ``pending`` from its first byte.

    ``Edges.admit`` settles a connection once its handshake authenticated;
    one that never does is settled when it closes (at the latest after
    ``header_timeout``, websockets' ``open_timeout``).
    """

    class WatchedConnection(BatchingConnection):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            pending.opened(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            pending.settled(self.transport)
            super().connection_lost(exc)

    return WatchedConnection
