"""The guardrails of issue 41's Done-when, as a file's text: an input rule that blocks a
pattern and an output rule that redacts card numbers (shared by the tests that use them
through each door: the API, the OpenAI door, the console, `gateway eval`)."""

from __future__ import annotations

from typing import Final

PASSWORDS_AND_CARDS: Final = """
[[rule]]
name = "no-passwords"
on = "input"
action = "block"
pattern = "(?i)my password is"

[[rule]]
name = "no-cards"
on = "output"
action = "redact"
detect = "card"
"""
