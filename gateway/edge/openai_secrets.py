"""``POST /openai/v1/realtime/client_secrets``: OpenAI's ephemeral key, as this gateway's
client token.

The body is OpenAI's (``{"session": {...}, "expires_after": {"anchor": "created_at",
"seconds": N}}``); the session is made as ``POST /v1/sessions`` makes one, with the
configuration the OpenAI session names (``session.model`` routes it as ``?model=``
does), and the answer is OpenAI's (``{"value", "expires_at", "session"}``): ``value``
is a client token that opens that session, and nothing else, through
``/openai/v1/realtime`` (``Authorization: Bearer VALUE`` or the browser subprotocol
``openai-insecure-api-key.VALUE``). A token cannot change its session's configuration
(the gateway's rule for client tokens): ``session.update`` on such a connection is
refused, so the configuration goes here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Final, Literal, Protocol

import msgspec
from aiohttp import web

from gateway.config import Config
from gateway.sessions.port import NodePort
from gateway.upstream import providers
from protocol.configuration import ConfigChange, SessionConfig, apply_change
from protocol.openai_events import SessionBody
from protocol.openai_session import config_change, session_of

__all__ = ["OPENAI_CLIENT_SECRETS", "SessionMaker", "client_secret"]

OPENAI_CLIENT_SECRETS: Final = "/openai/v1/realtime/client_secrets"


class ExpiresAfter(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    anchor: Literal["created_at"] = "created_at"
    seconds: Annotated[int, msgspec.Meta(ge=10, le=7200)] = 600


class ClientSecretRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    session: SessionBody | None = None
    expires_after: ExpiresAfter | None = None


_decoder: Final = msgspec.json.Decoder(ClientSecretRequest)


class Minted(Protocol):
    @property
    def session_id(self) -> str: ...

    @property
    def client_token(self) -> str: ...

    @property
    def expires_at(self) -> float: ...


class SessionMaker(Protocol):
    """What this endpoint needs of the HTTP API (``gateway.edge.api.HttpApi``)."""

    config: Config
    node: NodePort

    async def _key_id(self, request: web.Request) -> str: ...

    async def _body(self, request: web.Request, decode: Callable[[bytes], Any]) -> Any: ...

    async def make_session(
        self,
        key_id: str,
        change: ConfigChange,
        ttl: float | None,
        *,
        approve: bool = False,
        configure: bool = False,
    ) -> Minted: ...


def _refusal(message: str, param: str | None = None) -> web.Response:
    error = {"type": "invalid_request_error", "code": None, "message": message, "param": param}
    return web.json_response({"error": error}, status=400)


async def client_secret(api: SessionMaker, request: web.Request) -> web.Response:
    key_id = await api._key_id(request)
    body: ClientSecretRequest = await api._body(request, _decoder.decode)
    session = body.session or SessionBody(type="realtime")
    if not session.model:
        return _refusal("name the model: session.model (e.g. gpt-realtime-2.1)", "session.model")
    aliases = api.node.policies.get(key_id).aliases
    route = providers.model_route(api.config.providers, session.model, aliases)
    if isinstance(route, str):
        return _refusal(route, "session.model")
    change = config_change(session, model_route=route)
    if isinstance(change, str):
        return _refusal(change, "session")
    ttl = float((body.expires_after or ExpiresAfter()).seconds)
    # OpenAI's ephemeral keys configure their session (the Agents SDKs send their agent's
    # session.update as they connect): within the key's policy, as an API key's would.
    minted = await api.make_session(key_id, change, ttl, configure=True)
    config = apply_change(SessionConfig(), change)
    assert not isinstance(config, str)  # make_session applied it
    return web.json_response(
        {
            "value": minted.client_token,
            "expires_at": int(minted.expires_at),
            "session": session_of(config, minted.session_id, session.model),
        },
        status=200,
    )
