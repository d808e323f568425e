"""The page's microphone and speaker in a real Chromium against a real gateway subprocess.

Chromium's fake capture device plays a WAV made here (silence, a tone, a long
silence: the simulator's VAD hears one spoken turn per loop of the file) in
place of a microphone, and grants the permission without a prompt. The page
sends the microphone as PCM16 binary frames; the simulator transcribes a
speech segment as ``(speech N s)`` and answers it.
"""

from __future__ import annotations

import re
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from gateway.common.pcm import silence, tone
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, StartGateway
from tests.browser.test_console import SHOTS
from tests.browser.test_page import RESPOND_TEXT, open_page, send

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"
)

TIMEOUT_MS = 20_000
RATE = 24000


def write_speech_wav(path: Path) -> None:
    """0.3 s of silence, 0.8 s of "speech" (a tone), then 6 s of silence, as 16-bit PCM."""
    pcm = silence(0.3, RATE) + tone(0.8, RATE) + silence(6.0, RATE)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    wav = tmp_path_factory.mktemp("mic") / "speech.wav"
    write_speech_wav(wav)
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


@pytest.fixture
def page(browser: Browser, start_gateway: StartGateway) -> Iterator[Page]:
    """A fresh context; fails the test on any console error (script errors, CSP).

    It depends on ``start_gateway`` so that it is torn down first: the page is closed
    (and its errors counted) while its gateway still runs, not after the gateway was
    killed under a page that then fails to reconnect."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            problems.append(f"console: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    yield page
    context.close()
    assert not problems, problems


@pytest.mark.timeout(90)
def test_speaking_into_the_microphone_starts_a_turn_that_is_answered(
    page: Page, start_gateway: StartGateway
) -> None:
    node = start_gateway()
    open_page(page, node)
    send(page, "typed first")
    expect(page.locator(".respond")).to_have_text("Echo: typed first")
    mic = page.get_by_role("button", name="Mic", exact=True)
    mic.click()
    expect(mic).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#voice-bar")).to_be_visible()
    page.wait_for_function("() => document.getElementById('mic-level').value > 0")

    # The spoken turn is heard in a turn of its own, never inside the previous one.
    pending = page.locator(".turn.pending .voice-pending")
    expect(pending).to_contain_text(re.compile("Listening…|Transcribing…"))
    expect(page.locator(".turn").first.locator(".voice-pending")).to_have_count(0)
    spoken = page.locator(".user.spoken .user-text").first
    expect(spoken).to_have_text(re.compile(r"\(speech \d+(\.\d)? s\)"))
    page.wait_for_function(f"() => ({RESPOND_TEXT})()?.length > 0")
    assert page.evaluate("window.rtgw.framesSent") > 10
    # Its latency counts from the end of the speech (speech_stopped), not from the
    # transcript's user event; no "first token" figure that means nothing here.
    stats = page.locator(".turn").nth(1).locator(".turn-stats")
    expect(stats).to_contain_text("after you stopped")
    expect(stats).not_to_contain_text("to first token")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "desktop-light-7-voice.png"), animations="disabled")

    mic.click()  # off: the microphone is released
    page.wait_for_function("() => !window.rtgw.mic")
    expect(mic).to_have_attribute("aria-pressed", "false")


@pytest.mark.timeout(90)
def test_the_speaker_plays_the_spoken_answer(page: Page, start_gateway: StartGateway) -> None:
    node = start_gateway()
    open_page(page, node)
    speaker = page.get_by_role("button", name="Speaker", exact=True)
    speaker.click()
    expect(speaker).to_have_attribute("aria-pressed", "true")
    page.get_by_role("button", name="Mic", exact=True).click()
    expect(page.locator(".user.spoken").first).to_be_visible()
    page.wait_for_function("() => window.rtgw.chunksPlayed > 0")
    page.wait_for_function(f"() => ({RESPOND_TEXT})()?.length > 0")
    # Playback is reported as `played`, and the inspector shows it going out.
    page.wait_for_function("() => window.rtgw.played && window.rtgw.played.ms > 0")
    expect(page.locator('.frame[data-type="played"]').first).to_be_attached()
    # An answer played to its end is reported to its end, not at the last tick before
    # it: speech after it must not cut what was heard in full.
    page.wait_for_function(
        "() => !window.rtgw.playing && window.rtgw.played"
        " && Math.abs(window.rtgw.played.ms - window.rtgw.answerMs) <= 1"
    )
