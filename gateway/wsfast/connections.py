"""The two connection classes the gateway uses: one to dial providers, one to serve clients.

Each is a websockets connection class with this package's parts mixed in, so
the rest of the gateway passes a class to ``connect``/``serve``
(``create_connection=``) and otherwise uses websockets' public API.
"""

from __future__ import annotations

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.server import ServerConnection

from gateway.wsfast.read import FastReader
from gateway.wsfast.write import BatchedWrites

__all__ = ["BatchingConnection", "FastReadClientConnection"]


class FastReadClientConnection(FastReader, ClientConnection):
    """The gateway's connection to a provider: it reads the provider's plain frames itself."""


class BatchingConnection(FastReader, BatchedWrites, ServerConnection):
    """The gateway's connection to a client: one socket write per batch of frames, and
    its client's plain frames read without websockets' parser (a voice client sends
    one binary frame per 20 ms)."""
