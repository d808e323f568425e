"""What a model step costs, in US dollars, from the provider's token usage.

Realtime APIs price text and audio tokens differently, and cached input far
below fresh input, so cost is computed per kind of token from the usage the
provider reports (``protocol.events.Usage``: ``cached``, ``input_audio`` and
``output_audio`` are parts of ``input`` and ``output``).

The built-in table holds list prices in USD per million tokens for the models
this gateway supports, as the providers' rows declare them
(``gateway.upstream.providers``: each model's ``price``, the row's ``price``
for its other models); providers change them, so an operator overrides or
extends it with a TOML file (``--prices-file FILE``)::

    [openai."gpt-realtime"]
    input = 4.0           # text input
    cached_input = 0.4
    output = 16.0         # text output
    audio_input = 32.0
    audio_output = 64.0

    [gemini."*"]          # any other Gemini model
    input = 0.5
    output = 2.0

A model missing from the table costs 0 and is logged once, so a bill is never
invented: Azure prices per region and contract, and xAI prices voice by the
minute, so their sessions are priced only from a prices file. Figures are as
published by the providers (OpenAI's read on 2026-12-03); check your contract.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from gateway.upstream.models import Price
from gateway.upstream.providers import PROVIDERS, SIM
from protocol.events import Usage

__all__ = ["DEFAULT_PRICES", "Price", "PriceTable", "PricesError", "load_prices"]

log = logging.getLogger("gateway.pricing")


class PricesError(ValueError):
    """A prices file the gateway cannot use; the message names the file, the entry and the fix."""


def _default_prices() -> dict[str, dict[str, Price]]:
    """The providers' rows' prices: each listed model's, and ``"*"`` for the rest."""
    table: dict[str, dict[str, Price]] = {}
    for row in PROVIDERS:
        models = {m.name: m.price for m in row.models if m.price is not None}
        if row.price is not None:
            models["*"] = row.price
        if models:
            table[row.name] = models
    # The simulator is free: its tokens are counted, never billed.
    table[SIM] = {"*": Price()}
    return table


DEFAULT_PRICES: Final[Mapping[str, Mapping[str, Price]]] = _default_prices()
"""The built-in table, from the providers' rows (``gateway.upstream.providers``)."""


class PriceTable:
    """Prices by provider and model, with ``"*"`` as a provider's fallback model."""

    def __init__(self, prices: Mapping[str, Mapping[str, Price]] = DEFAULT_PRICES) -> None:
        self._prices = {provider: dict(models) for provider, models in prices.items()}
        self._unpriced: set[tuple[str, str]] = set()

    def price(self, provider: str, model: str) -> Price | None:
        models = self._prices.get(provider, {})
        found = models.get(model) or models.get("*")
        if found is None and (provider, model) not in self._unpriced:
            self._unpriced.add((provider, model))
            log.warning(
                "no price for %s model %r: its steps cost 0 in metrics and budgets; add it "
                "to the prices file (--prices-file)",
                provider,
                model,
            )
        return found

    def cost(self, provider: str, model: str, usage: Usage) -> float:
        price = self.price(provider, model)
        return 0.0 if price is None else price.cost(usage)


def load_prices(path: str | Path) -> PriceTable:
    """The built-in table with the file's entries on top (see the module docstring)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PricesError(f"cannot read the prices file {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PricesError(f"the prices file {path} is not valid TOML: {exc}") from exc
    merged = {provider: dict(models) for provider, models in DEFAULT_PRICES.items()}
    for provider, models in raw.items():
        if not isinstance(models, dict):
            raise PricesError(
                f"{path}: [{provider}] must be a table of models, e.g. "
                f'[{provider}."MODEL"] with input = … and output = …'
            )
        for model, entry in models.items():
            try:
                price = msgspec.convert(entry, Price)
            except msgspec.ValidationError as exc:
                raise PricesError(
                    f"{path}: [{provider}.{model!r}] {exc}; prices are USD per million "
                    "tokens: input, output, cached_input, audio_input, audio_output"
                ) from exc
            merged.setdefault(provider, {})[model] = price
    return PriceTable(merged)
