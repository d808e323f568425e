"""A session's server VAD tuning in Gemini's ``setup`` (``realtimeInputConfig``),
checked against the ``google-genai`` SDK's own types: silence and padding as given,
OpenAI's loudness ``threshold`` as the nearest start sensitivity Gemini has."""

from __future__ import annotations

import msgspec
import pytest
from google.genai import types

from gateway.upstream import gemini_wire as wire
from gateway.upstream.base import AudioIn, VoiceConfig
from gateway.upstream.gemini_setup import LiveSettings


def detection_of(audio_in: AudioIn) -> types.AutomaticActivityDetection | None:
    setup = LiveSettings(voice=VoiceConfig(audio_in=audio_in)).setup("models/x", "", "")
    raw = msgspec.json.decode(wire.encode(wire.ClientMessage(setup=setup)))["setup"]
    if "realtimeInputConfig" not in raw:
        return None
    # The SDK's model (it sends it in ``setup``, from ``LiveConnectConfig``) forbids
    # fields it does not define.
    parsed = types.RealtimeInputConfig.model_validate(raw["realtimeInputConfig"])
    return parsed.automatic_activity_detection


@pytest.mark.parametrize(
    ("threshold", "sensitivity"),
    [
        (0.8, types.StartSensitivity.START_SENSITIVITY_LOW),  # louder speech only
        (0.2, types.StartSensitivity.START_SENSITIVITY_HIGH),
        (0.5, None),  # OpenAI's default: Gemini's own
        (None, None),
    ],
)
def test_tuning_is_sent_as_geminis_activity_detection(
    threshold: float | None, sensitivity: types.StartSensitivity | None
) -> None:
    found = detection_of(
        AudioIn(threshold=threshold, silence_duration_ms=900, prefix_padding_ms=200)
    )
    assert found is not None
    assert (found.silence_duration_ms, found.prefix_padding_ms) == (900, 200)
    assert found.start_of_speech_sensitivity == sensitivity
    assert not found.disabled


def test_no_tuning_sends_no_activity_detection_and_manual_turns_disable_it() -> None:
    assert detection_of(AudioIn()) is None
    manual = detection_of(AudioIn(turn_detection="none"))
    assert manual is not None and manual.disabled
