"""``ResumePoint``: where a provider's own copy of the conversation can be continued from."""

from __future__ import annotations

import pytest

from gateway.sessions.resumption import HANDLE_LIFETIME, ResumePoint, decode_resume_point
from gateway.upstream.base import Resume
from protocol.assembly import assemble
from protocol.events import Respond, User

HISTORY = [User(content="one"), Respond(content="first"), User(content="two")]
POINT = ResumePoint(provider="gemini", model="live", handle="h-1", items=2, at=1000.0)


def test_the_same_provider_and_model_continue_with_what_was_logged_after_the_handle() -> None:
    resume = POINT.resume("gemini", "live", HISTORY, now=1000.0 + HANDLE_LIFETIME)
    assert resume == Resume("h-1", tuple(assemble(HISTORY[2:])))


def test_a_handle_that_covers_everything_sends_nothing_more() -> None:
    point = ResumePoint("gemini", "live", "h-2", items=len(HISTORY), at=1000.0)
    assert point.resume("gemini", "live", HISTORY, now=1001.0) == Resume("h-2", ())


@pytest.mark.parametrize(
    ("provider", "model", "now", "history"),
    [
        ("openai", "live", 1001.0, HISTORY),  # another provider's handle means nothing
        ("gemini", "other", 1001.0, HISTORY),  # nor another model's
        ("gemini", "live", 1000.0 + HANDLE_LIFETIME + 1, HISTORY),  # expired
        ("gemini", "live", 1001.0, HISTORY[:1]),  # covers more than the history holds
    ],
)
def test_otherwise_the_history_is_sent(
    provider: str, model: str, now: float, history: list[User | Respond]
) -> None:
    assert POINT.resume(provider, model, history, now) is None


def test_a_stored_point_reads_back_and_an_unreadable_one_is_none() -> None:
    assert decode_resume_point(POINT.encode()) == POINT
    for text in ("", "{", '{"provider": "gemini"}', '"a string"'):
        assert decode_resume_point(text) is None
