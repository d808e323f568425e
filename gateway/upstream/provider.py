"""A provider as data: the row that says everything the gateway needs to serve it.

Each adapter module declares its row (``PROVIDER``) and ``gateway.upstream.
providers`` lists them; from the rows derive the ``--provider`` choices, the
settings (``--NAME-base-url``, ``NAME_API_KEY``… with the row's defaults and
words), the factories the node makes sessions' upstreams with, the
simulator's flavours (``sim``: how the simulator serves the row's wire as the
provider does), the model table (``models``) and the price table (each
model's ``price``, the row's ``price`` for any other model). A provider that speaks
another's wire with its own URL, headers and key variable is a new row whose
adapter is a small subclass.

Adapters receive their settings (``ProviderSettings``) and read no
environment: the node's settings are the one place a key comes from.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, cast

import msgspec

from gateway.common.settings import Setting
from gateway.upstream.base import CONTROLS, Upstream, UpstreamFactory
from gateway.upstream.models import ModelFacts, Price, find

__all__ = [
    "UPSTREAM_GROUP",
    "Connect",
    "ExtraSetting",
    "Provider",
    "ProviderFactory",
    "ProviderSettings",
    "SimFlavour",
    "Wire",
    "connect_with",
]

UPSTREAM_GROUP = "upstream"
"""The heading the providers' settings are listed under (``gateway settings``)."""

Wire = Literal["openai", "gemini"]
"""The wire protocols the gateway speaks: OpenAI Realtime's events, Gemini Live's."""


class ProviderSettings(msgspec.Struct, kw_only=True, frozen=True):
    """What every provider is given: where it is and the key it takes.

    A row's own Struct (``Provider.settings``) has these fields with the
    row's defaults and words, plus the row's ``extra`` settings.
    """

    base_url: str = ""
    api_key: str = ""


@dataclass(frozen=True, slots=True)
class ExtraSetting:
    """A setting of one provider beyond its URL and key (``--NAME-FIELD``)."""

    field: str
    type: Any
    default: Any
    help: str


@dataclass(frozen=True, slots=True)
class SimFlavour:
    """How the simulator serves a provider's wire as the provider does (``--sim-flavor``).

    On OpenAI's wire: ``base`` is the base URL's path (an adapter's base URL is
    the simulator's address + ``base``, the endpoint ``{base}/realtime``);
    ``auth`` how the key is sent; ``needs_model``: ``?model=`` must name a
    model (a deployment); ``flat``: sessions in xAI's flat shape; ``live``: it
    also serves GPT-Live at ``{base}/live/sessions``. Gemini's wire has one
    shape: a row on it takes ``SimFlavour()``.
    """

    base: str = ""
    auth: Literal["bearer", "api-key"] = "bearer"
    needs_model: bool = False
    flat: bool = False
    live: bool = False


Connect = Callable[["Provider", ProviderSettings, str], Upstream]
"""``(row, settings, model)`` → an unopened adapter for one connection."""


def connect_with(adapter: Callable[..., Upstream]) -> Connect:
    """The ``connect`` of a row whose adapter takes its settings as they are named:
    URL, key, model, the row's label and key variable (for its messages), and each
    of the row's ``extra`` settings as the keyword argument of the same name."""

    def connect(row: Provider, settings: ProviderSettings, model: str) -> Upstream:
        extras = {extra.field: getattr(settings, extra.field) for extra in row.extra}
        return adapter(
            base_url=settings.base_url,
            api_key=settings.api_key,
            model=model,
            label=row.label,
            key_variable=row.key_variable,
            **extras,
        )

    return connect


@dataclass(frozen=True, slots=True)
class Provider:
    """One provider: its name, wire, adapter and the facts its settings default to.

    - ``name``: the ``--provider`` value, the prefix of its settings, its
      label in metrics, traces and the price table;
    - ``label``: how messages name its API ("OpenAI Realtime");
    - ``wire``: the protocol its adapter speaks, and the simulator flavour
      family that stands in for it;
    - ``connect``: makes its adapter for one connection;
    - ``default_model``, ``base_url``: used when none is configured;
    - ``key_variable``: the conventional variable of its key (also read as
      its setting), named in every message about a refused key;
    - ``extra``: settings of its own beyond URL and key;
    - ``example_base_url``: shown when a provider with no default URL has none set;
    - ``model_is``: what its model setting names ("model", or Azure's "deployment");
    - ``controls``: the session controls (``CONTROLS``) its API documents; a
      session asking for another is refused with the provider's name;
      ``model_controls``: a model's own controls where its wire differs
      (OpenAI's GPT-Live models), None for the row's;
    - ``sim``: how the simulator stands in for it (None: it cannot, which a
      test refuses: every row is tested against its simulator flavour);
    - ``models``: the models it serves, with their facts and prices
      (``gateway.upstream.models``); ``price``: what any other model costs
      (None: unpriced, logged once).
    """

    name: str
    label: str
    wire: Wire
    connect: Connect
    default_model: str
    base_url: str
    key_variable: str
    extra: tuple[ExtraSetting, ...] = ()
    example_base_url: str = ""
    model_is: str = "model"
    controls: frozenset[str] = CONTROLS
    model_controls: Callable[[str], frozenset[str] | None] | None = None
    sim: SimFlavour | None = None
    models: tuple[ModelFacts, ...] = ()
    price: Price | None = None
    settings: type[ProviderSettings] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", _settings_struct(self))
        if any(model.wire != self.wire for model in self.models):
            on_wire = tuple(dataclasses.replace(m, wire=self.wire) for m in self.models)
            object.__setattr__(self, "models", on_wire)

    def facts(self, model: str) -> ModelFacts:
        """The facts of ``model`` as this row lists it (or its wire's assumption)."""
        return find(self.models, self.wire, model)

    def served(self, today: datetime.date | None = None) -> tuple[str, ...]:
        """The models it serves: every one it lists but those shut down by ``today``.

        A deprecated model (its shutdown announced, still ahead) is served, as
        its provider still serves it; the node logs the date once when it is
        used (``gateway.app``). Clients default to such models (LiveKit's
        plugin to ``gpt-realtime``), so refusing them early broke them.
        """
        day = today or datetime.date.today()
        return tuple(m.name for m in self.models if not m.shut_down_by(day))

    def factory(self, settings: ProviderSettings, model: str = "") -> ProviderFactory:
        """A factory of this provider's upstreams with ``settings`` and ``model``."""
        return ProviderFactory(self, settings, model or self.default_model)


def _settings_struct(row: Provider) -> type[ProviderSettings]:
    """The row's settings Struct: URL and key with the row's defaults, then its extras."""
    fields: list[tuple[str, Any, Any]] = [
        (
            "base_url",
            Annotated[str, Setting(f"{row.label} base URL", UPSTREAM_GROUP)],
            row.base_url,
        ),
        (
            "api_key",
            Annotated[
                str,
                Setting(f"{row.label} API key", UPSTREAM_GROUP, env=row.key_variable, secret=True),
            ],
            "",
        ),
    ]
    for extra in row.extra:
        fields.append(
            (extra.field, Annotated[extra.type, Setting(extra.help, UPSTREAM_GROUP)], extra.default)
        )
    name = "".join(part.title() for part in row.name.split("_")) + "Settings"
    struct = msgspec.defstruct(name, fields, bases=(ProviderSettings,), kw_only=True, frozen=True)
    return cast(type[ProviderSettings], struct)


class ProviderFactory(UpstreamFactory):
    """Makes one provider's adapters, all with the same settings and model."""

    def __init__(self, row: Provider, settings: ProviderSettings, model: str) -> None:
        self.row = row
        self.settings = settings
        self.provider = row.name
        self.model = model
        self.wire = row.wire
        own = row.model_controls(model) if row.model_controls is not None else None
        self.controls = row.controls if own is None else own

    def create(self) -> Upstream:
        return self.row.connect(self.row, self.settings, self.model)
