"""The providers the gateway speaks: one row each (``gateway.upstream.provider``).

Everything about a provider derives from this table: the ``--provider``
choices, its settings (``UpstreamSettings``: ``--openai-base-url``,
``OPENAI_API_KEY``…), the factories of sessions' upstreams, the simulator's
flavours (``--sim-flavor``, ``gateway.sim``), the model table (``MODELS``,
``facts``), the price table (``gateway.pricing``), the conformance suite's
cases, the defaults the docs show. To add a provider, give its adapter
module a ``PROVIDER`` row and list it here (docs/architecture.md, "Add a
provider").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated, Any, Final

import msgspec

from gateway.common.settings import Nested
from gateway.upstream import azure, gemini, openai, xai
from gateway.upstream.models import ModelFacts, find
from gateway.upstream.provider import Provider, ProviderSettings

__all__ = [
    "FLAVOURS",
    "MODELS",
    "NAMES",
    "PROVIDERS",
    "SIM",
    "ProviderList",
    "UpstreamSettings",
    "by_name",
    "default_models",
    "facts",
    "flavour_of",
    "listing",
    "model_route",
    "settings_of",
]

PROVIDERS: Final[tuple[Provider, ...]] = (
    openai.PROVIDER,
    gemini.PROVIDER,
    azure.PROVIDER,
    xai.PROVIDER,
)

SIM: Final = "sim"
"""The built-in simulator: speaks the wire of one provider (its flavour), in-process."""

NAMES: Final[tuple[str, ...]] = (SIM, *(row.name for row in PROVIDERS))
"""What ``--provider`` takes."""

_NAME = "(" + "|".join(NAMES) + ")"
ProviderList = Annotated[
    str,
    msgspec.Meta(
        pattern=f"^{_NAME}(,{_NAME})*$",
        description=f"one of {', '.join(NAMES)}, or several, comma-separated",
    ),
]
"""What ``--provider`` takes: one provider, or several in order of preference
("openai,gemini": fallback)."""

_BY_NAME: Final = {row.name: row for row in PROVIDERS}

FLAVOURS: Final[tuple[str, ...]] = tuple(row.name for row in PROVIDERS if row.sim is not None)
"""What ``--sim-flavor`` takes: every row the simulator stands in for."""

MODELS: Final[tuple[ModelFacts, ...]] = tuple(m for row in PROVIDERS for m in row.models)
"""Every model a row lists, with its wire."""


def facts(wire: str, model: str) -> ModelFacts:
    """The facts of ``model`` on ``wire`` (``models/`` prefixes ignored): as a row on that
    wire lists it (an Azure deployment named as an OpenAI model is that model), or the
    wire's assumption."""
    return find(MODELS, wire, model)


def listing(model: str) -> Provider | None:
    """The row that lists ``model`` (None: no row does)."""
    for row in PROVIDERS:
        if any(m.name == model for m in row.models):
            return row
    return None


def flavour_of(name: str) -> Provider:
    """The row the simulator serves as flavour ``name``; ``ValueError`` naming the
    flavours if it has none."""
    row = _BY_NAME.get(name)
    if row is None or row.sim is None:
        raise ValueError(f"no simulator flavour {name!r}: use {', '.join(FLAVOURS)}")
    return row


def by_name(name: str) -> Provider:
    """The row of ``name``; ``ValueError`` naming the choices if there is none."""
    row = _BY_NAME.get(name)
    if row is None:
        raise ValueError(f"no provider {name!r}: use {', '.join(NAMES)}")
    return row


def model_route(
    enabled: Collection[str], model: str, aliases: Mapping[str, str] | None = None
) -> tuple[str, str] | str:
    """``(provider, model)`` serving a client's ``model`` (the OpenAI door's ``?model=``,
    ``client_secrets``' ``session.model``) on a node of the ``enabled`` providers; a
    refusal naming the models otherwise.

    ``aliases``: the key's own model names (its policy's ``aliases``), resolved
    first. On a simulator node every model a provider lists is served by the
    simulator flavour of that provider (``gateway.app.sim_flavor_of``).
    """
    if aliases:
        model = aliases.get(model, model)
    row = listing(model)
    if row is None or model not in row.served():
        served = ", ".join(name for r in PROVIDERS for name in r.served())
        return f"model {model[:100]!r} is not served by this gateway; choose one of: {served}"
    if SIM in enabled:
        return SIM, model
    return row.name, model


def default_models() -> str:
    """Each provider's default model, as the docs show them."""
    return ", ".join(
        f"{row.default_model or 'your ' + row.model_is} ({row.name})" for row in PROVIDERS
    )


UpstreamSettings: Final[type[msgspec.Struct]] = msgspec.defstruct(
    "UpstreamSettings",
    [
        (
            row.name,
            Annotated[row.settings, Nested(row.name)],
            msgspec.field(default_factory=row.settings),
        )
        for row in PROVIDERS
    ],
    kw_only=True,
)
"""Every provider's settings, one nested Struct each (``Config.upstreams``)."""


def settings_of(upstreams: Any, name: str) -> ProviderSettings:
    """The settings of provider ``name`` in an ``UpstreamSettings``."""
    settings = getattr(upstreams, name)
    assert isinstance(settings, ProviderSettings)
    return settings
