"""WebRTC calls on the OpenAI door (docs/webrtc.md): the media terminated in the gateway.

aiortc is an optional dependency (``pip install realtime-gateway[webrtc]``):
without it, ``POST /openai/v1/realtime/calls`` is answered 501 saying so.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CALLS_PATH"]

CALLS_PATH: Final = "/openai/v1/realtime/calls"
