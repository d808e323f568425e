"""A recording's pages (``read_recording_page``), on the memory store and on Redis.

What the export (``GET /v1/sessions/ID/recording``) serves: whole lines only,
a line longer than a page whole and alone, and no page from an offset that is
not where a line starts (inside one, or past the end), so a page never starts
in the middle of a record or of a UTF-8 character.
"""

from __future__ import annotations

import pytest

from gateway.store import Store
from gateway.store.base import RecordingPage, read_recording_page

pytestmark = pytest.mark.timeout(30)

CUT = b'{"kind":"cut","limit":100}\n'
LINES = b"one\ntwo\nthree\n"


async def _recorded(store: Store, lines: bytes) -> None:
    await store.create_session("s1", {"owner": "k"})
    assert await store.append_recordings([("s1", lines, CUT)], 1 << 20) == [len(lines)]


async def _page(store: Store, offset: int, max_bytes: int) -> RecordingPage:
    return await read_recording_page(store.read_recording, "s1", offset, max_bytes)


async def test_pages_from_line_starts_are_whole_lines(store: Store) -> None:
    await _recorded(store, LINES)
    assert await _page(store, 0, 10) == RecordingPage(b"one\ntwo\n", 14)
    assert await _page(store, 4, 100) == RecordingPage(b"two\nthree\n", 14)
    assert await _page(store, 8, 10) == RecordingPage(b"three\n", 14)
    # The end is where the next line will start: an empty last page, not a refusal.
    assert await _page(store, 14, 10) == RecordingPage(b"", 14)


async def test_an_offset_inside_a_line_gives_no_page_but_says_so(store: Store) -> None:
    await _recorded(store, LINES)
    for offset in (1, 3, 5, 13):
        page = await _page(store, offset, 10)
        assert page.data == b"" and page.size == 14
        assert page.problem == (
            f"offset {offset} is inside a line of the recording, not where one starts"
        )


async def test_an_offset_past_the_end_gives_no_page_but_says_so(store: Store) -> None:
    await _recorded(store, LINES)
    for offset in (15, 10_000):
        page = await _page(store, offset, 10)
        assert page == RecordingPage(
            b"", 14, f"offset {offset} is past the end of the recording (14 bytes)"
        )


async def test_a_line_longer_than_a_page_comes_whole_and_alone(store: Store) -> None:
    """Once a page of part of a line, whose next page started inside it (and could cut
    a UTF-8 character in two): now the page holds the line to its newline."""
    long = "é".encode() * 50 + b"\n"  # 101 bytes, a two-byte character at every odd cut
    await _recorded(store, b"a\n" + long + b"b\n")
    size = 2 + len(long) + 2
    assert await _page(store, 0, 10) == RecordingPage(b"a\n", size)
    page = await _page(store, 2, 10)
    assert page == RecordingPage(long, size)
    page.data.decode()  # whole characters
    assert await _page(store, 2 + len(long), 10) == RecordingPage(b"b\n", size)
    assert (await _page(store, 3, 10)).problem is not None  # inside the long line


async def test_a_session_with_no_recording_has_an_empty_page(store: Store) -> None:
    page = await read_recording_page(store.read_recording, "ghost", 0, 10)
    assert page == RecordingPage(b"", 0)
    assert (await read_recording_page(store.read_recording, "ghost", 5, 10)).problem == (
        "offset 5 is past the end of the recording (0 bytes)"
    )
