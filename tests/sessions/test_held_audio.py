"""The user's audio held while a voice session's upstream opens (``HeldAudio``)."""

from __future__ import annotations

from gateway.sessions.voice import HeldAudio


def test_audio_comes_back_in_the_order_it_was_held() -> None:
    held = HeldAudio(limit=100)
    for chunk in (b"a" * 10, b"b" * 20, b"c" * 30):
        held.hold(chunk)
    assert held.held == 60
    assert [held.take(), held.take(), held.take(), held.take()] == [
        b"a" * 10,
        b"b" * 20,
        b"c" * 30,
        None,
    ]
    assert held.held == 0


def test_past_its_limit_the_oldest_audio_goes_first() -> None:
    held = HeldAudio(limit=50)
    for chunk in (b"1" * 20, b"2" * 20, b"3" * 20, b"4" * 20):
        held.hold(chunk)
    assert held.dropped == 40
    assert held.held == 40
    assert held.take() == b"3" * 20
    assert held.take() == b"4" * 20
    held.clear()
    assert held.dropped == 0 and held.take() is None


def test_a_chunk_larger_than_the_room_keeps_its_newest_part() -> None:
    """A recording's 16 s slice held while the upstream opens: its newest 5 s are
    kept (a chunk past the limit used to be let go whole, and nothing was heard)."""
    held = HeldAudio(limit=50)
    held.hold(b"0" * 10)
    held.hold(b"1" * 40 + b"2" * 30)
    assert held.held == 50
    assert held.dropped == 10 + 20
    assert held.take() == b"1" * 20 + b"2" * 30
    assert held.take() is None


def test_room_is_counted_in_seconds_of_pcm16_at_the_rate() -> None:
    assert HeldAudio.for_rate(24000, seconds=2.0).limit == 24000 * 2 * 2
    assert HeldAudio.for_rate(16000).limit == 16000 * 2 * 5
