"""The ``code`` an ``error`` event may carry: one vocabulary, which clients match on.

Its own room so the list (and the JS client's copy generated from it,
``gateway.client.js_codes``) is read and extended in one place;
``protocol.events`` names both for the clients that import them from there.
"""

from __future__ import annotations

import typing
from typing import Final, Literal

__all__ = ["ERROR_CODES", "ErrorCode"]

ErrorCode = Literal[
    # client's fault: fix the frame and send again
    "bad_frame",
    "unknown_type",
    "turn_active",
    "no_turn",
    "unknown_call",
    "unknown_item",  # a forget naming nothing the model holds
    "wrong_digest",  # an approve whose digest is not the pending call's
    "forbidden",  # the credential or the key's policy does not allow it
    # the model's fault: the gateway tells the model and the turn goes on
    "malformed_execute",
    # the environment: retry later
    "upstream",
    "upstream_timeout",  # the provider went silent mid-response, twice
    "store",
    "rate_limited",
    "log_trimmed",
    "draining",
    "quota_exceeded",
    "internal",
]


ERROR_CODES: Final[tuple[str, ...]] = typing.get_args(ErrorCode)
"""Every ``code`` an ``error`` event may carry (the JS client's copy is generated from it)."""
