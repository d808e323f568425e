"""The pure rules every client shares: seq verdicts and the end of a turn (no sockets)."""

from __future__ import annotations

import pytest

from gateway.client.dial import BadUrl, normalize_url
from gateway.client.stream import SeqVerdict, TurnTracker, classify_seq


def test_seq_verdicts() -> None:
    assert classify_seq("think", 5, 4) is SeqVerdict.NEW
    assert classify_seq("respond", 9, 4, seq_from=5) is SeqVerdict.NEW
    assert classify_seq("think", 4, 4) is SeqVerdict.DUPLICATE
    assert classify_seq("error", 4, 4) is SeqVerdict.REPLY
    assert classify_seq("think", 7, 4) is SeqVerdict.GAP
    # A merged frame straddling what is held cannot be split: resume instead.
    assert classify_seq("respond", 9, 6, seq_from=5) is SeqVerdict.GAP


def ends_at(*kinds: str) -> int | None:
    tracker = TurnTracker()
    for i, kind in enumerate(kinds):
        name, _, code = kind.partition(":")
        if tracker.ends_before(name):
            return i - 1
        if tracker.feed(name, code):
            return i
    return None


@pytest.mark.parametrize(
    ("kinds", "end"),
    [
        (("user", "respond", "end", "metric"), 3),  # today, and the new rule
        (("user", "execute", "metric", "result", "respond", "end", "metric"), 6),
        (("user", "respond", "metric", "end"), 3),  # the model stopped without <end>
        (("user", "error:upstream", "end"), 2),  # today's failure: maybe no metric
        (("user", "error:upstream", "metric"), 2),  # the new rule's failure
        (("user", "error:upstream_timeout", "end"), 2),  # a silent provider, twice
        (("user", "cancelled", "metric"), 2),  # the new rule's cancel
        (("user", "cancelled", "user"), 1),  # today's cancel, then the next turn
        (("user", "error:turn_active", "respond", "end", "metric"), 4),
        (("user", "error:store", "respond", "end", "metric"), 4),
    ],
)
def test_turn_end_shapes(kinds: tuple[str, ...], end: int) -> None:
    assert ends_at(*kinds) == end


def test_a_missing_metric_ends_the_turn_when_the_grace_expires() -> None:
    tracker = TurnTracker()
    tracker.feed("user")
    tracker.feed("cancelled")
    assert tracker.closing and not tracker.done
    tracker.expire()
    assert tracker.done


def test_urls_are_corrected_or_refused() -> None:
    assert normalize_url("http://h:1") == ("ws://h:1/v1/realtime", "using ws://h:1/v1/realtime")
    assert normalize_url("https://h/") == ("wss://h/v1/realtime", "using wss://h/v1/realtime")
    assert normalize_url("ws://h:1/v1/realtime") == ("ws://h:1/v1/realtime", None)
    assert normalize_url("h:1")[0] == "ws://h:1/v1/realtime"
    with pytest.raises(BadUrl, match="ws://HOST:PORT/v1/realtime"):
        normalize_url("ftp://h/")
