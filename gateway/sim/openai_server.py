"""The simulator's servers on OpenAI Realtime's wire: one per provider that speaks it.

OpenAI, Azure OpenAI and xAI serve the same events; what differs is the
path, how the key is given, and (xAI) the shape of the session. Each
provider's row says how (``Provider.sim``, a ``SimFlavour``), and ``OpenAISim`` serves the flavour it is given, so
the adapter of each provider is tested against the server it will meet
(docs/providers.md has the sources):

- ``openai``: ``/v1/realtime?model=M``, ``Authorization: Bearer KEY``, the GA session;
  and GPT-Live at ``/v1/live/sessions`` (``gateway.sim.live``): each endpoint
  refuses the other's models;
- ``azure``: ``/openai/v1/realtime?model=DEPLOYMENT``, ``api-key: KEY`` (or an
  Entra ``Authorization: Bearer TOKEN``); the deployment is required;
- ``xai``: ``/v1/realtime``, ``Authorization: Bearer KEY``, xAI's flat session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from gateway.sim.live import LiveConnection
from gateway.sim.model import Sim, SimConfig
from gateway.sim.openai import DEFAULT_MODEL, RealtimeConnection
from gateway.upstream import live_wire
from gateway.upstream.live import is_live_model
from gateway.upstream.provider import SimFlavour
from gateway.upstream.providers import PROVIDERS

__all__ = ["FLAVOURS", "Flavour", "OpenAISim"]


@dataclass(frozen=True, slots=True)
class Flavour:
    """How one provider serves OpenAI Realtime's wire: its row's ``SimFlavour``."""

    name: str
    sim: SimFlavour

    @property
    def path(self) -> str:
        return f"{self.sim.base}/realtime"

    @property
    def live_path(self) -> str:
        return f"{self.sim.base}{live_wire.PATH}"


FLAVOURS: Final = {
    row.name: Flavour(row.name, row.sim)
    for row in PROVIDERS
    if row.wire == "openai" and row.sim is not None
}
"""The flavours on OpenAI's wire, from the providers' rows (``Provider.sim``)."""


def _json(status: int, reason: str, body: bytes) -> Response:
    headers = Headers({"Content-Type": "application/json", "Content-Length": str(len(body))})
    return Response(status, reason, headers, body)


class OpenAISim(Sim):
    """A simulator on OpenAI Realtime's wire, served as ``config.flavor`` serves it."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.profile = FLAVOURS[config.flavor]
        self.flavor = config.flavor

    @property
    def url(self) -> str:
        """The WebSocket base URL (``ws://HOST:PORT/v1``) for an adapter or the SDK."""
        return f"{self.address}{self.profile.sim.base}"

    @property
    def endpoint(self) -> str:
        return f"{self.address}{self.profile.path}"

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        profile = self.profile
        path, _, query = request.path.partition("?")
        live = profile.sim.live and path.rstrip("/") == profile.live_path
        if path.rstrip("/") != profile.path and not live:
            return connection.respond(404, f"Not found: the realtime endpoint is {profile.path}\n")
        model = _model(query)
        if live and model:
            return _json(
                400,
                "Bad Request",
                b'{"error": {"type": "invalid_request_error", "code": "unknown_parameter", '
                b'"message": "GPT-Live takes the model in session.start, not in the URL.", '
                b'"param": "model"}}',
            )
        if not live and is_live_model(model):
            body = (
                '{"error": {"type": "invalid_request_error", "code": "unsupported_model", '
                f'"message": "The model \'{model}\' is a GPT-Live model: it is served at '
                f'{profile.live_path}, not {profile.path}.", "param": "model"}}}}'
            )
            return _json(400, "Bad Request", body.encode())
        if profile.sim.needs_model and not live and not model:
            return _json(
                404,
                "Not Found",
                b'{"error": {"code": "DeploymentNotFound", "message": "The API deployment '
                b'for this resource does not exist."}}',
            )
        key = self.config.api_key
        if key is not None and not self._authorized(request, key):
            return _json(
                401,
                "Unauthorized",
                b'{"error": {"type": "invalid_request_error", "code": "invalid_api_key", '
                b'"message": "Incorrect API key provided.", "param": null}}',
            )
        return None

    def _authorized(self, request: Request, key: str) -> bool:
        if request.headers.get("Authorization") == f"Bearer {key}":
            return True  # OpenAI and xAI keys; Azure's Entra tokens
        return self.profile.sim.auth == "api-key" and request.headers.get("api-key") == key

    def _connection(self, ws: ServerConnection, no: int) -> RealtimeConnection | LiveConnection:
        path, _, query = ws.request.path.partition("?") if ws.request is not None else ("", "", "")
        if self.profile.sim.live and path.rstrip("/") == self.profile.live_path:
            return LiveConnection(self, ws, no)
        model = _model(query) or DEFAULT_MODEL
        return RealtimeConnection(self, ws, no, model, flat=self.profile.sim.flat)


def _model(query: str) -> str:
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == "model" and value:
            return value
    return ""
