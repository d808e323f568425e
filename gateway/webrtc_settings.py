"""WebRTC calls' settings (``gateway serve --webrtc-*``, ``GATEWAY_WEBRTC_*``; docs/webrtc.md).

Declared once here, lent to ``gateway.config.Config`` under the ``webrtc``
prefix (as the phone edge's are under ``phone``). They stand beside
``gateway/webrtc/`` rather than inside it: the node's configuration stands on
them, and the WebRTC room stands on the OpenAI door, which stands on the
configuration; inside the room they would be an arrow back up.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from gateway.common.settings import Setting

__all__ = ["WebRTCSettings"]

WEBRTC = "WebRTC calls (docs/webrtc.md)"


class WebRTCSettings(msgspec.Struct, kw_only=True):
    """How WebRTC calls (``POST /openai/v1/realtime/calls``) connect, and their limits."""

    ice_servers: Annotated[
        str,
        Setting(
            "STUN/TURN servers the gateway gathers candidates with, comma-separated "
            "(stun:HOST:PORT, turn:USER:PASSWORD@HOST:PORT, turns:…); unset: host "
            "candidates only (a gateway reachable at its own addresses; coturn for the rest)",
            WEBRTC,
            secret=True,
            example="stun:stun.example.com:3478,turn:gw:secret@turn.example.com:3478",
        ),
    ] = ""
    max_calls: Annotated[
        int,
        Meta(ge=0),
        Setting("WebRTC calls one node holds at once; one more is answered 429", WEBRTC),
    ] = 100
    connect_timeout: Annotated[
        float,
        Meta(gt=0, le=120),
        Setting(
            "seconds a call's peer has to complete ICE and DTLS and open its data channel; "
            "a peer that does not is dropped",
            WEBRTC,
        ),
    ] = 10.0
    max_sdp: Annotated[
        int,
        Meta(ge=1024, le=1 << 20),
        Setting("largest SDP offer (or multipart body) in bytes; a larger one is 413", WEBRTC),
    ] = 64 * 1024
