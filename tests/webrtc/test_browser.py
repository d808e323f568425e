"""Chromium's own WebRTC stack (libwebrtc) calls a ``gateway serve`` node (its embedded
defaults) with the code of OpenAI's WebRTC guide: ``RTCPeerConnection``, a microphone
(Chromium's fake capture device playing a WAV: silence, a tone, silence), the
``oai-events`` channel, the offer posted as ``application/sdp``. It gets
``session.created``, its spoken turn and ``response.done`` on the channel, and the
answer's audio on the track (the inbound track's ``totalAudioEnergy``)."""

from __future__ import annotations

import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from gateway.common.pcm import silence, tone
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.support.agents_js import agents_js
from tests.support.procs import NodeProcess

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed"),
    pytest.mark.timeout(120),
]
RATE = 48000
MODEL = "gpt-realtime-2.1"

# OpenAI's guide, as a browser app runs it (only the URL is the gateway's).
CALL = """async (url) => {
  const pc = new RTCPeerConnection();
  window.pc = pc;
  window.events = [];
  const dc = pc.createDataChannel("oai-events");
  dc.addEventListener("message", (e) => window.events.push(JSON.parse(e.data)));
  dc.addEventListener("open", () => dc.send(JSON.stringify({type: "session.update",
    session: {type: "realtime", output_modalities: ["audio"]}})));
  const ms = await navigator.mediaDevices.getUserMedia({audio: true});
  pc.addTrack(ms.getTracks()[0]);
  await pc.setLocalDescription(await pc.createOffer());
  const r = await fetch(url, {method: "POST", body: pc.localDescription.sdp,
    headers: {"Content-Type": "application/sdp"}});
  const answer = await r.text();
  if (r.status !== 201) return {status: r.status, body: answer};
  await pc.setRemoteDescription({type: "answer", sdp: answer});
  return {status: r.status, location: r.headers.get("Location")};
}"""

RECEIVED = """async () => {
  let got = [0, 0];
  (await window.pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") got = [s.bytesReceived, s.packetsReceived];
  });
  return got;
}"""


def _payload(page: Page, seconds: float) -> float:
    """Mean Opus payload of the packets received over ``seconds``: speech takes tens of
    bytes a packet, the gateway's silence a few."""
    bytes0, packets0 = page.evaluate(RECEIVED)
    page.wait_for_timeout(seconds * 1000)
    bytes1, packets1 = page.evaluate(RECEIVED)
    assert packets1 > packets0, "no packets on the track"
    return float(bytes1 - bytes0) / (packets1 - packets0)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    proc = NodeProcess(
        ["serve", "--port", "0", "--workspace-root", str(tmp_path_factory.mktemp("ws"))],
        env={"REDIS_URL": "", "GATEWAY_API_KEYS_FILE": ""},
    )
    proc.start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    wav = tmp_path_factory.mktemp("mic") / "speech.wav"
    with wave.open(str(wav), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(silence(1.0, RATE) + tone(0.8, RATE) + silence(8.0, RATE))
    fake_mic = [
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=[*CHROMIUM_ARGS, *fake_mic]
        )
        yield browser
        browser.close()


def _until(page: Page, kind: str, timeout: float = 40.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events: list[dict[str, Any]] = page.evaluate("window.events")
        if any(e["type"] == kind for e in events):
            return events
        page.wait_for_timeout(100)
    raise AssertionError(f"no {kind} in {[e['type'] for e in page.evaluate('window.events')]}")


def test_chromium_calls_with_its_microphone_and_hears_the_answer(
    node: NodeProcess, browser: Browser
) -> None:
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{node.base.replace('ws://', 'http://')}/healthz")  # same origin as the API
        call = page.evaluate(CALL, f"/openai/v1/realtime/calls?model={MODEL}")
        assert call["status"] == 201, call
        assert call["location"].startswith("/openai/v1/realtime/calls/rtc_")
        _until(page, "session.created")
        quiet = _payload(page, 0.5)  # before the user spoke: the track's silence
        # The answer plays at real time from when it is generated, so the track is
        # watched from now on in half-second windows, not only after response.done:
        # on a loaded machine the whole answer had played by the time that was seen.
        speech = 0.0
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + 55
        while time.monotonic() < deadline:
            speech = max(speech, _payload(page, 0.5))
            events = page.evaluate("window.events")
            if speech > 10 * quiet and any(e["type"] == "response.done" for e in events):
                break
        kinds = [e["type"] for e in events]
        assert "response.done" in kinds, kinds
        assert kinds[0] == "session.created"
        assert "input_audio_buffer.speech_started" in kinds  # the microphone was heard
        assert "response.output_audio.delta" not in kinds
        assert [e for e in events if e["type"] == "response.done"][-1]["response"][
            "status"
        ] == "completed"
        # The spoken answer came on the track (292 against 3 here).
        assert speech > 10 * quiet, (speech, quiet)
    finally:
        context.close()


# agents-js's own WebRTC transport (the browser bundle of @openai/agents-realtime,
# pinned in tests/openai_door/js), as its voice-agent quickstart uses it.
AGENTS = """async ([url, model]) => {
  const R = window.OpenAIAgentsRealtime;
  const agent = new R.RealtimeAgent({name: "Assistant", instructions: "Answer briefly."});
  const transport = new R.OpenAIRealtimeWebRTC({baseUrl: url, useInsecureApiKey: true});
  const session = new R.RealtimeSession(agent, {transport, model});
  window.events = [];
  session.on("transport_event", (e) => window.events.push(e));
  await session.connect({apiKey: "any-key"});
  window.pc = transport.connectionState.peerConnection;
  session.sendMessage("/raw hello from agents-js");
  return {callId: transport.callId, status: transport.status};
}"""


@pytest.fixture(scope="module")
def bundle() -> Path:
    """agents-js's browser bundle, installed with ``npm ci`` as tests/openai_door does."""
    return (
        agents_js()
        / "node_modules/@openai/agents-realtime/dist/bundle/openai-realtime-agents.umd.js"
    )


def test_agents_js_webrtc_transport_has_a_turn(
    node: NodeProcess, browser: Browser, bundle: Path
) -> None:
    context = browser.new_context()
    page = context.new_page()
    try:
        base = node.base.replace("ws://", "http://")
        page.goto(f"{base}/healthz")
        page.add_script_tag(path=str(bundle))
        got = page.evaluate(AGENTS, [f"{base}/openai/v1/realtime/calls?model={MODEL}", MODEL])
        assert got["status"] == "connected" and got["callId"].startswith("rtc_"), got
        events = _until(page, "response.done")
        kinds = [e["type"] for e in events]
        assert "session.updated" in kinds  # agents-js's session.update was accepted
        assert "error" not in kinds, [e for e in events if e["type"] == "error"]
        done = [e for e in events if e["type"] == "response.done"][-1]
        assert done["response"]["status"] == "completed"
        text = "".join(e.get("delta", "") for e in events if e["type"].endswith(".delta"))
        assert "hello from agents-js" in text
    finally:
        context.close()
