"""The user's audio held while a voice session's upstream opens (``HeldAudio``)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.sessions import voice
from gateway.sessions.voice import HeldAudio, VoiceInput
from gateway.upstream.base import AudioIn


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


def test_a_chunk_held_whole_is_kept_whole_while_newer_audio_fits_the_limit() -> None:
    """A recording's chunk is kept whole past the limit; audio of a microphone
    around it still keeps only its newest ``limit`` bytes, the whole one untouched."""
    held = HeldAudio(limit=50, whole_from=100)
    held.hold(b"a" * 30)
    held.hold(b"R" * 200, whole=True)
    held.hold(b"b" * 30)  # 60 bytes not whole: the oldest (a) goes
    assert (held.held, held.whole, held.dropped) == (230, 200, 30)
    assert held.take() == b"R" * 200
    assert held.whole == 0
    assert held.take() == b"b" * 30
    assert held.take() is None


def test_trim_lets_what_was_held_whole_go_to_the_limit() -> None:
    held = HeldAudio(limit=50, whole_from=100)
    held.hold(b"Q" * 100 + b"R" * 100, whole=True)
    held.trim()  # as if held as any audio: its newest part
    assert (held.held, held.whole, held.dropped) == (50, 0, 150)
    assert held.take() == b"R" * 50 and held.take() is None
    held.hold(b"S" * 40, whole=True)
    held.hold(b"t" * 20)
    held.trim()  # 60 not whole now: the oldest goes
    assert held.take() == b"t" * 20 and held.take() is None


class _Upstream:
    """An open upstream that records the audio it is sent."""

    def __init__(self) -> None:
        self.heard: list[bytes] = []

    def send_audio_now(self, pcm16: bytes) -> bool:
        self.heard.append(pcm16)
        return True

    async def send_audio(self, pcm16: bytes) -> None:
        self.heard.append(pcm16)


async def test_a_recordings_sender_waits_until_the_opened_upstream_has_it() -> None:
    """While the upstream opens, a second's chunk or more is held whole and its sender
    waits (``send_now`` declines it); once the upstream opens and the held audio is
    flushed, the sender goes on and the whole chunk was heard, after what came first."""
    rate = 8000
    mic = VoiceInput("s1", AudioIn(rate=rate))
    frame, recording = b"\x01\x00" * 160, b"\x02\x00" * rate * 30
    assert mic.send_now(None, frame)  # a microphone's frame: held, nothing awaited
    assert not mic.send_now(None, recording)  # a recording's: for ``send`` to hold and wait
    sending = asyncio.create_task(mic.send(None, recording))
    await asyncio.sleep(0)
    assert not sending.done()
    upstream = _Upstream()
    await asyncio.wait_for(mic.flush(upstream), 5)  # type: ignore[arg-type]
    await asyncio.wait_for(sending, 5)
    assert upstream.heard == [frame, recording]


async def test_past_its_wait_a_recording_keeps_only_its_newest_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An upstream that does not open within ``RECORDING_WAIT`` lets the sender go on,
    and the held recording is cut to the newest ``HELD_AUDIO_SECONDS``."""
    monkeypatch.setattr(voice, "RECORDING_WAIT", 0.05)
    rate = 8000
    mic = VoiceInput("s1", AudioIn(rate=rate))
    recording = bytes(range(256)) * (rate * 2 * 30 // 256)
    await asyncio.wait_for(mic.send(None, recording), 5)
    upstream = _Upstream()
    await asyncio.wait_for(mic.flush(upstream), 5)  # type: ignore[arg-type]
    limit = int(rate * voice.HELD_AUDIO_SECONDS) * 2
    assert upstream.heard == [recording[-limit:]]


async def test_a_recording_whose_sender_went_away_is_held_no_longer_whole() -> None:
    """The connection waiting for its recording to be sent closes: the recording is
    held as any audio then (its newest seconds), not kept whole for nobody."""
    rate = 8000
    mic = VoiceInput("s1", AudioIn(rate=rate))
    recording = bytes(range(256)) * (rate * 2 * 30 // 256)
    sending = asyncio.create_task(mic.send(None, recording))
    await asyncio.sleep(0)
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    upstream = _Upstream()
    await asyncio.wait_for(mic.flush(upstream), 5)  # type: ignore[arg-type]
    limit = int(rate * voice.HELD_AUDIO_SECONDS) * 2
    assert upstream.heard == [recording[-limit:]]


async def test_once_a_recording_waited_in_vain_its_next_slices_do_not_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 250 s append comes as 16 slices: once one waited ``RECORDING_WAIT`` for an
    upstream that did not open, the next go at once (held as a microphone's), not
    each after a wait of its own; after the next flush a recording waits again."""
    monkeypatch.setattr(voice, "RECORDING_WAIT", 0.05)
    rate = 8000
    mic = VoiceInput("s1", AudioIn(rate=rate))
    second = bytes(rate * 2)
    await asyncio.wait_for(mic.send(None, second), 5)  # waited in vain
    assert mic.send_now(None, second)  # held at once, not left for send to wait
    await asyncio.wait_for(mic.flush(_Upstream()), 5)  # type: ignore[arg-type]
    assert not mic.send_now(None, second)  # a recording waits again


def test_replayed_audio_goes_ahead_of_what_is_held_and_first_past_the_limit() -> None:
    """A replaced connection's unconsumed audio (``replay``) is held before newer audio,
    counted as ``replayed`` until taken or let go; a lone chunk past the room keeps its
    newest part."""
    held = HeldAudio(limit=50)
    held.hold(b"n" * 10, whole=True)
    held.replay([b"1" * 20, b"2" * 20])
    assert held.replayed == 40 and held.held == 50
    held.hold(b"3" * 20)  # 60 not whole: the oldest replayed goes
    assert held.replayed == 20 and held.dropped == 20
    assert held.take() == b"2" * 20 and held.replayed == 0
    assert [held.take(), held.take()] == [b"n" * 10, b"3" * 20]
    held.replay([b"4" * 80])
    assert held.replayed == 50 and held.dropped == 20 + 30
    assert held.take() == b"4" * 50
    held.replay([b"5" * 10])
    held.clear()
    assert held.replayed == 0
