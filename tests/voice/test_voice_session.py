"""Voice through a real gateway: spoken turns, barge-in, manual commit, audio out.

Each test runs against both simulator flavours (OpenAI Realtime and Gemini
Live) over real sockets: the client streams PCM16 at real-time pace (a tone
is "speech" to the simulator's VAD, and its transcript is ``(speech N s)``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.common.pcm import silence, tone
from gateway.sessions.asking import REOPEN_BURST, REOPEN_EVERY
from protocol.events import Cancelled, Configured, Error, SpeechStarted, SpeechStopped, User
from tests.voice.conftest import (
    VoiceClient,
    VoiceGateway,
    kind,
    shape,
    utterance,
    voice_gateway,
)

PROVIDERS = ["openai", "gemini"]
RATE = 24000
BARGE_IN_WITHIN = 5.0
"""Seconds from the speech's start to the cut: 0.3 s of silence and 0.1 s of speech make it
~0.4 s (tests/bench/barge_in_bench.py prints it), so over 10x; half the answer's 10 s."""


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_speech_is_a_turn_with_vad_events_and_a_transcript(
    provider: str, tmp_path: Path
) -> None:
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        configured = await client.configure(
            input_audio={"format": "pcm16", "rate": RATE, "turn_detection": "server_vad"}
        )
        assert isinstance(configured, Configured)
        assert configured.config.input_audio is not None
        await client.stream(utterance(1.2, RATE), RATE)
        events = await client.turn_end()
        await client.close()
    got = shape(events)
    assert got[:2] == [("speech_started", ""), ("speech_stopped", "")]
    assert got[2:] == [
        ("user", "(speech 1.2 s)"),
        ("think", "The user said something."),
        ("respond", "Echo: (speech 1.2 s)"),
        ("end", ""),
        ("metric", ""),
    ]
    user = next(e for e in events if isinstance(e, User))
    assert user.source == "audio"
    started = events[0]
    assert 250 <= started.offset_ms <= 350  # type: ignore[union-attr]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_audio_as_json_frames_at_another_rate(provider: str, tmp_path: Path) -> None:
    rate = 16000
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": rate})
        await client.stream(utterance(0.8, rate), rate, as_json=True)
        events = await client.turn_end()
        await client.close()
    assert ("user", "(speech 0.8 s)") in shape(events)
    assert kind(events[-2]) == "end"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_frames_of_an_odd_byte_count_are_heard_not_refused(
    provider: str, tmp_path: Path
) -> None:
    """PCM16 cut at odd byte counts (16 kHz, resampled): the connection stays, speech is heard."""
    rate = 16000
    pcm = utterance(0.8, rate)
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": rate})
        size = rate // 50 * 2 + 1
        for at in range(0, len(pcm), size):
            await client.ws.send(pcm[at : at + size])
            await asyncio.sleep(0.02)
        events = await client.turn_end()
        await client.close()
    assert ("user", "(speech 0.8 s)") in shape(events)
    assert not [e for e in events if isinstance(e, Error)], events


async def burst(client: VoiceClient, pcm: bytes, rate: int) -> None:
    """``pcm`` in 20 ms binary frames sent at once: it arrives before any upstream can open."""
    size = rate // 50 * 2
    for at in range(0, len(pcm), size):
        await client.ws.send(pcm[at : at + size])


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_speech_sent_while_the_upstream_opens_is_heard_whole(
    provider: str, tmp_path: Path
) -> None:
    """A client talks as soon as it has configured, and again right after a
    configure that reopens the upstream (another rate): none of it is lost."""
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.send({"type": "configure", "input_audio": {"rate": RATE}})
        await burst(client, tone(0.6, RATE) + silence(0.8, RATE), RATE)
        first = await client.turn_end()
        await client.send({"type": "configure", "input_audio": {"rate": 16000}})
        await burst(client, tone(0.9, 16000) + silence(0.8, 16000), 16000)
        second = await client.turn_end()
        await client.close()
    assert shape(first)[:4] == [
        ("configured", ""),
        ("speech_started", ""),
        ("speech_stopped", ""),
        ("user", "(speech 0.6 s)"),
    ]
    assert first[1].offset_ms == 0  # type: ignore[union-attr]
    assert shape(second)[:4] == [
        ("configured", ""),
        ("speech_started", ""),
        ("speech_stopped", ""),
        ("user", "(speech 0.9 s)"),
    ]
    assert shape(second)[-2:] == [("end", ""), ("metric", "")]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_configure_while_the_upstream_opens_is_what_it_hears_with(
    provider: str, tmp_path: Path
) -> None:
    """A session that speaks but does not hear yet opens its upstream to listen; the
    client turns its microphone on while that connection is still opening (a WebRTC
    call's first ``session.update`` does). Its speech is heard: the connection opened
    for the old setup is not the one the session keeps listening on."""
    async with voice_gateway(provider, tmp_path, link=True) as gw:
        assert gw.link is not None
        gw.link.held = True  # the provider's handshake waits in the network
        client = await VoiceClient.connect(gw.url)
        await client.configure(output="audio")
        await asyncio.wait_for(gw.link.accepted.wait(), 10)  # the listening upstream opens
        await client.configure(input_audio={"rate": RATE})
        gw.link.held = False
        await client.stream(utterance(0.6, RATE), RATE)
        events = await client.until("user", timeout=15)
        await client.close()
    assert [e.content for e in events if isinstance(e, User)] == ["(speech 0.6 s)"]


def _instructed(gw: VoiceGateway) -> list[tuple[bool, bool]]:
    """Per open provider connection: whether it was given instructions A, and B."""
    return [("AAA" in c.instructions, "BBB" in c.instructions) for c in gw.sim.conversations()]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("when", ["between turns", "during the answer"])
async def test_instructions_configured_in_a_spoken_session_answer_its_next_turn(
    provider: str, when: str, tmp_path: Path
) -> None:
    """The provider takes instructions when a connection opens, and a spoken turn is
    the provider's own (its VAD answers): new instructions (an Agents SDK handoff's
    session.update) reach the provider for the next spoken turn, whether they came
    between turns or while an answer ran."""
    # An answer of a few seconds (5 chunks a second), so a configure comes while it runs.
    async with voice_gateway(provider, tmp_path, tokens_per_second=5) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio", instructions="AAA")
        await client.stream(utterance(0.6, RATE), RATE)
        if when == "during the answer":
            await client.until("respond")
            await client.send({"type": "configure", "instructions": "BBB"})
            answer = await client.turn_end()
            assert "configured" in [kind(e) for e in answer], [kind(e) for e in answer]
        else:
            await client.turn_end()
            await client.configure(instructions="BBB")
        await client.stream(utterance(0.9, RATE), RATE)
        second = await client.turn_end()
        assert _instructed(gw) == [(False, True)]
        await client.close()
    assert ("user", "(speech 0.9 s)") in shape(second)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_speech_offsets_count_in_the_sessions_audio_across_a_new_connection(
    provider: str, tmp_path: Path
) -> None:
    """Two utterances (1.7 s of audio each, the tone 0.3 s in), a configure between them
    that gets a new provider connection: the second's offsets are where it is in all
    the audio the session was sent (OpenAI's ``audio_start_ms``: "from the start of
    all audio written to the buffer during the session"), not in the new connection's."""
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio", instructions="AAA")
        await client.stream(utterance(0.6, RATE), RATE)
        first = await client.turn_end()
        await client.configure(instructions="BBB")
        await client.stream(utterance(0.6, RATE), RATE)
        second = await client.turn_end()
        assert _instructed(gw) == [(False, True)]  # it was a new connection
        await client.close()
    [start1] = [e.offset_ms for e in first if isinstance(e, SpeechStarted)]
    [start2] = [e.offset_ms for e in second if isinstance(e, SpeechStarted)]
    [stop2] = [e.offset_ms for e in second if isinstance(e, SpeechStopped)]
    assert abs(start1 - 300) <= 60, start1
    assert abs(start2 - 2000) <= 60, start2
    assert stop2 > start2 + 600


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_configure_then_a_message_opens_one_connection(
    provider: str, tmp_path: Path
) -> None:
    """A listening session configured, then sent a message at once (the OpenAI door's
    ``response.create`` with instructions does both): the connection is replaced
    once, not opened for the new setup between turns and again for the message."""
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, instructions="AAA")
        await client.send({"type": "user", "content": "hello"})
        await client.turn_end()  # a connection is open and listening
        before = gw.sim.stats.connections_total
        await client.send({"type": "configure", "instructions": "BBB"})
        await client.send({"type": "user", "content": "hello again"})
        await client.turn_end()
        opened = gw.sim.stats.connections_total - before
        assert _instructed(gw) == [(False, True)]
        await client.close()
    assert opened == 1, f"{opened} connections opened for one configure"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_barge_in_after_a_configure_during_the_answer_is_heard_whole(
    provider: str, tmp_path: Path
) -> None:
    """Instructions configured during an answer, then the user speaks over it: the
    connection for the new setup waits until that speech is a turn, so the provider
    keeps hearing it from its start (a reopen as the cancelled turn ends lost it)."""
    async with voice_gateway(provider, tmp_path, tokens_per_second=20, chunk_size=2) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, instructions="AAA")
        await client.send({"type": "user", "content": "/raw " + "z" * 400})
        await client.until("respond")
        await client.send({"type": "configure", "instructions": "BBB"})
        await client.until("configured")
        sender = asyncio.create_task(client.stream(utterance(1.0, RATE), RATE))
        cut = await client.until("cancelled")
        answered = await client.turn_end()
        await sender
        await client.close()
    assert isinstance(cut[-1], Cancelled) and cut[-1].reason == "barge_in"
    got = shape(answered)
    assert [c for k, c in got if k == "user"] == ["(speech 1.0 s)"], got


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_configure_as_speech_starts_loses_none_of_it(provider: str, tmp_path: Path) -> None:
    """Instructions configured in the first 60 ms of an utterance, before the provider's
    VAD reports it: the connection opened for them is sent the audio the old one had
    not consumed, so the utterance is heard from its start (it was 0.9 s of 1.0)."""
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio", instructions="AAA")
        await client.stream(silence(0.4, RATE), RATE)  # a connection is open and hears
        speech = tone(1.0, RATE) + silence(0.8, RATE)
        start = round(RATE * 0.06) * 2
        await client.stream(speech[:start], RATE)
        await client.send({"type": "configure", "instructions": "BBB"})
        await client.stream(speech[start:], RATE)
        answered = await client.turn_end()
        assert _instructed(gw)[-1] == (False, True)  # answered by the new connection
        await client.close()
    got = shape(answered)
    assert [c for k, c in got if k == "user"] == ["(speech 1.0 s)"], got


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_push_to_talk_audio_sent_before_a_configure_is_committed_whole(
    provider: str, tmp_path: Path
) -> None:
    """Push-to-talk: 0.7 s of speech sent, instructions configured (a new connection),
    then the commit: the new connection was sent the uncommitted audio, so the turn
    is all of it (the provider's buffer went with the old connection)."""
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(
            input_audio={"rate": RATE, "turn_detection": "none"}, instructions="AAA"
        )
        await client.stream(silence(0.1, RATE) + tone(0.7, RATE), RATE)
        await client.configure(instructions="BBB")
        await client.send({"type": "commit"})
        events = await client.turn_end()
        assert _instructed(gw)[-1] == (False, True)
        await client.close()
    got = shape(events)
    assert got[0] == ("user", "(speech 0.7 s)"), got


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_flood_of_updates_opens_few_connections_and_the_last_setup_answers(
    provider: str, tmp_path: Path
) -> None:
    """21 configures that each change the instructions, as fast as the client gets
    their answers: a provider connection is opened for the first few at once, then at
    most one per ``REOPEN_EVERY`` (it was one per configure: a tenant's frames setting
    the pace of the deployment's connections to the provider), and the setup the
    client ended with answers its next utterance."""
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio", instructions="AAA")
        await client.stream(silence(0.2, RATE), RATE)  # a connection is open and hears
        before = gw.sim.stats.connections_total
        for index in range(21):  # BBB, AAA, ... BBB: the last open (AAA) is outdated
            await client.configure(instructions=("BBB", "AAA")[index % 2])
        flooded = gw.sim.stats.connections_total - before
        async with asyncio.timeout(REOPEN_EVERY * 4):
            while _instructed(gw)[-1] != (False, True):  # the last setup's connection
                await client.stream(silence(0.1, RATE), RATE)  # the microphone stays on
        await client.stream(utterance(0.6, RATE), RATE)
        answered = await client.turn_end()
        opened = gw.sim.stats.connections_total - before
        assert _instructed(gw)[-1] == (False, True)
        await client.close()
    assert flooded <= REOPEN_BURST + 1, flooded
    assert opened <= REOPEN_BURST + 2, opened
    assert ("user", "(speech 0.6 s)") in shape(answered)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_speech_offsets_after_a_recording_longer_than_what_a_new_connection_hears(
    provider: str, tmp_path: Path
) -> None:
    """Push-to-talk: an 8 s recording sent in one frame, instructions configured (a new
    connection: it is sent only the newest 5 s), the commit, then server VAD: the next
    utterance's offsets still count all 8 s the session was sent, not the 5 s replayed."""
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(
            input_audio={"rate": RATE, "turn_detection": "none"}, instructions="AAA"
        )
        await client.stream(silence(0.2, RATE), RATE)  # a connection is open and hears
        await client.ws.send(tone(8.0, RATE))  # one frame: a recording's slice
        await client.configure(instructions="BBB")
        await client.send({"type": "commit"})
        first = await client.turn_end()
        await client.configure(input_audio={"rate": RATE, "turn_detection": "server_vad"})
        await client.stream(utterance(0.6, RATE), RATE)
        second = await client.turn_end()
        await client.close()
    assert shape(first)[0] == ("user", "(speech 5.0 s)"), shape(first)
    [start] = [e.offset_ms for e in second if isinstance(e, SpeechStarted)]
    assert abs(start - 8500) <= 60, start


async def test_speech_offsets_after_a_clear_of_audio_held_for_a_new_connection(
    tmp_path: Path,
) -> None:
    """0.6 s of silence heard, instructions configured (a new connection, sent what the
    old one had not consumed), the buffer cleared before it heard it: the audio the
    session was sent still counts in the next utterance's offsets. OpenAI only: the
    Gemini flavour cannot clear."""
    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, instructions="AAA")
        await client.stream(silence(0.6, RATE), RATE)
        await client.send({"type": "configure", "instructions": "BBB"})
        await client.send({"type": "clear_audio"})
        await client.stream(utterance(0.6, RATE), RATE)
        events = await client.turn_end()
        assert _instructed(gw)[-1] == (False, True)
        await client.close()
    [start] = [e.offset_ms for e in events if isinstance(e, SpeechStarted)]
    assert abs(start - 900) <= 60, start


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_commit_right_after_held_audio_commits_all_of_it(
    provider: str, tmp_path: Path
) -> None:
    """Configure, speech and commit sent at once: the commit follows the held audio."""
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.send(
            {"type": "configure", "input_audio": {"rate": RATE, "turn_detection": "none"}}
        )
        await burst(client, tone(0.7, RATE), RATE)
        await client.send({"type": "commit"})
        events = await client.turn_end()
        await client.close()
    got = shape(events)
    assert got[:2] == [("configured", ""), ("user", "(speech 0.7 s)")]
    assert ("respond", "Echo: (speech 0.7 s)") in got
    assert got[-2:] == [("end", ""), ("metric", "")]


async def test_audio_before_configure_is_refused_once_not_per_frame(tmp_path: Path) -> None:
    """A microphone started too early gets one error, not fifty a second."""
    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await burst(client, tone(1.0, RATE), RATE)  # 50 frames, no input audio configured
        await client.send({"type": "ping"})
        before = await client.until("pong")
        await client.configure(input_audio={"rate": RATE})
        await client.stream(utterance(0.6, RATE), RATE)
        turn = await client.turn_end()
        await client.close()
    errors = [e for e in before if isinstance(e, Error)]
    assert len(errors) == 1
    assert errors[0].code == "bad_frame" and "configure" in errors[0].content
    assert ("user", "(speech 0.6 s)") in shape(turn)
    assert not any(isinstance(e, Error) for e in turn)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_speech_during_an_answer_cancels_it(provider: str, tmp_path: Path) -> None:
    async with voice_gateway(provider, tmp_path, tokens_per_second=20, chunk_size=2) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE})
        await client.send({"type": "user", "content": "/raw " + "z" * 400})
        await client.until("respond")  # the answer is running
        sender = asyncio.create_task(client.stream(utterance(0.5, RATE), RATE))
        began = time.monotonic()
        cut = await client.until("cancelled")
        cancelled_after = time.monotonic() - began
        answered = await client.turn_end()
        await sender
        await client.close()
    cancelled = cut[-1]
    assert isinstance(cancelled, Cancelled) and cancelled.reason == "barge_in"
    # In order: the speech was heard, then the answer cut, before it could end (its 400
    # characters take 10 s); tests/bench/barge_in_bench.py measures how soon (~0.4 s).
    kinds = [kind(e) for e in cut]
    assert "speech_started" in kinds and "end" not in kinds, kinds
    assert cancelled_after < BARGE_IN_WITHIN
    got = shape(answered)
    assert ("user", "(speech 0.5 s)") in got
    assert ("respond", "Echo: (speech 0.5 s)") in got
    assert got[-2:] == [("end", ""), ("metric", "")]


@pytest.mark.parametrize("output", ["text", "audio"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_speech_while_tools_run_cancels_the_turn_and_its_tools(
    provider: str, output: str, tmp_path: Path
) -> None:
    """A slow tool does not make the user wait: speech barges in while it runs
    (text protocol tools, and native function calls in audio output)."""
    shell = {"enable_shell": True}
    async with voice_gateway(provider, tmp_path, gateway_settings=shell, audio_ms_per_char=2) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output=output)
        await client.send({"type": "user", "content": '/tool shell {"command": "sleep 20"}'})
        await client.until("execute")  # the tool runs
        sender = asyncio.create_task(client.stream(utterance(0.5, RATE), RATE))
        began = time.monotonic()
        cut = await client.until("cancelled")
        cancelled_after = time.monotonic() - began
        answered = await client.turn_end()
        await sender
        await client.close()
    cancelled = cut[-1]
    assert isinstance(cancelled, Cancelled) and cancelled.reason == "barge_in"
    # In order: the speech was heard, then the turn cut while its 20 s tool ran.
    assert [kind(e) for e in cut][-2:] == ["speech_started", "cancelled"]
    assert "result" not in [kind(e) for e in cut]
    assert cancelled_after < BARGE_IN_WITHIN
    got = shape(answered)
    assert ("user", "(speech 0.5 s)") in got
    assert ("respond", "Echo: (speech 0.5 s)") in got
    assert got[-2:] == [("end", ""), ("metric", "")]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_manual_commit_ends_the_spoken_turn(provider: str, tmp_path: Path) -> None:
    async with voice_gateway(provider, tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE, "turn_detection": "none"})
        await client.stream(silence(0.1, RATE) + tone(0.7, RATE), RATE)
        await client.send({"type": "commit"})
        events = await client.turn_end()
        await client.close()
    got = shape(events)
    assert not any(name.startswith("speech_") for name, _ in got)
    assert got[0] == ("user", "(speech 0.7 s)")
    assert ("respond", "Echo: (speech 0.7 s)") in got
    assert got[-2:] == [("end", ""), ("metric", "")]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_audio_output_with_a_native_tool_call(provider: str, tmp_path: Path) -> None:
    async with voice_gateway(provider, tmp_path, chunk_size=4, audio_ms_per_char=5) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio", voice="alloy")
        await client.send({"type": "user", "content": '/tool list {"path": "."}'})
        events = await client.turn_end()
        await client.close()
    got = shape(events)
    assert got == [
        ("user", '/tool list {"path": "."}'),
        ("call", '{"name":"list","args":{"path":"."}}'),
        ("execute", ""),
        ("metric", ""),
        ("result", '[{"tool":"list","status":"success","content":{"path":".","entries":[]}}]'),
        ("respond", got[5][1]),
        ("end", ""),
        ("metric", ""),
    ]
    assert got[5][1].startswith("The tool list returned")
    assert client.audio, "no binary audio frames"
    respond_seqs = {e.seq for e in events if kind(e) == "respond"}
    assert {seq for seq, _ in client.audio} <= respond_seqs | {e.seq for e in events}
    assert all(len(pcm) % 2 == 0 for _, pcm in client.audio)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_spoken_answer_with_audio_output(provider: str, tmp_path: Path) -> None:
    async with voice_gateway(provider, tmp_path, audio_ms_per_char=10) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio")
        await client.stream(utterance(0.6, RATE), RATE)
        events = await client.turn_end()
        await client.close()
    got = shape(events)
    transcript = "Echo: (speech 0.6 s)"
    assert ("respond", transcript) in got
    played_ms = sum(len(pcm) // 2 for _, pcm in client.audio) * 1000 / 24000
    assert played_ms == pytest.approx(len(transcript) * 10, abs=25)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_reconnect_mid_answer_replays_the_transcript_without_a_gap(
    provider: str, tmp_path: Path
) -> None:
    async with voice_gateway(
        provider, tmp_path, tokens_per_second=40, chunk_size=2, audio_ms_per_char=10
    ) as gw:
        first = await VoiceClient.connect(gw.url)
        await first.configure(input_audio={"rate": RATE}, output="audio")
        await first.send({"type": "user", "content": "tell me a story " + "x" * 60})
        await first.until("respond")
        await first.until("respond")
        sid, last = first.session.session_id, first.events[-1].seq
        before = shape(first.events)
        await first.close()
        second = await VoiceClient.connect(gw.url, session_id=sid, after=str(last))
        rest = await second.turn_end()
        await second.close()
    seqs = [e.seq for e in rest]
    assert seqs == list(range(last + 1, last + 1 + len(seqs)))  # no gap, no duplicate
    told = before[-1][1] + "".join(c for n, c in shape(rest) if n == "respond")
    assert told == "Echo: tell me a story " + "x" * 60
    assert shape(rest)[-2:] == [("end", ""), ("metric", "")]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_background_native_call_is_answered_by_the_provider_when_done(
    provider: str, tmp_path: Path
) -> None:
    """A background tool in audio output: the turn ends at once; its output goes the
    provider's way when done (OpenAI: function_call_output, then response.create;
    Gemini: the NON_BLOCKING call's response, WHEN_IDLE) and the model speaks of it."""
    tools = tmp_path / "tools.toml"
    tools.write_text('[builtin]\nenable = ["shell"]\nbackground = ["shell"]\n')
    settings = {"tools_file": str(tools), "enable_shell": True}
    async with voice_gateway(
        provider, tmp_path, gateway_settings=settings, chunk_size=4, audio_ms_per_char=5
    ) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio", voice="alloy")
        command = '/tool shell {"command": "sleep 1; echo late"}'
        await client.send({"type": "user", "content": command})
        first = await client.turn_end()
        later = await client.turn_end()
        await client.close()
    assert [name for name, _ in shape(first)] == [
        "user", "call", "execute", "metric", "end", "metric"
    ]  # fmt: skip
    got = shape(later)
    assert got[0][0] == "result" and "late" in got[0][1]
    assert any(name == "respond" and "The tool shell returned" in text for name, text in got)
