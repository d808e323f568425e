"""A WebRTC call's conversation without a call: the answer's speech plays on the track
at once, and its played position counts from its first speech even when the
response's events wait for the user's turn to be logged."""

from __future__ import annotations

from typing import Any

from gateway.webrtc.connection import CallConversation
from protocol.events import SpeechStarted, SpeechStopped, User


class _Speaker:
    """Records what the conversation asks of the track."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def answer_started(self) -> None:
        self.calls.append("answer_started")

    def play(self, tag: int, pcm16: bytes) -> None:
        self.calls.append(f"play {tag}")

    def cut(self) -> None:
        self.calls.append("cut")


def test_speech_ahead_of_its_turn_plays_at_once_and_counts_from_its_start() -> None:
    speaker = _Speaker()
    conv = CallConversation("s1", "m", speaker, "c")  # type: ignore[arg-type]
    conv.gateway(SpeechStarted(seq=1, offset_ms=100))
    conv.gateway(SpeechStopped(seq=2, offset_ms=900))
    assert conv.audio(3, b"\x01\x00" * 480) == []  # its events wait for seq 3
    assert conv.audio(3, b"\x02\x00" * 480) == []
    shown: list[Any] = conv.gateway(User(seq=3, content="(speech 0.8 s)", source="audio"))
    kinds = [e["type"] for e in shown]
    assert "response.created" in kinds
    assert "response.output_audio.delta" not in kinds  # the speech is on the track
    # Played at once; counted from the first speech, not reset when the response
    # showed (a barge-in would have cut the provider's copy short).
    assert speaker.calls == ["cut", "answer_started", "play 3", "play 3"]
