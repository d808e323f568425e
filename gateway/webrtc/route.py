"""``POST /openai/v1/realtime/calls`` (and a call's ``…/CALL_ID/hangup``) on the node's
HTTP app: WebRTC calls, or a 501 saying how to get them (aiortc is optional: ``pip
install realtime-gateway[webrtc]``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web
from websockets.asyncio.server import ServerConnection

from gateway.config import Config
from gateway.edge.http_requests import Caller, Owns
from gateway.edge.openai_door import OpenAIDoor
from gateway.webrtc import CALLS_PATH, HANGUP_PATH

__all__ = ["install"]


async def _unavailable(request: web.Request) -> web.Response:
    body = {
        "error": {
            "type": "invalid_request_error",
            "code": "webrtc_unavailable",
            "message": "this gateway was installed without WebRTC: install "
            "realtime-gateway[webrtc] (aiortc), or connect with a WebSocket to "
            "/openai/v1/realtime",
        }
    }
    return web.Response(status=501, body=msgspec.json.encode(body), content_type="application/json")


async def _nothing() -> None:
    pass


def install(
    app: web.Application,
    config: Config,
    door: OpenAIDoor,
    serve: Callable[[ServerConnection], Awaitable[None]],
    owns: Owns,
    caller: Caller,
) -> Callable[[], Awaitable[None]]:
    """Route ``POST CALLS_PATH`` and ``POST HANGUP_PATH`` on ``app``; returns what ends
    the node's calls. ``serve``: serves an admitted client's socket (a call's) as the
    node's clients; ``owns``: the request's key owns a session (``HttpApi.owns``);
    ``caller``: the refusal of unknown credentials (``Edges.caller``)."""
    try:
        from gateway.webrtc.calls import WebRTCCalls
    except ImportError:
        app.router.add_post(CALLS_PATH, _unavailable)
        app.router.add_post(HANGUP_PATH, _unavailable)
        return _nothing
    calls = WebRTCCalls(config, door, serve, owns, caller)
    app.router.add_post(CALLS_PATH, calls.create)
    app.router.add_post(HANGUP_PATH, calls.hangup)
    return calls.close
