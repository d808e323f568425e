"""WebRTC calls on the OpenAI door, with aiortc as the peer: a text turn on the
``oai-events`` channel, a spoken turn answered on the track, a barge-in that silences
the track at once, the loop never stalled by the media, and bad offers refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCRtpSender, RTCSessionDescription
from openai import AsyncOpenAI
from websockets.exceptions import InvalidStatus

from tests.openai_door.conftest import RawClient
from tests.voice.conftest import utterance, voice_gateway
from tests.webrtc.conftest import RATE, Peer

pytestmark = pytest.mark.timeout(90)
MODEL = "gpt-realtime-2.1"
AUDIO_SESSION = {
    "type": "realtime",
    "output_modalities": ["audio"],
    "audio": {"input": {"turn_detection": {"type": "server_vad"}}, "output": {"voice": "alloy"}},
}


def calls_url(ws_url: str) -> str:
    base = ws_url.replace("ws://", "http://").replace("/v1/realtime", "")
    return f"{base}/openai/v1/realtime/calls?model={MODEL}"


async def test_a_text_turn_on_the_data_channel(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw:
        peer = Peer()
        try:
            answer = await peer.call(calls_url(gw.url))
            assert answer.status == 201
            assert answer.headers["Content-Type"].startswith("application/sdp")
            assert peer.location.startswith("/openai/v1/realtime/calls/rtc_")
            await peer.until("session.created")
            peer.send(
                type="conversation.item.create",
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "/raw hello over webrtc"}],
                },
            )
            peer.send(type="response.create")
            events = await peer.until("response.done")
        finally:
            await peer.close()
    assert events[-1]["response"]["status"] == "completed"
    text = "".join(
        e["delta"]
        for e in events
        if e["type"] in ("response.output_text.delta", "response.output_audio_transcript.delta")
    )
    assert "hello over webrtc" in text


async def test_a_spoken_turn_is_answered_on_the_track_without_stalling_the_loop(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    stalls: list[float] = []

    async def watch() -> None:  # the gateway runs in this loop: its lag is the loop's
        while True:
            before = loop.time()
            await asyncio.sleep(0.01)
            stalls.append(loop.time() - before - 0.01)

    async with voice_gateway("openai", tmp_path) as gw:
        peer = Peer()
        watcher = asyncio.create_task(watch())
        try:
            assert (await peer.call(calls_url(gw.url))).status == 201
            await peer.until("session.created")
            peer.send(type="session.update", session=AUDIO_SESSION)
            await peer.until("session.updated")
            peer.mic.say(utterance(0.5, RATE))
            events = await peer.until("response.done")
            # The answer plays out at real time on the track, after generation ended.
            await peer.heard(11, timeout=20)
        finally:
            watcher.cancel()
            await peer.close()
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index(
        "input_audio_buffer.committed"
    )
    # The user's item before the response that answers it, as OpenAI orders them.
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    assert "response.output_audio_transcript.delta" in kinds
    assert "response.output_audio.delta" not in kinds  # the speech is on the track
    assert events[-1]["response"]["status"] == "completed"
    assert len(peer.loud) > 10  # more than 200 ms of the answer heard on the track
    # 2 cores shared by the whole team: a 20 ms frame's work must never hold the loop long.
    # Media on the loop would stall it for seconds; 1 s leaves a loaded 2-core machine
    # its margin (344 ms seen with the suite's other workers running).
    assert max(stalls) < 1.0, f"the loop stalled {max(stalls) * 1000:.0f} ms"


async def test_a_call_offering_only_pcmu_is_answered_in_pcmu_and_heard(tmp_path: Path) -> None:
    """A peer that offers G.711 μ-law alone (a SIP bridge's, a constrained device's)
    gets a PCMU answer, and its speech is heard and answered on the track."""
    async with voice_gateway("openai", tmp_path) as gw:
        peer = Peer()
        (transceiver,) = peer.pc.getTransceivers()
        codecs = RTCRtpSender.getCapabilities("audio").codecs
        transceiver.setCodecPreferences([c for c in codecs if c.mimeType == "audio/PCMU"])
        try:
            assert (await peer.call(calls_url(gw.url))).status == 201
            answer = peer.pc.remoteDescription.sdp
            assert "PCMU/8000" in answer and "opus" not in answer.lower()
            await peer.until("session.created")
            peer.send(type="session.update", session=AUDIO_SESSION)
            await peer.until("session.updated")
            peer.mic.say(utterance(0.5, RATE))
            events = await peer.until("response.done")
            await peer.heard(11, timeout=20)
        finally:
            await peer.close()
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.committed" in kinds
    assert events[-1]["response"]["status"] == "completed"


async def test_speech_over_the_answer_silences_the_track_at_once(tmp_path: Path) -> None:
    # A long answer, still generating while it plays.
    async with voice_gateway(
        "openai", tmp_path, tokens_per_second=20, chunk_size=2, audio_ms_per_char=60
    ) as gw:
        peer = Peer()
        try:
            assert (await peer.call(calls_url(gw.url))).status == 201
            await peer.until("session.created")
            peer.send(type="session.update", session=AUDIO_SESSION)
            await peer.until("session.updated")
            peer.send(
                type="conversation.item.create",
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "/raw " + "z" * 120}],
                },
            )
            peer.send(type="response.create")
            await peer.heard(25, timeout=20)  # 500 ms of the answer heard
            peer.mic.say(utterance(0.6, RATE))
            await peer.until("input_audio_buffer.speech_started")
            heard_at = time.monotonic()
            # The next answer cannot start before the user stops: the window ends there.
            await peer.until("input_audio_buffer.speech_stopped")
            stopped_at = time.monotonic()
            after = [t for t in peer.loud if heard_at + 0.5 < t < stopped_at]
        finally:
            await peer.close()
    # Nothing of the answer plays past 500 ms after the speech was detected.
    assert after == [], f"{len(after)} loud frames after the barge-in"
    heard = gw.sim.stats.truncations
    assert heard and heard[0] >= 400  # what went out on the track, not a client's report


async def test_bad_offers_are_refused_with_what_to_do(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw, aiohttp.ClientSession() as http:
        url = calls_url(gw.url)
        wrong_type = await http.post(url, data=b"{}", headers={"Content-Type": "text/plain"})
        assert wrong_type.status == 400
        assert "application/sdp" in (await wrong_type.json())["error"]["message"]
        not_sdp = await http.post(url, data=b"hello", headers={"Content-Type": "application/sdp"})
        assert not_sdp.status == 400
        huge = await http.post(
            url, data=b"v=0\r\n" + b"a" * 70_000, headers={"Content-Type": "application/sdp"}
        )
        assert huge.status == 413
        model = await http.post(
            url.replace(MODEL, "nope"), data=b"v=0\r\n", headers={"Content-Type": "application/sdp"}
        )
        assert (await model.json())["error"]["code"] == "model_not_found"


async def test_the_apps_server_joins_the_call_with_call_id(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw:
        peer = Peer()
        try:
            assert (await peer.call(calls_url(gw.url))).status == 201
            await peer.until("session.created")
            call_id = peer.location.rsplit("/", 1)[-1]
            door = gw.url.replace("/v1/realtime", "/openai/v1/realtime")
            side = await RawClient.open(f"{door}?call_id={call_id}")
            try:
                await side.say("/raw from the app's server")
                done = (await side.until("response.done"))[-1]
                seen = await peer.until("response.done")  # the browser sees the same turn
            finally:
                await side.close()
            with pytest.raises(InvalidStatus) as refused:
                await RawClient.open(f"{door}?call_id=rtc_nope")
            assert refused.value.response.status_code == 404
        finally:
            await peer.close()
    assert done["response"]["status"] == "completed"
    assert "from the app's server" in "".join(
        e.get("delta", "")
        for e in seen
        if e["type"].endswith("transcript.delta") or e["type"] == "response.output_text.delta"
    )


async def test_output_audio_buffer_clear_silences_the_track(tmp_path: Path) -> None:
    # agents-js's interrupt(): response.cancel and output_audio_buffer.clear, which on
    # WebRTC is the gateway's buffer: the track goes quiet, the heard part is kept.
    async with voice_gateway(
        "openai", tmp_path, tokens_per_second=20, chunk_size=2, audio_ms_per_char=60
    ) as gw:
        peer = Peer()
        try:
            assert (await peer.call(calls_url(gw.url))).status == 201
            await peer.until("session.created")
            peer.send(type="session.update", session=AUDIO_SESSION)
            await peer.until("session.updated")
            peer.send(
                type="conversation.item.create",
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "/raw " + "z" * 120}],
                },
            )
            peer.send(type="response.create")
            await peer.heard(25, timeout=20)
            peer.send(type="response.cancel")
            peer.send(type="output_audio_buffer.clear")
            cleared_at = time.monotonic()
            done = (await peer.until("response.done"))[-1]
            await asyncio.sleep(1.5)
            # Quiet within 500 ms on an idle machine; a frame already on its way when
            # the clear came can be decoded later under the suite's load (one was, at
            # +0.5 s): the margin is a loaded machine's, the silence after it is total.
            after = [t for t in peer.loud if t > cleared_at + 1.0]
        finally:
            await peer.close()
    assert done["response"]["status"] == "cancelled"
    assert after == [], f"{len(after)} loud frames after the clear"
    assert gw.sim.stats.truncations and gw.sim.stats.truncations[0] >= 400


async def test_a_call_offered_again_resumes_its_session(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw:
        first = Peer()
        try:
            assert (await first.call(calls_url(gw.url))).status == 201
            created = (await first.until("session.created"))[-1]
            sid = created["session"]["id"]
            first.send(
                type="conversation.item.create",
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "/raw the first call"}],
                },
            )
            first.send(type="response.create")
            last = (await first.until("response.done"))[-1]["event_id"]
        finally:
            await first.close()  # the call is gone; the session is not
        again = Peer()
        try:
            url = f"{calls_url(gw.url)}&session_id={sid}&after_event={last}"
            assert (await again.call(url)).status == 201
            again.send(
                type="conversation.item.create",
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "/raw the second call"}],
                },
            )
            again.send(type="response.create")
            events = await again.until("response.done")
            again.mic.say(utterance(0.5, RATE))  # the resumed call's microphone is heard
            spoken = await again.until("response.done")
        finally:
            await again.close()
    assert "input_audio_buffer.speech_started" in [e["type"] for e in spoken]
    kinds = [e["type"] for e in events]
    assert "session.created" not in kinds  # nothing it saw is sent again
    text = "".join(e.get("delta", "") for e in events if e["type"].endswith(".delta"))
    assert "the second call" in text and "the first call" not in text
    assert events[-1]["response"]["status"] == "completed"


async def test_a_peer_that_never_connects_is_dropped_and_calls_are_capped(
    tmp_path: Path,
) -> None:
    settings = {"webrtc_connect_timeout": 1.0, "webrtc_max_calls": 1}
    async with voice_gateway("openai", tmp_path, gateway_settings=settings) as gw:
        silent = Peer()  # posts its offer, never applies the answer: no ICE, no channel
        await silent.pc.setLocalDescription(await silent.pc.createOffer())
        async with aiohttp.ClientSession() as http:
            headers = {"Content-Type": "application/sdp"}
            offer = silent.pc.localDescription.sdp
            first = await http.post(calls_url(gw.url), data=offer, headers=headers)
            assert first.status == 201
            call_id = first.headers["Location"].rsplit("/", 1)[-1]
            second = await http.post(calls_url(gw.url), data=offer, headers=headers)
            assert second.status == 429  # one call a node, as configured
            assert (await second.json())["error"]["code"] == "busy"
            door = gw.url.replace("/v1/realtime", "/openai/v1/realtime")
            async with asyncio.timeout(10):  # dropped after its 1 s to connect
                while True:
                    try:
                        side = await RawClient.open(f"{door}?call_id={call_id}")
                    except InvalidStatus as exc:
                        assert exc.response.status_code == 404
                        break
                    await side.close()
                    await asyncio.sleep(0.2)
            third = await http.post(calls_url(gw.url), data=offer, headers=headers)
            assert third.status == 201  # its place is free again
        await silent.close()


async def test_the_openai_sdk_creates_a_call_with_a_session(tmp_path: Path) -> None:
    # openai-python's client.realtime.calls.create(sdp=…, session=…), unmodified.
    async with voice_gateway("openai", tmp_path) as gw:
        base = gw.url.replace("ws://", "http://").replace("/v1/realtime", "/openai/v1")
        client = AsyncOpenAI(api_key="any", base_url=base)
        peer = Peer()
        try:
            await peer.pc.setLocalDescription(await peer.pc.createOffer())
            raw = await client.realtime.calls.with_raw_response.create(
                sdp=peer.pc.localDescription.sdp,
                session={"type": "realtime", "model": MODEL, "instructions": "Be brief."},
            )
            assert raw.status_code == 201
            assert raw.headers["location"].startswith("/openai/v1/realtime/calls/rtc_")
            answer = raw.parse().content.decode()
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await asyncio.wait_for(peer.open.wait(), 20)
            events = await peer.until("session.updated")  # the session part, applied
        finally:
            await peer.close()
            await client.close()
    assert events[-1]["session"]["instructions"] == "Be brief."


async def test_a_responses_instructions_on_the_data_channel_are_its_own(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path) as gw:
        peer = Peer()
        try:
            await peer.call(calls_url(gw.url))
            await peer.until("session.created")
            said: list[str] = []
            for response in ({"instructions": "Pirate talk."}, None):
                item = {"type": "input_text", "text": "/instructions"}
                peer.send(
                    type="conversation.item.create",
                    item={"type": "message", "role": "user", "content": [item]},
                )
                peer.send(type="response.create", **({"response": response} if response else {}))
                events = await peer.until("response.done")
                said.append(
                    "".join(
                        e["delta"]
                        for e in events
                        if e["type"]
                        in ("response.output_text.delta", "response.output_audio_transcript.delta")
                    )
                )
        finally:
            await peer.close()
    # The override was that response's only (the call's session has its own back).
    assert "Pirate talk." in said[0] and "Pirate talk." not in said[1]
