"""What each realtime model can do, as the providers publish it: data, not guesses.

One row per model: how it answers (``text``: it can write text, so the text
protocol's markers are parsed from its output; ``audio``: it only speaks,
and a text session takes the transcript of its speech as the answer, its
thoughts as ``think`` and its native function calls as ``call``), whether
and how it thinks, and when it stops (or stopped) being served, with the
model the provider names as its replacement. The session's path is chosen
from here (``answers``), the simulator refuses what the real model refuses
from here, and a node refuses to start with a model that is shut down.

Facts and their sources are in docs/providers.md ("Models"); in short:
Google's deprecations page shut ``gemini-live-2.5-flash-preview`` and
``gemini-2.0-flash-live-001`` down on 2025-12-09 (replacement
``gemini-2.5-flash-native-audio-preview-12-2025``); today's Live models
(``gemini-3.8-live``, released 2026-09-15, and its extended-thinking
variant; the legacy ``gemini-3.1-flash-live-preview``; the 2.5 native-audio
previews) answer in audio only and close a TEXT setup. OpenAI's
``openai`` SDK marks ``gpt-realtime`` and ``gpt-realtime-mini`` deprecated,
shutting down on 2027-01-20; every Realtime model can answer in text.

A model not in the table gets its wire's assumption (``unknown``): Gemini
Live models answer in audio (every current one does), OpenAI-wire models in
text; the node logs that it is guessing.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["MODELS", "ModelFacts", "facts", "model_refusal", "model_warning"]

Answers = Literal["text", "audio"]
Thinking = Literal["none", "budget", "level"]


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """One model: how it answers, how it thinks, when it is (or was) shut down.

    - ``wire``: the provider wire it is served on (``openai`` or ``gemini``);
    - ``answers``: ``text`` or ``audio`` (see the module docstring);
    - ``thinking``: ``none`` (asking for thoughts is refused), ``budget``
      (``thinkingBudget``) or ``level`` (``thinkingLevel``); thoughts are
      asked for with ``includeThoughts`` where the model has them;
    - ``shutdown``: the date it stops (or stopped) being served, "" if none is
      announced; ``replacement``: the model the provider names instead;
    - ``text_refusal``: the close (code, reason) the service answers a TEXT
      setup with, for an audio-only model (what the simulator sends);
    - ``known``: False for the assumption made about a model not listed.
    """

    wire: str
    name: str
    answers: Answers
    thinking: Thinking = "none"
    shutdown: str = ""
    replacement: str = ""
    text_refusal: tuple[int, str] = (1007, "Cannot extract voices from a non-audio request.")
    known: bool = True

    def shut_down_by(self, today: datetime.date) -> bool:
        return bool(self.shutdown) and datetime.date.fromisoformat(self.shutdown) <= today


_NATIVE_AUDIO_2_5: Final = "gemini-2.5-flash-native-audio-preview-12-2025"

MODELS: Final[tuple[ModelFacts, ...]] = (
    # Gemini Live (Gemini Developer API).
    ModelFacts("gemini", "gemini-3.8-live", "audio"),
    ModelFacts("gemini", "gemini-3.8-live-extended-thinking", "audio", thinking="level"),
    ModelFacts(
        "gemini",
        "gemini-3.1-flash-live-preview",
        "audio",
        thinking="level",
        text_refusal=(1011, "Internal error encountered."),
    ),
    ModelFacts("gemini", _NATIVE_AUDIO_2_5, "audio", thinking="budget"),
    ModelFacts(
        "gemini", "gemini-2.5-flash-native-audio-preview-09-2025", "audio", thinking="budget"
    ),
    ModelFacts(
        "gemini",
        "gemini-live-2.5-flash-preview",
        "text",
        shutdown="2025-12-09",
        replacement=_NATIVE_AUDIO_2_5,
    ),
    ModelFacts(
        "gemini",
        "gemini-2.0-flash-live-001",
        "text",
        shutdown="2025-12-09",
        replacement=_NATIVE_AUDIO_2_5,
    ),
    # OpenAI Realtime (GA): every model writes text when asked (output_modalities ["text"]).
    ModelFacts("openai", "gpt-realtime-2.1", "text", thinking="level"),
    ModelFacts("openai", "gpt-realtime-2.1-mini", "text"),
    ModelFacts("openai", "gpt-realtime-2", "text", thinking="level"),
    ModelFacts("openai", "gpt-realtime-1.5", "text"),
    ModelFacts(
        "openai", "gpt-realtime", "text", shutdown="2027-01-20", replacement="gpt-realtime-2.1"
    ),
    ModelFacts(
        "openai",
        "gpt-realtime-2025-08-28",
        "text",
        shutdown="2027-01-20",
        replacement="gpt-realtime-2.1",
    ),
    ModelFacts(
        "openai",
        "gpt-realtime-mini",
        "text",
        shutdown="2027-01-20",
        replacement="gpt-realtime-2.1-mini",
    ),
    # GPT-Live (OpenAI's /v1/live/sessions wire, picked by the name): speech only, so a
    # text session takes the transcript of its speech as the answer.
    ModelFacts("openai", "gpt-live-1.1", "audio"),
    ModelFacts("openai", "gpt-live-1", "audio"),
    # xAI Grok Voice (OpenAI's event names, its own session shape).
    ModelFacts("openai", "grok-voice-think-fast-2.0", "text", thinking="level"),
    ModelFacts("openai", "grok-voice-think-fast-1.0", "text", thinking="level"),
    ModelFacts("openai", "grok-voice-latest", "text", thinking="level"),
    # The simulator's own model: a stand-in that writes text on either wire.
    ModelFacts("openai", "sim", "text"),
    ModelFacts("gemini", "sim", "text"),
)

_BY_KEY: Final = {(m.wire, m.name): m for m in MODELS}
_ASSUMED: Final = {
    "gemini": ModelFacts("gemini", "", "audio", known=False),
    "openai": ModelFacts("openai", "", "text", known=False),
}


def facts(wire: str, model: str) -> ModelFacts:
    """The facts of ``model`` on ``wire`` (``models/`` prefixes ignored), or the wire's assumption."""
    name = model.removeprefix("models/")
    found = _BY_KEY.get((wire, name))
    if found is not None:
        return found
    assumed = _ASSUMED.get(wire, _ASSUMED["openai"])
    return ModelFacts(wire, name, assumed.answers, text_refusal=assumed.text_refusal, known=False)


def model_refusal(provider: str, wire: str, model: str, today: datetime.date) -> str | None:
    """Why ``model`` cannot be served any more (shut down), naming its replacement; or None."""
    found = facts(wire, model)
    if not found.shut_down_by(today):
        return None
    instead = f"; use {found.replacement} instead" if found.replacement else ""
    return (
        f"{provider} model {found.name!r} was shut down on {found.shutdown}{instead} "
        f"(--model, or the model a session configures)"
    )


def model_warning(provider: str, wire: str, model: str, today: datetime.date) -> str | None:
    """A note worth logging about ``model``: its announced shutdown, or that it is not known."""
    found = facts(wire, model)
    if found.shutdown and not found.shut_down_by(today):
        instead = f"; move to {found.replacement}" if found.replacement else ""
        return (
            f"{provider} model {found.name!r} is deprecated: shutdown on {found.shutdown}{instead}"
        )
    if not found.known:
        return (
            f"{provider} model {found.name!r} is not in the gateway's model table: assuming it "
            f"answers in {found.answers} (gateway/upstream/models.py)"
        )
    return None
