"""What each realtime model can do and costs, as the providers publish it: data, not guesses.

A provider's row (``gateway.upstream.provider.Provider``) carries its models
(``models``) and the price of any other model (``price``); the tables every
reader uses (``gateway.upstream.providers.MODELS``, ``facts``, the price
table) derive from the rows. Each model says how it answers (``text``: it can
write text, so the text protocol's markers are parsed from its output;
``audio``: it only speaks, and a text session takes the transcript of its
speech as the answer, its thoughts as ``think`` and its native function
calls as ``call``), whether and how it thinks, when it stops (or stopped)
being served, with the model the provider names as its replacement, and its
list price. The session's path is chosen from here (``answers``), the
simulator refuses what the real model refuses from here, and a node refuses
to start with a model that is shut down.

Facts and their sources are in docs/providers.md ("Models"). A model no row
lists gets its wire's assumption (``assumed``): Gemini Live models answer in
audio (every current one does), OpenAI-wire models in text; the node logs
that it is guessing. The simulator's own model (``sim``) writes text on
every wire.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import msgspec

from protocol.events import Usage

__all__ = [
    "SIM_MODEL",
    "ModelFacts",
    "Price",
    "assumed",
    "find",
    "model_refusal",
    "model_warning",
]

Answers = Literal["text", "audio"]
Thinking = Literal["none", "budget", "level"]

_PER_TOKEN: Final = 1e-6  # prices are per million tokens

USDPerMillion = Annotated[float, msgspec.Meta(ge=0)]


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """USD per million tokens; audio and cached prices default to the text ones.

    ``per_minute``: USD per minute of session time, for a model priced by duration
    (GPT-Live's active rate; ``Usage.seconds``).
    """

    input: USDPerMillion = 0.0
    output: USDPerMillion = 0.0
    cached_input: USDPerMillion | None = None
    audio_input: USDPerMillion | None = None
    audio_output: USDPerMillion | None = None
    per_minute: Annotated[float, msgspec.Meta(ge=0)] = 0.0

    def cost(self, usage: Usage) -> float:
        """USD for ``usage`` (cached and audio tokens at their own rates)."""
        cached = min(max(usage.cached, 0), usage.input)
        audio_in = min(max(usage.input_audio, 0), usage.input - cached)
        text_in = usage.input - cached - audio_in
        audio_out = min(max(usage.output_audio, 0), usage.output)
        text_out = usage.output - audio_out
        dollars = (
            text_in * self.input
            + cached * (self.input if self.cached_input is None else self.cached_input)
            + audio_in * (self.input if self.audio_input is None else self.audio_input)
            + text_out * self.output
            + audio_out * (self.output if self.audio_output is None else self.audio_output)
        )
        return dollars * _PER_TOKEN + usage.seconds / 60.0 * self.per_minute


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """One model: how it answers, how it thinks, when it is (or was) shut down, its price.

    - ``name``: as the provider names it;
    - ``answers``: ``text`` or ``audio`` (see the module docstring);
    - ``thinking``: ``none`` (asking for thoughts is refused), ``budget``
      (``thinkingBudget``) or ``level`` (``thinkingLevel``); thoughts are
      asked for with ``includeThoughts`` where the model has them;
    - ``shutdown``: the date it stops (or stopped) being served, "" if none is
      announced; ``replacement``: the model the provider names instead;
    - ``text_refusal``: the close (code, reason) the service answers a TEXT
      setup with, for an audio-only model (what the simulator sends);
    - ``price``: its list price (None: its row's ``price``, if any);
    - ``wire``: the wire it is served on (set by its row, ``openai`` or ``gemini``);
    - ``known``: False for the assumption made about a model not listed.
    """

    name: str
    answers: Answers
    thinking: Thinking = "none"
    shutdown: str = ""
    replacement: str = ""
    text_refusal: tuple[int, str] = (1007, "Cannot extract voices from a non-audio request.")
    price: Price | None = None
    wire: str = ""
    known: bool = True

    def shut_down_by(self, today: datetime.date) -> bool:
        return bool(self.shutdown) and datetime.date.fromisoformat(self.shutdown) <= today


SIM_MODEL: Final = ModelFacts("sim", "text")
"""The simulator's own model: a stand-in that writes text on either wire."""

_ASSUMED_ANSWERS: Final[dict[str, Answers]] = {"gemini": "audio", "openai": "text"}


def assumed(wire: str, model: str) -> ModelFacts:
    """What is assumed of ``model``, which no row lists: its wire's way of answering."""
    answers = _ASSUMED_ANSWERS.get(wire, "text")
    return ModelFacts(model, answers, wire=wire, known=False)


def find(models: Iterable[ModelFacts], wire: str, model: str) -> ModelFacts:
    """The facts of ``model`` (``models/`` prefix ignored) among ``models`` on ``wire``; the
    simulator's model; or the wire's assumption."""
    name = model.removeprefix("models/")
    for found in models:
        if found.name == name and found.wire == wire:
            return found
    if name == SIM_MODEL.name:
        return dataclasses.replace(SIM_MODEL, wire=wire)
    return assumed(wire, name)


def model_refusal(provider: str, found: ModelFacts, today: datetime.date) -> str | None:
    """Why model ``found`` cannot be served any more (shut down), naming its replacement;
    or None."""
    if not found.shut_down_by(today):
        return None
    instead = f"; use {found.replacement} instead" if found.replacement else ""
    return (
        f"{provider} model {found.name!r} was shut down on {found.shutdown}{instead} "
        f"(--model, or the model a session configures)"
    )


def model_warning(provider: str, found: ModelFacts, today: datetime.date) -> str | None:
    """A note worth logging about model ``found``: its announced shutdown, or that it is
    not known."""
    if found.shutdown and not found.shut_down_by(today):
        instead = f"; move to {found.replacement}" if found.replacement else ""
        return (
            f"{provider} model {found.name!r} is deprecated: shutdown on {found.shutdown}{instead}"
        )
    if not found.known:
        return (
            f"{provider} model {found.name!r} is not in the gateway's model table: assuming it "
            f"answers in {found.answers} (its provider row's models)"
        )
    return None
