"""The JS client's error codes are the Python ones (generated, never copied by hand)."""

from __future__ import annotations

import re

from gateway.client.js_codes import JS_ERRORS, render, rewrite
from gateway.client.stream import REFUSAL_CODES, TURN_ENDING_ERROR_CODES
from protocol.events import ERROR_CODES


def test_errors_js_holds_the_generated_codes() -> None:
    """Fails when ``errors.js`` differs from the Python declaration: run
    ``python -m gateway.client.js_codes`` and commit the file."""
    text = JS_ERRORS.read_text(encoding="utf-8")
    assert render() in text
    assert rewrite(text) == text


def test_the_rendering_follows_a_changed_code_set() -> None:
    text = JS_ERRORS.read_text(encoding="utf-8")
    assert '"quota_exceeded"' in text
    edited = text.replace('"quota_exceeded", ', "", 1)
    assert render() not in edited  # a hand edit (or a new Python code) is noticed
    assert rewrite(edited) == text


def test_the_client_sets_are_codes_and_the_js_client_copies_none() -> None:
    assert set(ERROR_CODES) >= TURN_ENDING_ERROR_CODES | REFUSAL_CODES
    client = (JS_ERRORS.parent / "client.js").read_text(encoding="utf-8")
    # No set of code strings outside the generated block.
    assert not re.search(r'new Set\(\[\s*"(bad_frame|upstream|forbidden)', client)
