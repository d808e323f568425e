"""The gateway's Python client library, and the programs built on it.

``Client`` (``gateway.client.client``) keeps one session alive across dropped
connections and yields each turn's events exactly once; ``gateway chat`` and
``gateway loadtest`` are built on it. This package imports ``protocol`` and
the gateway's leaf modules ``pcm`` and ``settings`` only: it is a program of
its own, never server code (``tests/house/test_layers.py``).
"""

from gateway.client.calls import ApprovalHook, ApprovalRefused
from gateway.client.client import (
    Client,
    CommandRefused,
    ConfigureRefused,
    ToolHandler,
    ToolResultMessage,
    event_kind,
)
from gateway.client.dial import (
    BadUrl,
    ClientError,
    ConnectionLost,
    Refused,
    Unreachable,
    normalize_url,
)

__all__ = [
    "ApprovalHook",
    "ApprovalRefused",
    "BadUrl",
    "Client",
    "ClientError",
    "CommandRefused",
    "ConfigureRefused",
    "ConnectionLost",
    "Refused",
    "ToolHandler",
    "ToolResultMessage",
    "Unreachable",
    "event_kind",
    "normalize_url",
]
