"""Voice input: a configuration's voice settings, and the user's audio sent, held or let go."""

from __future__ import annotations

import logging

import pytest

from gateway.sessions.voice import LISTEN_RETRY_CAP, VoiceInput, voice_config
from gateway.upstream.base import AudioIn, FunctionTool, UpstreamClosed, UpstreamFactory
from protocol.configuration import InputAudio, SessionConfig
from protocol.prompt import ToolSpec
from tests.sessions.fakes import ScriptedUpstream

pytestmark = pytest.mark.timeout(10)

TOOLS = [ToolSpec(name="read", description="read a file", parameters={"type": "object"})]
RATE = 16000


def test_a_text_session_asks_for_no_audio() -> None:
    assert voice_config(SessionConfig(), TOOLS) is None


def test_audio_in_only_keeps_the_text_protocol_and_its_tools_in_the_prompt() -> None:
    config = SessionConfig(input_audio=InputAudio(rate=RATE, turn_detection="none"))
    voice = voice_config(config, TOOLS)
    assert voice is not None
    assert voice.audio_in == AudioIn(rate=RATE, turn_detection="none")
    assert voice.audio_out is None and voice.tools == ()


def test_spoken_answers_declare_the_tools_natively() -> None:
    voice = voice_config(SessionConfig(output="audio", voice="alloy"), TOOLS)
    assert voice is not None and voice.audio_in is None
    assert voice.audio_out is not None and voice.audio_out.to_client
    assert voice.audio_out.voice == "alloy"
    assert voice.tools == (
        FunctionTool(name="read", description="read a file", parameters={"type": "object"}),
    )


def test_a_model_that_only_speaks_answers_a_text_session_in_audio_it_keeps() -> None:
    voice = voice_config(SessionConfig(), TOOLS, speaks_only=True)
    assert voice is not None and voice.audio_out is not None
    assert not voice.audio_out.to_client  # the transcript is the answer
    assert [t.name for t in voice.tools] == ["read"]


async def test_an_open_upstream_waiting_for_a_request_hears_nothing_until_the_flush() -> None:
    """A takeover's rerun: its request goes first, then what the user said meanwhile
    (a provider's VAD would answer held speech itself and refuse the rerun)."""
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    await voice.send(None, b"one")
    upstream = ScriptedUpstream()
    voice.hold_until_flush()
    assert voice.unflushed
    await voice.send(upstream, b"two")
    assert voice.send_now(upstream, b"three")
    assert upstream.audio == []
    await voice.flush(upstream)
    assert not voice.unflushed
    await voice.send(upstream, b"four")
    assert upstream.audio == [b"one", b"two", b"three", b"four"]


async def test_audio_is_held_while_the_upstream_opens_and_sent_first_in_order() -> None:
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    await voice.send(None, b"one")
    assert voice.send_now(None, b"two")  # held counts as taken
    upstream = ScriptedUpstream()
    await voice.flush(upstream)
    await voice.send(upstream, b"three")
    assert upstream.audio == [b"one", b"two", b"three"]
    await voice.flush(upstream)  # nothing held any more
    assert upstream.audio == [b"one", b"two", b"three"]


async def test_a_session_that_takes_no_audio_ignores_it() -> None:
    voice = VoiceInput("sid", None)
    upstream = ScriptedUpstream()
    await voice.send(upstream, b"x")
    assert not voice.send_now(upstream, b"x")
    assert upstream.audio == [] and voice.quiet_for(3600)


async def test_a_lost_connection_while_sending_is_left_to_the_driver() -> None:
    class Broken(ScriptedUpstream):
        async def send_audio(self, pcm16: bytes) -> None:
            raise UpstreamClosed("gone")

    voice = VoiceInput("sid", AudioIn(rate=RATE))
    await voice.send(Broken(), b"x")  # no exception: the driver's recv sees the loss
    assert not voice.quiet_for(60)


async def test_a_failed_open_backs_off_and_drops_the_audio_of_the_wait() -> None:
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    await voice.send(None, b"before")
    waits = [voice.listen_failed() for _ in range(8)]
    assert waits[0] == (True, 0.5)
    assert [first for first, _ in waits[1:]] == [False] * 7
    assert [delay for _, delay in waits] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert max(delay for _, delay in waits) == LISTEN_RETRY_CAP
    await voice.send(None, b"during the wait")  # the client was told it is not heard
    voice.listen_again()
    await voice.send(None, b"after")
    upstream = ScriptedUpstream()
    await voice.flush(upstream)
    assert upstream.audio == [b"after"]
    assert voice.listen_failed() == (True, 0.5)  # an open worked: the count starts again


async def test_another_rate_drops_the_audio_held_at_the_old_one() -> None:
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    await voice.send(None, b"kept")
    voice.reconfigure(AudioIn(rate=RATE, turn_detection="none"))  # same rate: kept
    await voice.send(None, b"more")
    voice.reconfigure(AudioIn(rate=24000))
    await voice.send(None, b"new rate")
    upstream = ScriptedUpstream()
    await voice.flush(upstream)
    assert upstream.audio == [b"new rate"]
    voice.reconfigure(None)
    assert not voice.send_now(None, b"text now")


async def test_a_stopped_input_holds_nothing() -> None:
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    voice.stop()
    await voice.send(None, b"late")
    upstream = ScriptedUpstream()
    await voice.flush(upstream)
    assert upstream.audio == []


async def test_audio_past_what_can_be_held_is_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A microphone's frames (100 ms here; a second's chunk is a recording's, held
    whole while its sender waits) past the hold's 5 s: the oldest go, said once."""
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    tenth = b"\x00" * (RATE * 2 // 10)
    with caplog.at_level(logging.WARNING, "gateway.sessions.runtime"):
        for _ in range(80):  # 8 s of audio, 5 s are held
            await voice.send(None, tenth)
    assert [r.getMessage() for r in caplog.records].count(
        "session sid: the upstream is still opening; only the newest 5s of the "
        "user's audio is held for it"
    ) == 1
    upstream = ScriptedUpstream()
    await voice.flush(upstream)
    assert len(upstream.audio) == 50


class _Factory(UpstreamFactory):
    def __init__(self, provider: str, controls: frozenset[str]) -> None:
        self.provider, self.wire, self.controls = provider, provider, controls

    def create(self) -> ScriptedUpstream:
        return ScriptedUpstream()


async def test_clear_drops_the_held_audio_and_the_providers_where_it_can() -> None:
    class Clearing(ScriptedUpstream):
        async def clear_audio(self) -> None:
            self.calls.append("clear_audio")

    voice = VoiceInput("sid", AudioIn(rate=RATE))
    await voice.send(None, b"held")
    assert await voice.clear(None, _Factory("openai", frozenset({"clear_audio"}))) is None
    upstream = Clearing()
    await voice.flush(upstream)
    assert upstream.audio == []  # what was held before the clear is never sent
    assert await voice.clear(upstream, _Factory("openai", frozenset({"clear_audio"}))) is None
    assert upstream.calls[-1] == "clear_audio"
    refused = await voice.clear(upstream, _Factory("gemini", frozenset()))
    assert refused is not None and "provider gemini cannot discard" in refused.content
    assert upstream.calls.count("clear_audio") == 1
    nothing = await VoiceInput("sid", None).clear(upstream, _Factory("openai", frozenset()))
    assert nothing is not None and nothing.code == "bad_frame"


async def test_an_upstream_that_does_not_hear_gets_no_audio() -> None:
    # Opened for a turn before the session took audio: speech meanwhile is not its.
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    upstream = ScriptedUpstream()
    await voice.send(upstream, b"one", hears=False)
    assert voice.send_now(upstream, b"two", hears=False)  # taken: dropped, not awaited
    assert upstream.audio == []
    await voice.flush(upstream)  # nothing was held for it either
    assert upstream.audio == []


async def test_a_replaced_connection_passes_on_what_it_had_not_consumed_in_order() -> None:
    """Sent since the provider last consumed (speech ended): held for the next connection
    ahead of audio held meanwhile; the offsets start that much earlier."""
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    old = ScriptedUpstream()
    await voice.send(old, b"a" * 320)  # 10 ms
    voice.consumed()  # the provider's speech ended: it is done with that
    await voice.send(old, b"b" * 320)
    await voice.send(old, b"c" * 320)
    assert voice.sent_ms == 30
    voice.replay_unconsumed()
    assert (voice.sent_ms, voice.opened_at_ms) == (30, 10)  # b and c go to the next one too
    await voice.send(None, b"d" * 320)  # held while it opens
    new = ScriptedUpstream()
    await voice.flush(new)
    assert new.audio == [b"b" * 320, b"c" * 320, b"d" * 320]
    assert voice.sent_ms == 40


async def test_unconsumed_audio_is_kept_half_a_second_or_five_while_speech_is_heard() -> None:
    frame = b"x" * (RATE // 50 * 2)  # 20 ms
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    upstream = ScriptedUpstream()
    for _ in range(100):  # 2 s
        await voice.send(upstream, frame)
    voice.replay_unconsumed()
    new = ScriptedUpstream()
    await voice.flush(new)
    assert len(new.audio) == 25  # the newest half second
    voice.speech_began()
    for _ in range(400):  # 8 s of speech
        await voice.send(new, frame)
    voice.replay_unconsumed()
    newest = ScriptedUpstream()
    await voice.flush(newest)
    assert len(newest.audio) == 250  # the newest 5 s


async def test_a_push_to_talk_buffer_is_kept_until_its_commit() -> None:
    frame = b"x" * (RATE // 50 * 2)
    voice = VoiceInput("sid", AudioIn(rate=RATE, turn_detection="none"))
    upstream = ScriptedUpstream()
    for _ in range(150):  # 3 s, not yet committed
        await voice.send(upstream, frame)
    voice.replay_unconsumed()
    new = ScriptedUpstream()
    await voice.flush(new)
    assert len(new.audio) == 150
    voice.consumed()  # the commit
    voice.replay_unconsumed()
    assert await _flushed(voice) == []


async def test_audio_at_another_rate_is_not_replayed() -> None:
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    await voice.send(ScriptedUpstream(), b"a" * 320)
    voice.reconfigure(AudioIn(rate=24000))
    voice.replay_unconsumed()
    assert await _flushed(voice) == []


async def _flushed(voice: VoiceInput) -> list[bytes]:
    upstream = ScriptedUpstream()
    await voice.flush(upstream)
    return upstream.audio


async def test_audio_replayed_to_a_new_connection_counts_once_in_the_sessions_audio() -> None:
    """What a replaced connection had not consumed is sent to the next (``replay_unconsumed``);
    the new one's offsets start where it hears from (``opened_at_ms``), and the session's
    audio counts each byte once whether it is sent again, cut to the limit, or cleared."""
    second = RATE * 2  # a second of PCM16
    voice = VoiceInput("sid", AudioIn(rate=RATE, turn_detection="none"))
    old = ScriptedUpstream()
    await voice.send(old, b"\x01" * second)
    await voice.send(old, b"\x02" * (8 * second))  # one chunk: a recording's slice
    assert voice.sent_ms == 9000
    voice.replay_unconsumed()  # only the slice is kept (the newest chunk past the bound)
    assert (voice.sent_ms, voice.opened_at_ms) == (9000, 4000)  # 5 s of it are held
    new = ScriptedUpstream()
    await voice.flush(new)
    assert sum(map(len, new.audio)) == 5 * second
    assert (voice.sent_ms, voice.opened_at_ms) == (9000, 9000)
    voice.replay_unconsumed()
    assert voice.opened_at_ms == 4000
    assert await voice.clear(None, _Factory("openai", frozenset({"clear_audio"}))) is None
    assert (voice.sent_ms, voice.opened_at_ms) == (9000, 9000)


async def test_speech_under_way_keeps_its_longer_bound_through_a_configure() -> None:
    """A configure of other voice settings (same rate) during speech: the speech so far
    is still kept up to five seconds for a connection replaced before it ends."""
    frame = b"x" * (RATE // 50 * 2)
    voice = VoiceInput("sid", AudioIn(rate=RATE))
    upstream = ScriptedUpstream()
    voice.speech_began()
    voice.reconfigure(AudioIn(rate=RATE, noise_reduction="far_field"), speech=True)
    for _ in range(150):  # 3 s of speech
        await voice.send(upstream, frame)
    voice.replay_unconsumed()
    assert len(await _flushed(voice)) == 150
