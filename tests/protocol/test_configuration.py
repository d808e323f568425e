"""Session configuration: what a configure frame may set and how a change applies."""

from __future__ import annotations

from protocol.client_frames import decode_client
from protocol.configuration import (
    ClientToolSpec,
    ConfigChange,
    InputAudio,
    SessionConfig,
    apply_change,
    decode_config,
    encode_config,
)
from protocol.events import Configure, Error


def test_a_change_sets_only_its_fields() -> None:
    base = SessionConfig(instructions="be brief", model="m1")
    changed = apply_change(base, ConfigChange(tools=(ClientToolSpec(name="confirm"),)))
    assert isinstance(changed, SessionConfig)
    assert changed.instructions == "be brief" and changed.model == "m1"
    assert [t.name for t in changed.tools] == ["confirm"]


def test_bad_tool_sets_are_refused_with_the_reason() -> None:
    twice = ConfigChange(tools=(ClientToolSpec(name="a"), ClientToolSpec(name="a")))
    assert "declared twice" in str(apply_change(SessionConfig(), twice))
    not_object = ConfigChange(tools=(ClientToolSpec(name="a", parameters={"type": "string"}),))
    assert "type object" in str(apply_change(SessionConfig(), not_object))


def test_stored_form_round_trips_and_omits_defaults() -> None:
    config = SessionConfig(instructions="x", tools=(ClientToolSpec(name="t"),))
    data = encode_config(config)
    assert b"provider" not in data
    assert decode_config(data) == config
    assert decode_config(b"") == SessionConfig()


def test_configure_frames_decode_or_say_which_field_is_wrong() -> None:
    ok = decode_client(b'{"type": "configure", "instructions": "hi", "output": "audio"}')
    assert isinstance(ok, Configure) and ok.instructions == "hi"
    bad = decode_client(b'{"type": "configure", "tools": [{"name": "no spaces allowed"}]}')
    assert isinstance(bad, Error) and bad.code == "bad_frame" and "$.tools[0].name" in bad.content
    unknown = decode_client(b'{"type": "configure", "colour": "blue"}')
    assert (
        isinstance(unknown, Error)
        and "colour" in unknown.content
        and "instructions" in unknown.content
    )


def test_audio_controls_that_belong_to_another_turn_detection_are_refused() -> None:
    semantic = ConfigChange(input_audio=InputAudio(turn_detection="semantic_vad", eagerness="low"))
    assert isinstance(apply_change(SessionConfig(), semantic), SessionConfig)
    eager_server = ConfigChange(input_audio=InputAudio(eagerness="low"))
    assert "semantic_vad only" in str(apply_change(SessionConfig(), eager_server))
    idle_semantic = ConfigChange(
        input_audio=InputAudio(turn_detection="semantic_vad", idle_timeout_ms=5000)
    )
    assert "server_vad only" in str(apply_change(SessionConfig(), idle_semantic))


def test_truncation_and_reasoning_effort_decode_or_say_what_is_wrong() -> None:
    ok = decode_client(b'{"type": "configure", "truncation": 0.5, "reasoning_effort": "low"}')
    assert isinstance(ok, Configure) and ok.truncation == 0.5 and ok.reasoning_effort == "low"
    ratio = decode_client(b'{"type": "configure", "truncation": 1.5}')
    assert isinstance(ratio, Error) and "truncation" in ratio.content
    effort = decode_client(b'{"type": "configure", "reasoning_effort": "max"}')
    assert isinstance(effort, Error) and "reasoning_effort" in effort.content
    cleared = apply_change(
        SessionConfig(reasoning_effort="high"), ConfigChange(reasoning_effort=None)
    )
    assert isinstance(cleared, SessionConfig) and cleared.reasoning_effort is None
