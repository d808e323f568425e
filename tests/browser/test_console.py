"""The console in a real Chromium at desktop (1280×800) and phone (390×844) sizes.

Besides what each test checks, the layout tests save screenshots (light and
dark) to ``RTGW_SCREENSHOTS`` (default ``tests/browser/screenshots/``, not
committed): the artifacts a person looks at, as a user would, before a
release. Waits are on conditions in the page, never sleeps.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    expect,
    sync_playwright,
)

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, StartGateway
from tests.browser.test_page import _keys_file, open_page, send, wait_turn_over
from tests.support.counting_tool import counting_tool
from tests.support.procs import NodeProcess
from tests.support.redis_server import free_port

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"
)

TIMEOUT_MS = 15_000
SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
SHOTS = Path(os.environ.get("RTGW_SCREENSHOTS", Path(__file__).parent / "screenshots"))

OpenContext = Callable[..., Page]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def open_context(browser: Browser, start_gateway: StartGateway) -> Iterator[OpenContext]:
    """``open_context(size="phone", scheme="dark", allow=[regex])``: a fresh page.

    Fails the test on a console error it did not allow (script errors, CSP).
    """
    contexts: list[tuple[BrowserContext, list[str]]] = []

    def make(size: str = "desktop", scheme: str = "light", allow: tuple[str, ...] = ()) -> Page:
        context = browser.new_context(
            viewport=SIZES[size],
            color_scheme=scheme,  # type: ignore[arg-type]
            device_scale_factor=2 if size == "phone" else 1,
            accept_downloads=True,
        )
        problems: list[str] = []
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        expect.set_options(timeout=TIMEOUT_MS)

        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error" and not any(re.search(a, msg.text) for a in allow):
                problems.append(f"console: {msg.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        contexts.append((context, problems))
        return page

    yield make
    failures = []
    for context, problems in contexts:
        context.close()
        failures.extend(problems)
    assert not failures, failures


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), animations="disabled")


def show(page: Page, tab: str, size: str) -> None:
    """Bring a panel up: on a phone its tab; on a desktop the side panel's tab."""
    page.get_by_role("tab", name=re.compile(f"^{tab}")).click()
    if tab != "Chat":
        expect(page.locator(f"#{tab.lower()}-pane")).to_be_visible()


def in_view(page: Page, selector: str) -> None:
    box = page.locator(selector).bounding_box()
    assert box is not None, f"{selector} is not rendered"
    size = page.viewport_size
    assert size is not None
    assert box["y"] >= 0 and box["y"] + box["height"] <= size["height"], (selector, box)
    assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"], (selector, box)


def no_sideways_scroll(page: Page) -> None:
    width = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert width <= 0, f"the page scrolls sideways by {width}px"


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_the_console_at_desktop_and_phone_sizes(
    size: str, open_context: OpenContext, start_gateway: StartGateway
) -> None:
    node = start_gateway("--sim-tokens-per-second", "60")
    page = open_context(size)
    open_page(page, node)
    # The empty state says what to try, and the composer is on screen.
    tries = page.locator(".empty .try")
    expect(tries.first).to_be_visible()
    expect(page.locator(".empty")).to_contain_text("hello")
    expect(page.locator(".empty")).to_contain_text("/tool list")
    expect(page.locator(".empty")).to_contain_text("microphone")
    in_view(page, "#message")
    in_view(page, "#send")
    no_sideways_scroll(page)
    header = page.locator(".topbar").bounding_box()
    tabs = page.locator(".tabs").bounding_box()
    assert header and tabs
    assert header["height"] + (tabs["height"] if size == "phone" else 0) <= 100
    shot(page, f"{size}-light-1-empty")

    # A suggestion sends itself: a tool call, its result in its card, the answer.
    page.get_by_role("button", name=re.compile("Call a tool")).click()
    card = page.locator(".call")
    expect(card.locator(".call-head .tool-name")).to_have_text("list")
    expect(card.locator(".tool-item .tool-status")).to_have_text("success")
    expect(page.locator(".respond").last).to_have_text("The tool returned success.")
    wait_turn_over(page)
    expect(page.locator(".turn-stats").first).to_contain_text("to first token")

    # A long answer streams visibly: a live caret and a "streaming" badge.
    send(page, "/long 5")
    expect(page.locator(".respond.live")).to_be_visible()
    expect(page.locator(".turn.streaming .live-badge")).to_contain_text("streaming")
    expect(page.locator("#conversation")).to_have_attribute("aria-busy", "true")
    in_view(page, "#message")
    shot(page, f"{size}-light-2-streaming")
    page.wait_for_function("() => !window.rtgw.turnRunning")
    expect(page.locator(".respond.live")).to_have_count(0)
    expect(page.locator(".respond").last.locator("h4").first).to_contain_text("Streaming")
    expect(page.locator(".turn-stats").last).to_contain_text(re.compile(r"turn \d"))
    in_view(page, "#message")
    no_sideways_scroll(page)
    shot(page, f"{size}-light-3-conversation")

    # The inspector shows the frames both ways, with seq and type.
    show(page, "Events", size)
    rows = page.locator("#events-pane .frame")
    expect(rows.first).to_be_visible()
    expect(page.locator('#events-pane .frame.out[data-type="user"]').first).to_be_attached()
    received = page.locator('#events-pane .frame.in[data-type="respond"]').first
    expect(received.locator(".f-seq")).to_have_text(re.compile(r"^\d+$"))
    no_sideways_scroll(page)
    shot(page, f"{size}-light-4-events")

    show(page, "Settings", size)
    expect(page.get_by_label("Provider")).to_contain_text("sim")
    expect(page.locator(".config-json")).to_contain_text('"confirm"')
    no_sideways_scroll(page)
    shot(page, f"{size}-light-5-settings")

    show(page, "Session", size)
    expect(page.locator("#session-id")).to_have_text(page.evaluate("window.rtgw.sessionId"))
    shot(page, f"{size}-light-6-session")

    # Dark, as a system in dark mode loads it: a reload replays the session.
    show(page, "Chat", size) if size == "phone" else show(page, "Events", size)
    page.emulate_media(color_scheme="dark")
    page.reload()
    page.wait_for_function("() => window.rtgw.state === 'connected' && !window.rtgw.turnRunning")
    expect(page.locator(".respond")).to_have_count(2)
    in_view(page, "#message")
    shot(page, f"{size}-dark-3-conversation")


def test_the_inspector_filters_pauses_expands_and_downloads(
    open_context: OpenContext, start_gateway: StartGateway
) -> None:
    node = start_gateway()
    page = open_context()
    open_page(page, node)
    send(page, "hello")
    wait_turn_over(page)
    pane = page.locator("#events-pane")
    # Filter by type, then by direction.
    pane.get_by_label("Filter by type").select_option("respond")
    expect(pane.locator(".frame").first).to_have_attribute("data-type", "respond")
    assert set(
        pane.locator(".frame").evaluate_all("(rows) => rows.map((r) => r.dataset.type)")
    ) == {"respond"}
    pane.get_by_label("Filter by type").select_option("")
    pane.get_by_label("Filter by direction").select_option("out")
    expect(pane.locator(".frame.in")).to_have_count(0)
    expect(pane.locator('.frame.out[data-type="user"]')).to_have_count(1)
    pane.get_by_label("Filter by direction").select_option("")
    # Expand a row to its JSON.
    pane.locator('.frame[data-type="session"] summary').click()
    expect(pane.locator(".f-json").first).to_contain_text('"type": "session"')
    # Pause holds new rows back (and counts them); resume shows them.
    pane.get_by_role("button", name="Pause").click()
    before = pane.locator(".frame").count()
    send(page, "while paused")
    wait_turn_over(page)
    expect(pane.locator(".inspector-count")).to_contain_text("new")
    assert pane.locator(".frame").count() == before
    pane.get_by_role("button", name="Resume").click()
    expect(pane.locator('.frame.out[data-type="user"]')).to_have_count(2)
    # Download: every frame, both ways, with its seq.
    with page.expect_download() as info:
        pane.get_by_role("button", name="Download").click()
    path = info.value.path()
    saved = json.loads(Path(path).read_text())
    assert saved["session_id"] == page.evaluate("window.rtgw.sessionId")
    directions = {f["direction"] for f in saved["frames"]}
    assert directions == {"in", "out"}
    seqs = [f["frame"]["seq"] for f in saved["frames"] if f["direction"] == "in"]
    assert max(seqs) == page.evaluate("window.rtgw.lastSeq")


def test_settings_send_configure_and_show_the_answer(
    open_context: OpenContext, start_gateway: StartGateway
) -> None:
    node = start_gateway()
    page = open_context()
    open_page(page, node)
    show(page, "Settings", "desktop")
    pane = page.locator("#settings-pane")
    pane.get_by_label("Session instructions").fill("Answer like a pirate.")
    expect(pane.locator(".settings-status")).to_have_text("Not applied yet")
    pane.get_by_role("button", name="Apply").click()
    expect(pane.locator(".settings-status")).to_contain_text("Applied at seq")
    expect(pane.locator(".config-json")).to_contain_text("Answer like a pirate.")
    send(page, "/instructions")
    expect(page.locator(".respond").last).to_contain_text("Answer like a pirate.")
    # A bad value is caught before anything is sent; the gateway's refusals show too.
    pane.get_by_label("More tools (JSON array)").fill("[{not json")
    pane.get_by_role("button", name="Apply").click()
    expect(pane.locator(".settings-status")).to_contain_text("More tools:")
    pane.get_by_label("More tools (JSON array)").fill(
        '[{"name": "bad", "parameters": {"type": "string"}}]'
    )
    pane.get_by_role("button", name="Apply").click()
    expect(pane.locator(".settings-status")).to_contain_text("bad_frame")
    # Voice settings go out too: speech out with a voice.
    pane.get_by_label("More tools (JSON array)").fill("")
    pane.get_by_label(re.compile("^Speech")).check()
    pane.get_by_label("Voice", exact=True).fill("marin")
    pane.get_by_role("button", name="Apply").click()
    expect(pane.locator(".config-json")).to_contain_text('"voice": "marin"')
    expect(pane.locator(".config-json")).to_contain_text('"output": "audio"')


def _api_port(node: NodeProcess) -> int:
    node.wait_for_lines(r"HTTP API:")
    match = re.search(r"HTTP API:\s+http://[^:]+:(\d+)/", node.log)
    assert match, node.log
    return int(match[1])


def _post(url: str, key: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        answer: dict[str, object] = json.loads(r.read())
        return answer


def test_a_client_token_cannot_configure_and_is_told_so(
    open_context: OpenContext, start_gateway: StartGateway, tmp_path: Path
) -> None:
    key = "rtgw_console-key"
    node = start_gateway("--api-keys-file", str(_keys_file(tmp_path, key)), "--api-port", "0")
    made = _post(
        f"http://127.0.0.1:{_api_port(node)}/v1/sessions", key, {"instructions": "Be brief."}
    )
    page = open_context(allow=(r"WebSocket connection to .* failed",))
    open_page(page, node, token=str(made["client_token"]))
    assert page.evaluate("window.rtgw.sessionId") == made["session_id"]
    show(page, "Settings", "desktop")
    pane = page.locator("#settings-pane")
    expect(pane.locator(".callout")).to_contain_text("client token")
    expect(pane.get_by_role("button", name="Apply")).to_be_disabled()
    expect(pane.locator(".config-json")).to_contain_text("set up by the app's backend")
    # The client's configure() rejects with the gateway's reply, never silently.
    refused = page.evaluate(
        """async (token) => {
            const { Client } = await import("/client.js");
            const c = new Client(location.origin.replace("http", "ws") + "/v1/realtime", { token });
            await c.connect();
            try { await c.configure({ instructions: "x" }); return "resolved"; }
            catch (e) { return `${e.name} ${e.code}`; }
            finally { c.close(); }
        }""",
        made["client_token"],
    )
    assert refused == "ConfigureRefusedError forbidden"


def test_session_controls_export_resume_and_delete(
    open_context: OpenContext, start_gateway: StartGateway
) -> None:
    # Started as the README says: no --api-port, no --allowed-origins. The console calls
    # the HTTP API on its own port and origin.
    node = start_gateway()  # a port of its own choosing: one picked ahead can be taken
    page = open_context()
    page.goto(node.http + "/")
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    send(page, "remember me")
    wait_turn_over(page)
    first = page.evaluate("window.rtgw.sessionId")
    show(page, "Session", "desktop")
    pane = page.locator("#session-pane")
    with page.expect_download() as info:
        pane.get_by_role("button", name="Export transcript").click()
    exported = json.loads(Path(info.value.path()).read_text())
    assert exported["session_id"] == first
    assert [e["content"] for e in exported["events"] if e["type"] == "user"] == ["remember me"]
    # A new session, then back to the first by its id: its turn is replayed.
    pane.get_by_role("button", name="New session").click()
    page.wait_for_function(
        "(sid) => window.rtgw.state === 'connected' && window.rtgw.sessionId !== sid", arg=first
    )
    expect(page.locator(".empty")).to_be_visible()
    pane.get_by_label("Session id", exact=True).fill(first)
    pane.get_by_role("button", name="Resume").click()
    page.wait_for_function(
        "(sid) => window.rtgw.state === 'connected' && window.rtgw.sessionId === sid", arg=first
    )
    expect(page.locator(".user .user-text")).to_have_text("remember me")
    # Delete it through the HTTP API (two clicks: the second confirms).
    delete = pane.locator("#delete-session")
    delete.click()
    expect(delete).to_contain_text("Click again")
    delete.click()
    expect(page.locator(".marker.note").last).to_contain_text("was deleted")
    expect(page.locator("#state")).to_have_text("disconnected")


def test_the_recording_timeline_shows_tool_runs_and_latencies_and_downloads_for_replay(
    open_context: OpenContext, start_gateway: StartGateway
) -> None:
    node = start_gateway("--record")  # the API on the page's own port
    page = open_context()
    page.goto(node.http + "/")
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    send(page, '/tool list {"path": "."}')
    wait_turn_over(page)
    show(page, "Session", "desktop")
    pane = page.locator("#session-pane")
    timeline = pane.get_by_role("list", name="Recording timeline")
    # The recorder writes within a second of what happened: show it again until
    # the turn's tool run is there, as a user would.
    for _ in range(30):
        pane.get_by_role("button", name="Show recording").click()
        expect(pane.locator("#recording-hint")).to_contain_text("records")
        if (
            timeline.locator(".tl-tool").count()
            and timeline.locator(".tl-label", has_text="event end").count()
        ):
            break
        page.wait_for_timeout(300)  # a user's pause before showing it again
    expect(timeline.locator(".tl-tool .tl-label")).to_have_text("tool list (gateway)")
    expect(timeline.locator(".tl-tool .tl-note")).to_contain_text("ms")
    expect(timeline.locator(".tl-note", has_text="first output +").first).to_be_visible()
    expect(timeline.locator(".tl-label", has_text="→ provider").first).to_be_visible()
    expect(pane.locator("#recording-hint")).to_contain_text("records")
    shot(page, "desktop-light-9-recording")
    with page.expect_download() as info:
        pane.get_by_role("button", name="Download .jsonl").click()
    lines = Path(info.value.path()).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records[0]["kind"] == "header"
    assert records[0]["session_id"] == page.evaluate("window.rtgw.sessionId")
    assert any(r["kind"] == "tool" and r["name"] == "list" for r in records)


def test_a_session_that_is_not_recorded_says_how_to_record_it(
    open_context: OpenContext, start_gateway: StartGateway
) -> None:
    # The origin names the port, so the port is picked before the start; another
    # process can take it in between (seen in a loaded CI run): then pick again.
    for attempt in range(3):
        port = free_port()
        try:
            start_gateway(
                "--port",
                str(port),
                "--api-port",
                "0",
                "--allowed-origins",
                f"http://127.0.0.1:{port}",
            )
            break
        except RuntimeError as exc:
            if "is already in use" not in str(exc) or attempt == 2:
                raise
    page = open_context(allow=(r"status of 404",))
    page.goto(f"http://127.0.0.1:{port}/")
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    send(page, "hello")
    wait_turn_over(page)
    show(page, "Session", "desktop")
    pane = page.locator("#session-pane")
    pane.get_by_role("button", name="Show recording").click()
    expect(pane.locator("#recording-hint")).to_contain_text("is not recorded: record it with")
    expect(pane.get_by_role("button", name="Download .jsonl")).to_be_disabled()


def test_approvals_show_the_exact_arguments_and_background_calls_their_progress(
    open_context: OpenContext, start_gateway: StartGateway, tmp_path: Path
) -> None:
    with counting_tool() as tool:
        # ``list`` waits for approval; the counting tool runs in the background.
        _, counting = tool.tools_file().split("\n\n", 1)
        tools = tmp_path / "tools.toml"
        tools.write_text(f'[builtin]\nrequire_approval = ["list"]\n\n{counting}background = true\n')
        node = start_gateway("--tools", str(tools))
        page = open_context("desktop")
        sent: list[dict[str, object]] = []
        page.on(
            "websocket",
            lambda ws: ws.on(
                "framesent", lambda f: sent.append(json.loads(f)) if isinstance(f, str) else None
            ),
        )
        open_page(page, node)

        # The call waits: its exact arguments, Allow / Deny; Allow sends the digest.
        send(page, '/tool list {"path": "."}')
        card = page.locator(".call").first
        box = card.locator(".question.approval")
        expect(box.locator(".approval-args")).to_have_text('{\n  "path": "."\n}')
        expect(card.locator(".call-state")).to_have_text("waiting for your approval")
        shot(page, "desktop-light-7-approval")
        box.get_by_role("button", name="Allow").click()
        expect(box).to_have_attribute("data-decision", "allow")
        expect(box).to_contain_text("allowed")
        expect(card.locator(".tool-item .tool-status")).to_have_text("success")
        wait_turn_over(page)
        [approve] = [f for f in sent if f.get("type") == "approve"]
        assert approve == {
            "type": "approve",
            "id": card.get_attribute("data-call-id"),
            "digest": box.get_attribute("data-digest"),
            "decision": "allow",
        }

        # Deny: the model hears that the user denied it.
        send(page, '/tool list {"path": "secret"}')
        denied = page.locator(".call").nth(1)
        denied.locator(".question.approval").get_by_role("button", name="Deny").click()
        expect(denied.locator(".question.approval")).to_contain_text("denied")
        expect(denied.locator(".tool-item .tool-status")).to_have_text("failure")
        wait_turn_over(page)

        # A background call: its card says it runs while the answer ends the turn,
        # and its result fills the card when it comes.
        send(page, '/tool count {"label": "later", "seconds": 5}')
        bg = page.locator(".call.background")
        expect(bg.locator(".badge-background")).to_have_text("background")
        page.wait_for_function("() => !window.rtgw.turnRunning")
        expect(bg).to_have_class(re.compile(r"\brunning\b"))
        assert tool.stored == {}  # the turn ended before the tool answered
        shot(page, "desktop-light-8-background")
        expect(bg.locator(".tool-item .tool-status")).to_have_text("success", timeout=30_000)
        expect(bg).not_to_have_class(re.compile(r"\brunning\b"))


def test_the_console_speaks_through_the_openai_door(
    open_context: OpenContext, start_gateway: StartGateway
) -> None:
    node = start_gateway()
    page = open_context()
    open_page(page, node)
    gateway_session = page.evaluate("window.rtgw.sessionId")
    show(page, "Settings", "desktop")
    page.locator("#settings-pane").get_by_label(re.compile("^OpenAI door")).check()
    # A new session, through the door: its first frame is OpenAI's session.created.
    page.wait_for_function(
        "(before) => window.rtgw.state === 'connected' && window.rtgw.sessionId !== before",
        arg=gateway_session,
    )
    send(page, "hello")
    expect(page.locator(".respond").last).to_contain_text("Echo: hello")
    wait_turn_over(page)
    show(page, "Events", "desktop")
    pane = page.locator("#events-pane")
    expect(pane.locator('.frame.in[data-type="session.created"]')).to_have_count(1)
    expect(pane.locator('.frame.out[data-type="conversation.item.create"]')).to_have_count(1)
    expect(pane.locator('.frame.out[data-type="response.create"]')).to_have_count(1)
    # A new door session answers in audio, OpenAI's default: the text is its transcript.
    transcript = '.frame.in[data-type="response.output_audio_transcript.delta"]'
    expect(pane.locator(transcript).first).to_be_visible()
    expect(pane.locator('.frame.in[data-type="response.done"]')).to_have_count(1)
    expect(pane.locator('.frame[data-type="session"]')).to_have_count(0)  # not the gateway's
    # A reload keeps the page on the door; turning it off is the gateway's protocol again.
    page.reload()
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    show(page, "Settings", "desktop")
    toggle = page.locator("#settings-pane").get_by_label(re.compile("^OpenAI door"))
    expect(toggle).to_be_checked()
    toggle.uncheck()
    page.wait_for_function("() => window.rtgw.state === 'connected'")
    show(page, "Events", "desktop")
    expect(pane.locator('.frame.in[data-type="session"]')).to_have_count(1)
