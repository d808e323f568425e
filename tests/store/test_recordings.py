"""The recordings' contract (``Recordings``), on the memory store and on Redis.

A recording lives with its session: written only while the session is
stored, cut once at its limit, read in pages of whole lines, gone with a
``DELETE`` and with the session's idle expiry.
"""

from __future__ import annotations

from gateway.store import Store
from gateway.store.base import NOT_STORED, RECORDING, RECORDING_CUT
from tests.store.conftest import Harness

CUT = b'{"kind":"cut","limit":100}\n'


async def test_appends_while_the_session_is_stored(store: Store) -> None:
    assert await store.append_recordings([("s1", b"a\n", CUT)], 100) == [NOT_STORED]
    await store.create_session("s1", {"owner": "k"})
    assert await store.append_recordings([("s1", b"a\n", CUT)], 100) == [2]
    assert await store.append_recordings([("s1", b"bb\n", CUT), ("s2", b"x\n", CUT)], 100) == [
        5,
        NOT_STORED,
    ]
    assert await store.read_recording("s1", 0, 1000) == (b"a\nbb\n", 5)
    meta = await store.get_meta("s1")
    assert meta is not None and meta[RECORDING] == "on"


async def test_a_recording_is_cut_once_at_its_limit(store: Store) -> None:
    await store.create_session("s1", {"owner": "k"})
    assert await store.append_recordings([("s1", b"x" * 59 + b"\n", CUT)], 100) == [60]
    assert await store.append_recordings([("s1", b"y" * 59 + b"\n", CUT)], 100) == [RECORDING_CUT]
    # Nothing after the cut, however small (another node may write it).
    assert await store.append_recordings([("s1", b"z\n", CUT)], 100) == [RECORDING_CUT]
    data, size = await store.read_recording("s1", 0, 1000)
    assert data == b"x" * 59 + b"\n" + CUT
    assert size == len(data)
    meta = await store.get_meta("s1")
    assert meta is not None and meta[RECORDING] == "cut"


async def test_the_write_that_crosses_the_limit_is_cut_at_the_limit_on_a_whole_line(
    store: Store,
) -> None:
    """The lines of the write that fit are kept, not dropped with the rest of it."""
    await store.create_session("s1", {"owner": "k"})
    assert await store.append_recordings([("s1", b"h" * 9 + b"\n", CUT)], 100) == [10]
    lines = b"".join(b"%d" % i * 9 + b"\n" for i in range(10))  # 10 lines of 10 bytes
    assert await store.append_recordings([("s1", lines, CUT)], 100) == [RECORDING_CUT]
    data, size = await store.read_recording("s1", 0, 1000)
    # 100 bytes: the first line, the 6 whole lines that fit before the cut line, the cut.
    assert data == b"h" * 9 + b"\n" + lines[:60] + CUT
    assert size == len(data) <= 100
    assert await store.append_recordings([("s1", b"z\n", CUT)], 100) == [RECORDING_CUT]


async def test_pages_end_on_whole_lines(store: Store) -> None:
    await store.create_session("s1", {"owner": "k"})
    await store.append_recordings([("s1", b"one\ntwo\nthree\n", CUT)], 1000)
    assert await store.read_recording("s1", 0, 10) == (b"one\ntwo\n", 14)
    assert await store.read_recording("s1", 8, 10) == (b"three\n", 14)
    # A page shorter than a line gives part of it; the next page goes on with it.
    assert await store.read_recording("s1", 8, 3) == (b"thr", 14)
    assert await store.read_recording("s1", 14, 10) == (b"", 14)
    assert await store.read_recording("ghost", 0, 10) == (b"", 0)


async def test_delete_removes_the_recording(store: Store) -> None:
    await store.create_session("s1", {"owner": "k"})
    await store.append_recordings([("s1", b"secret turn\n", CUT)], 1000)
    assert await store.delete_session("s1")
    assert await store.read_recording("s1", 0, 1000) == (b"", 0)
    # A node that has not heard of the delete cannot write it back.
    assert await store.append_recordings([("s1", b"late\n", CUT)], 1000) == [NOT_STORED]
    assert await store.read_recording("s1", 0, 1000) == (b"", 0)


async def test_the_recording_expires_with_its_session(harness: Harness) -> None:
    store = harness.make(ttl=0.3)
    await store.create_session("s1", {"owner": "k"})
    await store.append_recordings([("s1", b"turn\n", CUT)], 1000)
    await harness.idle_expired(store, "s1")

    async def gone() -> bool:
        return await store.read_recording("s1", 0, 1000) == (b"", 0)

    await harness.after(0.3, gone, "the recording expired with its session")
