"""WebRTC calls on the OpenAI door (docs/webrtc.md): the media terminated in the gateway.

aiortc is the ``webrtc`` extra, and the lock (``lock/runtime.txt``) installs it; an
install from ranges without it (``pip install realtime-gateway``) still runs: there
``POST /openai/v1/realtime/calls`` is answered 501 saying so.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CALLS_PATH", "HANGUP_PATH"]

CALLS_PATH: Final = "/openai/v1/realtime/calls"
HANGUP_PATH: Final = CALLS_PATH + "/{call_id}/hangup"
"""Ends a call (openai-python's ``client.realtime.calls.hangup(call_id)``)."""
