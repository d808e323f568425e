"""Marks: what the caller heard, from the carrier's echoes."""

from __future__ import annotations

from gateway.phone.playback import Playback
from protocol.events import Played


def test_an_echo_reports_the_answer_up_to_its_chunk() -> None:
    playback = Playback()
    first = playback.sent(seq=7, ms=100)
    second = playback.sent(seq=8, ms=60)
    assert playback.playing
    assert playback.echoed(first) == Played(seq=7, ms=100)
    assert playback.echoed(second) == Played(seq=8, ms=160)
    assert not playback.playing
    assert playback.heard_ms == 160


def test_a_later_echo_means_the_earlier_chunks_played_too() -> None:
    playback = Playback()
    playback.sent(seq=1, ms=100)
    last = playback.sent(seq=2, ms=100)
    assert playback.echoed(last) == Played(seq=2, ms=200)
    assert playback.heard_ms == 200


def test_echoes_after_a_clear_are_not_playback() -> None:
    playback = Playback()
    heard = playback.sent(seq=1, ms=100)
    dropped = playback.sent(seq=2, ms=900)
    assert playback.echoed(heard) == Played(seq=1, ms=100)
    assert playback.clear() is True  # an answer was playing
    assert playback.echoed(dropped) is None  # the carrier echoes cleared marks at once
    assert playback.heard_ms == 100
    assert playback.clear() is False  # nothing left to drop


def test_each_answer_counts_its_own_ms_and_unknown_marks_are_ignored() -> None:
    playback = Playback()
    playback.echoed(playback.sent(seq=1, ms=300))
    playback.new_answer()
    assert playback.echoed(playback.sent(seq=5, ms=40)) == Played(seq=5, ms=40)
    assert playback.echoed("someone-else") is None
    assert playback.heard_ms == 340


def test_echoes_of_an_earlier_answer_count_as_heard_but_report_nothing() -> None:
    playback = Playback()
    playback.sent(seq=1, ms=300)
    late = playback.sent(seq=2, ms=300)  # still playing when the next turn begins
    playback.new_answer()
    assert playback.echoed(late) is None  # not a report on the new answer
    assert playback.heard_ms == 600
    assert playback.echoed(playback.sent(seq=9, ms=50)) == Played(seq=9, ms=50)
