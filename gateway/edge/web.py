"""The edge's side of the page: what this node offers it, and what other origins may read.

The page's files and their table are the console's (``gateway.console``); the
edge serves them through ``gateway.console.static_response``.

``/node.json`` tells the console what this node offers (its providers and their
models, whether it needs a key, where its HTTP API listens, the models its
OpenAI door serves), so the settings panel offers only what a ``configure``
can get.

Cross-origin apps import the client from the gateway (``/client.js`` and its
modules ``/errors.js``, ``/socket.js``;
``/client.d.ts``) and check it is up (``/healthz``): those answer with CORS
headers for the pages that may open a WebSocket here (``cors_origin``), so a
page learns nothing from them that its handshake would not tell it.
"""

from __future__ import annotations

from typing import Final

import msgspec
from websockets.http11 import Response

from gateway.config import Config
from gateway.console import page_response
from gateway.edge.admission import origin_allowed
from gateway.upstream import providers

__all__ = [
    "CORS_PATHS",
    "NODE_PATH",
    "NodeOffer",
    "ProviderOffer",
    "cors_origin",
    "node_response",
    "offer_of",
    "with_cors",
]

CORS_PATHS: Final = frozenset(
    {"/client.js", "/errors.js", "/socket.js", "/client.d.ts", "/healthz"}
)
"""What a page of another origin may read: the client library and liveness."""

NODE_PATH: Final = "/node.json"


# ---------------------------------------------------------------------- the node's offer


class ProviderOffer(msgspec.Struct, frozen=True):
    """One provider a session may pick: its default model and the models known for it."""

    name: str
    label: str
    default_model: str
    models: tuple[str, ...]
    wire: str


class NodeOffer(msgspec.Struct, frozen=True):
    """What ``/node.json`` says: the console's settings panel is built from it."""

    provider: str
    providers: tuple[ProviderOffer, ...]
    auth: bool
    api_port: int | None
    door_models: tuple[str, ...] = ()  # what ?model= of /openai/v1/realtime takes


def offer_of(config: Config, *, auth: bool) -> NodeOffer:
    """The node's offer: its own providers (first the default), then those with a key.

    ``sim`` is offered only by a node whose own provider it is (it runs in-process).
    """
    own = config.providers
    keyed = (row.name for row in providers.PROVIDERS if config.upstream(row.name).api_key)
    rows: list[ProviderOffer] = []
    names = [*own, *(n for n in keyed if n not in own)]
    # The OpenAI door routes a model to its provider's row (on a simulator node, to
    # that provider's simulator flavour: every model listed).
    door = [
        model
        for row in providers.PROVIDERS
        if providers.SIM in own or row.name in names
        for model in row.served()
    ]
    for name in names:
        if name == providers.SIM:
            flavor = config.sim.flavor
            label = f"built-in simulator ({flavor} wire)"
            rows.append(ProviderOffer(name, label, "sim", ("sim",), flavor))
            continue
        row = providers.by_name(name)
        rows.append(ProviderOffer(name, row.label, row.default_model, row.served(), row.wire))
    return NodeOffer(own[0], tuple(rows), auth, config.api_port, tuple(door))


def node_response(offer: NodeOffer) -> Response:
    return page_response(msgspec.json.encode(offer), "application/json")


# ---------------------------------------------------------------------- CORS


def cors_origin(origin: str | None, allowed: frozenset[str], *, auth_on: bool) -> str | None:
    """The ``Access-Control-Allow-Origin`` for a page of ``origin``, or None.

    The same rule as the WebSocket's (``origin_allowed``): ``--allowed-origins``
    when set; without it, loopback pages of an open node, any page of a node
    with keys. The node's own page is same-origin and needs no CORS.
    """
    if origin is None:
        return None
    normalized = origin.strip().rstrip("/").lower()
    if origin_allowed(normalized, allowed, auth_on=auth_on, local_address=None):
        return origin.strip()
    return None


def with_cors(response: Response, allow: str | None) -> Response:
    """``response`` with CORS headers for ``allow`` (an origin), unchanged for None."""
    response.headers["Vary"] = "Origin"
    if allow is not None:
        response.headers["Access-Control-Allow-Origin"] = allow
    return response
