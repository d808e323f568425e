"""The console shows guardrail events (issue 41): a blocked message says it never
reached the model and the page takes the next one; a redacted answer says so in its
turn. Never the matched text."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import StartGateway
from tests.browser.test_page import (
    CHROMIUM,
    browser,
    console_allowed,
    open_page,
    page,
    send,
    wait_turn_over,
)
from tests.support.guardrail_rules import PASSWORDS_AND_CARDS

__all__ = ["browser", "console_allowed", "page"]

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed"),
    pytest.mark.timeout(90),
]

RULES = PASSWORDS_AND_CARDS


def test_the_console_shows_a_blocked_message_and_a_redacted_answer(
    page: Page, start_gateway: StartGateway, tmp_path: Path
) -> None:
    rules = tmp_path / "guardrails.toml"
    rules.write_text(RULES)
    node = start_gateway("--guardrails", str(rules))
    open_page(page, node)
    send(page, "my password is hunter2")
    blocked = page.locator(".marker.guardrail").first
    expect(blocked).to_have_text(
        "Guardrail “no-passwords”: your message was blocked; it never reached the model."
    )
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    send(page, "/raw Your card is 4242 4242 4242 4242, thanks!<end>")
    wait_turn_over(page)
    expect(page.locator(".respond").last).to_have_text("Your card is [redacted], thanks!")
    expect(page.locator(".turn .marker.guardrail")).to_have_text(
        "Guardrail “no-cards”: part of the answer was redacted."
    )
    assert "hunter2" not in page.locator("#conversation").inner_text()
