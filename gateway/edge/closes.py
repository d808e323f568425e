"""Every WebSocket close the edge sends: its code, and a reason that fits the frame.

A close frame is a control frame: at most 125 bytes of payload, 2 of them the
code, so the reason may be 123 bytes of UTF-8. A longer reason does not travel
truncated: websockets refuses to send the frame, the handler ends, and the
client sees 1000 "normal closure" instead of the code that told it what to do
(a lost session used to close so, its reason carrying the store's ~150-byte
lease message). Every close goes through ``close_reason`` for that reason.

The codes are documented for clients in docs/protocol.md's "Close codes" table.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_REASON_BYTES", "CloseCode", "close_reason"]

MAX_REASON_BYTES: Final = 123
"""RFC 6455 §5.5: a control frame's payload is ≤ 125 bytes, the code takes 2."""


class CloseCode:
    """WebSocket close codes the gateway sends (4xxx are application codes)."""

    INTERNAL_ERROR = 1011  # the connection failed on a bug of the node: reconnect with after=SEQ
    SERVICE_RESTART = 1012  # node draining or session moved: reconnect with after=SEQ
    TRY_AGAIN_LATER = 1013  # store unavailable: retry later
    SLOW_CLIENT = 4008  # the client read nothing for slow_client_timeout
    KEY_REVOKED = 4401  # its API key (or the key that minted its client token) was revoked
    SESSION_DELETED = 4404  # DELETE /v1/sessions/ID: the session is gone, do not reconnect
    RATE_LIMITED = 4029  # the client kept sending frames faster than its limit


def close_reason(text: str) -> str:
    """``text`` cut to at most ``MAX_REASON_BYTES`` bytes of UTF-8, never mid-character.

    Cut text ends with "…" so a reader can tell the reason was longer.
    """
    data = text.encode()
    if len(data) <= MAX_REASON_BYTES:
        return text
    ellipsis = "…".encode()
    # errors="ignore" drops the partial character the byte cut may leave at the end.
    return data[: MAX_REASON_BYTES - len(ellipsis)].decode(errors="ignore") + "…"
