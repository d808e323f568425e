"""The records events carry: token usage, dollars, a tool batch's counts, a phone call's figures.

Apart from the events (``protocol.events``, which names these too) because they
are the data, not the vocabulary: ``Usage`` is counted and added by the meter,
the limits and the recorder as much as it is sent in a ``metric``, and a new
event is not a new record. Plain msgspec Structs, untagged: they travel inside
an event, never alone.
"""

from __future__ import annotations

import msgspec

__all__ = ["Cost", "PhoneCallMetrics", "ResultPayload", "Usage"]


class Usage(msgspec.Struct, frozen=True, omit_defaults=True):
    """Token counts of one model step or of the whole session.

    ``cached`` and ``input_audio`` are parts of ``input``, ``output_audio`` a
    part of ``output``: providers price them differently. ``input`` and
    ``output`` are always on the wire; the parts only when not zero.
    ``seconds``: billable session time of a model priced by duration
    (GPT-Live), beside its (zero) tokens.
    """

    input: int
    output: int
    cached: int = 0
    input_audio: int = 0
    output_audio: int = 0
    seconds: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input=self.input + other.input,
            output=self.output + other.output,
            cached=self.cached + other.cached,
            input_audio=self.input_audio + other.input_audio,
            output_audio=self.output_audio + other.output_audio,
            seconds=self.seconds + other.seconds,
        )


class Cost(msgspec.Struct, frozen=True):
    """US dollars of one model step and of the whole session so far."""

    step: float = 0.0
    total: float = 0.0


class ResultPayload(msgspec.Struct, frozen=True):
    """A tool batch's ``result`` counts: the calls run, how many succeeded, how many failed."""

    tools_executed: int
    success_count: int
    failure_count: int


class PhoneCallMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """What one phone call was: measured by the gateway's phone edge.

    ``talk_ms``: the model's speech the caller heard (the carrier's playback
    reports); ``first_audio_ms``: for each answer, the caller's speech end
    (the provider's ``speech_stopped``) to the answer's first audio sent to
    the carrier; ``cost``/``usage``: what the session spent during the call.
    """

    duration_ms: int
    talk_ms: int
    barge_ins: int
    first_audio_ms: list[int]
    usage: Usage
    cost: float
