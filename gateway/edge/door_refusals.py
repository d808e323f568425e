"""What the OpenAI door refuses, in the node's log.

A client written for OpenAI's service that the door refuses (a field it does not
take, an item it does not have, a response while one runs) is told in an
``error`` event; the operator, who sees only the node, was told nothing. Each
refusal is logged at INFO with the session, the client's ``event_id``, the code,
the field and the message. A connection's first ``REFUSALS_LOGGED`` are logged,
then one line saying the rest are not: a client sending bad events in a loop
cannot fill the log. A refusal before the socket opens is an HTTP answer with
OpenAI's error body (``error_response``).
"""

from __future__ import annotations

import http
import logging
from typing import Any, Final

import msgspec
from websockets.datastructures import Headers
from websockets.http11 import Response

__all__ = ["REFUSALS_LOGGED", "RefusalLog", "error_response"]

REFUSALS_LOGGED: Final = 20

log = logging.getLogger("gateway.edge.openai_door")


class RefusalLog:
    """One connection's refusals, logged (see the module docstring)."""

    __slots__ = ("count", "sid")

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.count = 0

    def seen(self, event: dict[str, Any]) -> None:
        """``event`` (an OpenAI ``error``) went to the client."""
        self.count += 1
        sid = self.sid
        if self.count > REFUSALS_LOGGED:
            if self.count == REFUSALS_LOGGED + 1:
                log.info(
                    "session %s: OpenAI door: further refusals on this connection are not logged",
                    sid,
                    extra={"sid": sid},
                )
            return
        error = event.get("error") or {}
        log.info(
            "session %s: OpenAI door refused event %s: %s (code %s, param %s)",
            sid,
            error.get("event_id"),
            str(error.get("message"))[:300],
            error.get("code"),
            error.get("param"),
            extra={"sid": sid},
        )


def error_response(status: int, message: str, code: str) -> Response:
    """``status`` with OpenAI's error body (``invalid_request_error``, ``code``)."""
    body = msgspec.json.encode(
        {"error": {"type": "invalid_request_error", "code": code, "message": message}}
    )
    return Response(
        status,
        http.HTTPStatus(status).phrase,
        Headers([("Content-Type", "application/json")]),
        body,
    )
