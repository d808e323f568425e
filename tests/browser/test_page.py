"""The page at ``/`` in a real Chromium against a real gateway subprocess.

Waits are on conditions in the page (``expect``, ``wait_for_function``), never
sleeps. Page-side conditions are written as functions (``() => …``):
Playwright evaluates a bare expression with ``eval``, which the page's CSP
rightly forbids.

``window.rtgw`` is the page's test hook: ``state``, ``sessionId``, ``lastSeq``,
``seqs`` (every logged seq applied, in order), ``connections``,
``turnRunning``, ``frames``, ``played`` and ``drop()``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, StartGateway
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"
)

TIMEOUT_MS = 15_000
SLOW = ("--sim-tokens-per-second", "20", "--sim-chunk-size", "1")
THINK = "The user said something."

# The last response block's text, or null before there is one.
RESPOND_TEXT = "() => { const r = [...document.querySelectorAll('.respond')].pop(); return r ? r.textContent : null; }"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # launch() gives every run a fresh temporary profile (user-data-dir) and deletes it on close.
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def console_allowed() -> list[str]:
    """Regexes of console errors a test expects (e.g. a refused handshake)."""
    return []


@pytest.fixture
def page(
    browser: Browser, console_allowed: list[str], start_gateway: StartGateway
) -> Iterator[Page]:
    """A fresh context (its own sessionStorage); fails the test on any other console error.

    It asks for ``start_gateway`` so the test's nodes are killed after the page
    closes: killed first, a page still open reconnects to a closed port and
    logs a refused connection that is no fault of the page.
    """
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error" and not any(re.search(p, msg.text) for p in console_allowed):
            problems.append(f"console: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    yield page
    context.close()
    # Script errors and CSP violations both land here.
    assert not problems, problems


def open_page(page: Page, node: NodeProcess, token: str = "") -> None:
    """Load the page: it connects by itself, or asks for the key when one is needed."""
    page.goto(f"{node.http}/")
    if token:
        card = page.locator(".key-card")  # asked where the conversation will be
        expect(card).to_contain_text("needs an API key")
        card.get_by_label("Key for this gateway").fill(token)
        card.get_by_role("button", name="Connect").click()
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    expect(page.locator("#state")).to_have_text("connected")


def send(page: Page, text: str) -> None:
    page.get_by_label("Message").fill(text)
    page.get_by_role("button", name="Send", exact=True).click()


def wait_turn_over(page: Page) -> None:
    page.wait_for_function("() => window.rtgw.lastSeq > 0 && !window.rtgw.turnRunning")


def respond_length_above(page: Page, at_least: int, below: int) -> int:
    """Wait until the response text is longer than ``at_least`` but shorter than ``below``."""
    handle = page.wait_for_function(
        f"([low, high]) => {{ const t = ({RESPOND_TEXT})(); "
        "return t !== null && t.length > low && t.length < high ? t.length : 0; }",
        arg=[at_least, below],
        polling="raf",
    )
    return int(handle.json_value())


def assert_contiguous(page: Page) -> None:
    seqs = page.evaluate("window.rtgw.seqs")
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert page.evaluate("window.rtgw.lastSeq") == len(seqs)


def test_a_turn_streams(page: Page, start_gateway: StartGateway) -> None:
    node = start_gateway("--sim-tokens-per-second", "20", "--sim-chunk-size", "2")
    open_page(page, node)
    send(page, "hello")
    expect(page.locator(".user .user-text")).to_have_text("hello")
    expect(page.get_by_role("button", name="Cancel", exact=True)).to_be_enabled()
    answer = "Echo: hello"
    # Two different partial lengths: the text grows token by token, not at the end.
    first = respond_length_above(page, 0, len(answer))
    respond_length_above(page, first, len(answer))
    expect(page.locator(".respond").last).to_have_text(answer)
    expect(page.locator(".think .text")).to_have_text(THINK)
    wait_turn_over(page)
    expect(page.get_by_role("button", name="Cancel", exact=True)).to_be_disabled()
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    expect(page.locator("#session-id")).to_have_text(page.evaluate("window.rtgw.sessionId"))
    expect(page.locator("#last-seq")).to_have_text(str(page.evaluate("window.rtgw.lastSeq")))
    assert_contiguous(page)


def test_a_tool_call_shows_call_result_and_answer(page: Page, start_gateway: StartGateway) -> None:
    node = start_gateway()
    open_page(page, node)
    send(page, '/tool list {"path": "."}')
    call = page.locator(".call")
    expect(call.locator(".call-head .tool-name")).to_have_text("list")
    expect(call.locator(".tool-args")).to_have_text('{"path":"."}')
    result = page.locator(".call .tool-item")
    expect(result).to_have_count(1)
    expect(result.locator(".tool-name")).to_have_text("list")
    expect(result.locator(".tool-status")).to_have_text("success")
    expect(page.locator(".respond")).to_have_text("The tool returned success.")
    wait_turn_over(page)
    # The model's overrun past </execute> (a made-up result) never reaches the page.
    expect(page.locator("#conversation")).not_to_contain_text("hallucinated")
    assert_contiguous(page)


def test_a_dropped_connection_resumes_with_no_missing_or_doubled_text(
    page: Page, start_gateway: StartGateway
) -> None:
    node = start_gateway(*SLOW)
    open_page(page, node)
    message = "resume me exactly, with every character in its place"
    answer = f"Echo: {message}"
    send(page, message)
    respond_length_above(page, 3, len(answer) - 10)
    page.evaluate("window.rtgw.drop()")
    page.wait_for_function(
        "() => window.rtgw.connections >= 2 && window.rtgw.state === 'connected'"
    )
    wait_turn_over(page)
    expect(page.locator(".respond")).to_have_count(1)
    assert page.evaluate(RESPOND_TEXT) == answer
    expect(page.locator(".think .text")).to_have_text(THINK)
    assert_contiguous(page)


def test_a_reload_mid_turn_replays_the_session(page: Page, start_gateway: StartGateway) -> None:
    node = start_gateway(*SLOW)
    open_page(page, node)
    sid = page.evaluate("window.rtgw.sessionId")
    send(page, "first turn")
    wait_turn_over(page)
    message = "a reload while this streams"
    send(page, message)
    respond_length_above(page, 3, 20)
    page.reload()
    # sessionStorage kept the session id: the page reconnects by itself, replays from 0.
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    assert page.evaluate("window.rtgw.sessionId") == sid
    wait_turn_over(page)
    expect(page.locator(".user .user-text")).to_have_text(["first turn", message])
    expect(page.locator(".respond")).to_have_text(["Echo: first turn", f"Echo: {message}"])
    assert_contiguous(page)


def test_cancel_stops_the_turn(page: Page, start_gateway: StartGateway) -> None:
    node = start_gateway(*SLOW)
    open_page(page, node)
    send(page, "a long message that takes a few seconds to echo back")
    expect(page.locator(".think .text")).not_to_have_text("")
    page.get_by_role("button", name="Cancel", exact=True).click()
    expect(page.locator(".marker.cancelled")).to_be_visible()
    wait_turn_over(page)
    expect(page.get_by_role("button", name="Cancel", exact=True)).to_be_disabled()
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    assert_contiguous(page)


def test_an_interrupt_discards_the_partial_step(page: Page, start_gateway: StartGateway) -> None:
    # The simulator drops every upstream connection after 4 deltas: each attempt
    # streams a partial think, the gateway sends interrupt and reruns the step,
    # and after its retries it gives up with an upstream error.
    node = start_gateway("--sim-drop-after", "4")
    open_page(page, node)
    send(page, "hello")
    expect(page.locator(".error")).to_contain_text("upstream")
    wait_turn_over(page)
    interrupts = page.locator(".marker.interrupt")
    assert interrupts.count() >= 1
    # Only the last attempt's partial output is left: one think block, no repeats.
    thinks = page.locator(".think .text")
    expect(thinks).to_have_count(1)
    text = thinks.text_content() or ""
    assert text and THINK.startswith(text), text
    assert_contiguous(page)


def _keys_file(tmp_path: Path, key: str) -> Path:
    auth = pytest.importorskip("gateway.edge.auth", reason="API keys are not in this tree yet")
    keys = tmp_path / "keys"
    keys.write_text(f"page-test:{auth.hash_key(key)}\n")
    return keys


def test_the_api_key_field_authenticates(
    page: Page, start_gateway: StartGateway, tmp_path: Path, console_allowed: list[str]
) -> None:
    console_allowed.append(r"WebSocket connection to .* failed")  # before the key is typed
    key = "rtgw_page-test-key"
    node = start_gateway("--api-keys-file", str(_keys_file(tmp_path, key)))
    open_page(page, node, token=key)
    send(page, "hello")
    expect(page.locator(".respond")).to_have_text("Echo: hello")
    # A reload resumes with the key kept for this tab.
    page.reload()
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    expect(page.locator(".respond")).to_have_text("Echo: hello")


def test_a_refused_connection_is_explained(
    page: Page, start_gateway: StartGateway, tmp_path: Path, console_allowed: list[str]
) -> None:
    console_allowed.append(r"WebSocket connection to .* failed")  # the browser logs each refusal
    node = start_gateway("--api-keys-file", str(_keys_file(tmp_path, "rtgw_right-key")))
    page.goto(f"{node.http}/")
    card = page.locator(".key-card")
    card.get_by_label("Key for this gateway").fill("rtgw_wrong-key")
    card.get_by_role("button", name="Connect").click()
    expect(card.locator(".key-refused")).to_contain_text("not accepted")
    assert page.evaluate("window.rtgw.connections") == 0


def test_a_key_is_asked_for_once_and_retries_stop(
    page: Page, start_gateway: StartGateway, tmp_path: Path, console_allowed: list[str]
) -> None:
    console_allowed.append(r"WebSocket connection to .* failed")
    node = start_gateway("--api-keys-file", str(_keys_file(tmp_path, "rtgw_right-key")))
    page.goto(f"{node.http}/")
    card = page.locator(".key-card")
    expect(card.locator("h2")).to_have_text("This gateway needs an API key")
    expect(card.get_by_label("Key for this gateway")).to_be_focused()
    expect(page.locator("#token-hint")).to_have_text("(required by this node)")
    expect(page.locator("#state")).to_have_text("disconnected")
    expect(page.get_by_role("button", name="Connect", exact=True)).to_be_enabled()
    assert page.evaluate("window.rtgw.connections") == 0


def test_first_hour_view(page: Page, start_gateway: StartGateway) -> None:
    node = start_gateway()
    page.goto(f"{node.http}/")
    # A welcome hint says what to type, and the page connected by itself.
    expect(page.locator(".welcome")).to_contain_text('/tool list {"path": "."}')
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    # Markdown in answers, safely: markup becomes elements, HTML stays text.
    send(page, "**bold** and `code` <img src=x onerror=alert(1)>")
    respond = page.locator(".respond")
    expect(respond.locator("strong")).to_have_text("bold")
    expect(respond.locator("code")).to_have_text("code")
    expect(respond).to_contain_text("<img src=x onerror=alert(1)>")
    assert page.locator(".respond img").count() == 0
    expect(page.locator(".welcome")).to_have_count(0)
    # Per-turn tokens and time to first token.
    expect(page.locator(".turn-stats")).to_contain_text("to first token")
    expect(page.locator(".turn-stats")).to_contain_text(re.compile(r"\d in · \d+ out"))
    # Tool results are collapsed to a line and expand to the whole result.
    send(page, '/tool list {"path": "."}')
    item = page.locator(".call .tool-item")
    expect(item).to_have_count(1)
    assert item.evaluate("(d) => d.open") is False
    item.locator("summary").click()
    assert item.evaluate("(d) => d.open") is True
    expect(item.locator(".tool-output")).to_be_visible()


def test_the_page_answers_its_confirm_tool_with_yes_or_no(
    page: Page, start_gateway: StartGateway
) -> None:
    node = start_gateway()
    open_page(page, node)
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    send(page, '/tool confirm {"question": "Delete the draft?"}')
    call = page.locator(".client-call")
    expect(call.locator(".call-head .tool-name")).to_have_text("confirm")
    expect(call.locator(".question-text")).to_have_text("Delete the draft?")
    call.get_by_role("button", name="Yes", exact=True).click()
    result = page.locator(".call .tool-item")
    expect(result.locator(".tool-status")).to_have_text("success")
    expect(page.locator(".respond")).to_have_text("The tool returned success.")
    wait_turn_over(page)
    expect(call.get_by_role("button", name="No", exact=True)).to_be_disabled()
    result.locator("summary").click()
    expect(result).to_contain_text("true")
    assert_contiguous(page)
