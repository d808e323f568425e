"""The flight recorder's room (``gateway.sessions.recorder``) without sockets.

Recorders on the memory store: what a session's taps hand over becomes JSON
Lines of ``protocol.recording`` records, written when a log round starts (at
most every ``flush_every``) or at the backstop; audio is kept by size and by
reference; secrets never reach the store; a session not stored yet holds its
lines; a cut recording records nothing more.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from gateway.sessions.recorder import Recorders, SessionRecorder
from gateway.store import LogEntry, MemoryStore
from protocol.calls import ToolCall, ToolResult
from protocol.events import Call, Error, ToolResultMessage, UserMessage, encode
from protocol.recording import (
    ClientAudio,
    ClientCommand,
    Connected,
    Cut,
    Header,
    Logged,
    ToolRun,
    UpstreamFrame,
    encode_record,
    read_records,
)
from tests.edge.conftest import poll_until
from tools.base import ToolContext

SECRET = "sk-upstream-secret-42"


def header(sid: str = "s1") -> Header:
    return Header(session_id=sid, node="n1", provider="sim", model="sim")


async def stored(store: MemoryStore, sid: str = "s1") -> MemoryStore:
    await store.create_session(sid, {"owner": "k"})
    return store


async def written(recorders: Recorders) -> None:
    """Until the write in flight (if any) is answered."""
    if recorders._writing is not None:
        await recorders._writing


async def read(store: MemoryStore, sid: str = "s1") -> list[object]:
    data, _ = await store.read_recording(sid, 0, 1 << 24)
    found = list(read_records(data))
    assert not [r for r in found if isinstance(r, str)], found
    return found


async def test_a_round_writes_what_the_taps_handed_over() -> None:
    store = await stored(MemoryStore())
    recorders = Recorders(store, limit=1 << 20, secrets=[SECRET], backstop=0.05)
    recorder = recorders.start("s1", header())
    tap = recorder.connected("sim", "sim")
    tap.sent(b'{"type":"response.create"}', False)
    tap.received(b'{"type":"response.output_text.delta","delta":"hi"}')
    recorder.delivered([LogEntry(1, encode(Call(content='{"name":"x","args":{}}', seq=1)))])
    recorder.heard(UserMessage(content="hello"), None, 1)
    recorders.ride()  # a log round starts: the first write is due
    await written(recorders)
    kinds = [type(r).__name__ for r in await read(store)]
    assert kinds == [
        "Header",
        "Connected",
        "UpstreamFrame",
        "UpstreamFrame",
        "Logged",
        "ClientCommand",
    ]
    assert recorders.writes == 1
    # The next round within flush_every writes nothing; the backstop does.
    recorder.heard(UserMessage(content="again"), None, 1)
    recorders.ride()
    assert recorders._writing is None
    await poll_until(lambda: recorders.writes == 2, "the backstop writes it")
    await written(recorders)
    assert isinstance((await read(store))[-1], ClientCommand)


async def test_secrets_never_reach_the_store() -> None:
    store = await stored(MemoryStore())
    recorders = Recorders(store, limit=1 << 20, secrets=[SECRET, "short"])
    recorder = recorders.start("s1", header())
    tap = recorder.connected("sim", "sim")
    tap.received(b'{"type":"error","message":"bad key ' + SECRET.encode() + b'"}')
    recorder.heard(UserMessage(content=f"my key is {SECRET}"), None, 0)
    await recorders.finish(recorder)
    data, _ = await store.read_recording("s1", 0, 1 << 20)
    assert SECRET.encode() not in data and data.count(b"[secret]") == 2
    assert list(read_records(data))  # still JSON Lines


async def test_audio_frames_are_kept_by_size_and_the_users_audio_once() -> None:
    store = await stored(MemoryStore())
    recorders = Recorders(store, limit=1 << 20)
    recorder = recorders.start("s1", header())
    tap = recorder.connected("sim", "sim")
    pcm = b"\x01\x00" * 480
    recorder.audio_in(pcm, 24000, 3)
    recorder.audio_in(pcm, 24000, 3)  # the same chunk again (the fast path declined it)
    append = b'{"type":"input_audio_buffer.append","audio":"' + b"A" * 1280 + b'"}'
    tap.sent(append, True)
    delta = b'{"type":"response.output_audio.delta","delta":"' + b"B" * 4000 + b'"}'
    tap.received(delta)
    await recorders.finish(recorder)
    found = await read(store)
    (audio,) = [r for r in found if isinstance(r, ClientAudio)]
    assert audio.pcm == pcm and audio.rate == 24000 and audio.id == 1
    out, into = [r for r in found if isinstance(r, UpstreamFrame)]
    assert (out.elided, out.ref, out.bytes) == ("audio", 1, len(append))
    assert (into.elided, into.bytes, into.ref) == ("audio", len(delta), 0)


async def test_all_audio_keeps_the_frames_whole() -> None:
    store = await stored(MemoryStore())
    recorders = Recorders(store, limit=1 << 20, audio="all")
    recorder = recorders.start("s1", header())
    delta = b'{"type":"response.output_audio.delta","delta":"' + b"B" * 4000 + b'"}'
    recorder.connected("sim", "sim").received(delta)
    await recorders.finish(recorder)
    (frame,) = [r for r in await read(store) if isinstance(r, UpstreamFrame)]
    assert frame.elided == "" and bytes(frame.frame) == delta


async def test_a_session_not_stored_yet_holds_its_lines() -> None:
    store = MemoryStore()
    recorders = Recorders(store, limit=1 << 20)
    recorder = recorders.start("s1", header())
    recorders.ride()
    await written(recorders)
    assert await store.read_recording("s1", 0, 100) == (b"", 0)
    await stored(store)  # its first turn stores it
    recorder.heard(UserMessage(content="hello"), None, 0)
    await recorders.finish(recorder)
    kinds = [type(r) for r in await read(store)]
    assert kinds == [Header, ClientCommand]


async def test_a_session_stored_late_keeps_the_held_lines_that_fit_and_is_cut() -> None:
    """Lines held past the limit (the session not stored yet) are cut at it, not dropped."""
    store = MemoryStore()
    recorders = Recorders(store, limit=4096)
    recorder = recorders.start("s1", header())
    tap = recorder.connected("sim", "sim")
    for i in range(10):
        tap.received(b'{"type":"delta","n":%d,"pad":"%s"}' % (i, b"p" * 1000))
    recorders.ride()
    await written(recorders)
    assert recorder.full and not recorder.stopped  # held, bounded, recording nothing more
    await stored(store)  # its first turn stores it
    recorder.heard(UserMessage(content="hello"), None, 0)  # not kept; writes the held lines
    recorders._last = -1e9
    recorders.ride()
    await written(recorders)
    assert recorder.stopped
    _, size = await store.read_recording("s1", 0, 1 << 20)
    assert 4096 - 1100 < size <= 4096
    found = await read(store)
    frames = [r for r in found if isinstance(r, UpstreamFrame)]
    assert [type(r) for r in found] == [Header, Connected, *[UpstreamFrame] * len(frames), Cut]
    assert len(frames) >= 2
    assert [msgspec.json.decode(f.frame)["n"] for f in frames] == list(range(len(frames)))


async def test_a_cut_recording_records_nothing_more() -> None:
    store = await stored(MemoryStore())
    recorders = Recorders(store, limit=4096)
    recorder = recorders.start("s1", header())
    recorder.connected("sim", "sim").received(b'{"type":"x","pad":"' + b"p" * 5000 + b'"}')
    recorders.ride()
    await written(recorders)
    assert recorder.stopped
    recorder.heard(UserMessage(content="hello"), None, 0)  # ignored
    found = await read(store)
    # The header and the connection fit before the limit; the frame that crossed it not.
    assert [type(r) for r in found] == [Header, Connected, Cut]
    assert found[2].limit == 4096  # type: ignore[attr-defined]


async def test_a_recording_capped_at_64_kib_keeps_what_fits_before_the_cap() -> None:
    """A batch that crosses the cap is cut at it: 64 KiB of 100 frames, not the header only."""
    store = await stored(MemoryStore())
    limit = 64 << 10
    recorders = Recorders(store, limit=limit)
    recorder = recorders.start("s1", header())
    tap = recorder.connected("sim", "sim")
    for i in range(100):
        tap.received(b'{"type":"delta","n":%d,"pad":"%s"}' % (i, b"p" * 1000))
    recorders.ride()
    await written(recorders)
    assert recorder.stopped
    _, size = await store.read_recording("s1", 0, 1 << 24)
    assert limit - 1100 < size <= limit, size
    found = await read(store)
    frames = [r for r in found if isinstance(r, UpstreamFrame)]
    assert isinstance(found[0], Header) and isinstance(found[-1], Cut)
    assert 55 <= len(frames) < 100
    assert [msgspec.json.decode(f.frame)["n"] for f in frames] == list(range(len(frames)))


_TOOK = 0.05
"""Seconds each recorded call takes: its duration is at least that (a loaded machine adds)."""


async def test_tool_calls_are_recorded_with_outcome_and_duration() -> None:
    store = await stored(MemoryStore())
    recorders = Recorders(store, limit=1 << 20)
    recorder = recorders.start("s1", header())
    observe = recorder.observe_tools(None)
    context = ToolContext(Path("."), "s1", call_id="call_3")
    with observe(ToolCall("list", {"path": "."}), context) as seen:
        await asyncio.sleep(_TOOK)  # what the duration must cover, not synchronisation
        seen(ToolResult(tool="list", status="success", content=["a"]))
    # A client-side call: from its delivery to the client's answer.
    call = Call(content='{"name": "confirm", "args": {"q": 1}}', id="call_7", runs_on="client")
    call.seq = 5
    recorder.delivered([LogEntry(5, encode(call))])
    await asyncio.sleep(_TOOK)
    recorder.heard(ToolResultMessage("call_7", "success", True), None, 5)
    recorder.heard(
        ToolResultMessage("call_9", "success", True),
        Error(code="unknown_call", content="no such call"),
        5,
    )
    await recorders.finish(recorder)
    found = await read(store)
    server, client = [r for r in found if isinstance(r, ToolRun)]
    assert (server.name, server.runs_on, server.status, server.id) == (
        "list",
        "gateway",
        "success",
        "call_3",
    )
    assert msgspec.json.decode(server.args) == {"path": "."}
    assert server.duration_ms >= _TOOK * 1000, server
    assert (client.name, client.runs_on, client.id) == ("confirm", "client", "call_7")
    assert msgspec.json.decode(client.args) == {"q": 1}
    assert client.duration_ms >= _TOOK * 1000, client
    refused = [r for r in found if isinstance(r, ClientCommand)][-1]
    assert refused.refused == "unknown_call"
    assert [r for r in found if isinstance(r, Logged)]


async def test_the_recorder_stamps_are_wall_clock_times() -> None:
    recorder: SessionRecorder = Recorders(MemoryStore(), limit=1 << 20).start("s1", header())
    assert abs(recorder.now() - time.time()) < 1.0


async def test_a_flood_of_audio_between_two_writes_holds_no_more_than_the_limit() -> None:
    """60 MiB of a client's PCM in 3 s, recorded whole (``--record-audio all``), once
    grew the node 119 MB before the store cut the recording: now what a session takes
    in is kept only while it fits in the room its recording has left."""
    import tracemalloc

    store = await stored(MemoryStore())
    limit = 1 << 20
    recorders = Recorders(store, limit=limit, audio="all")
    recorder = recorders.start("s1", header())
    tap = recorder.connected("sim", "sim")
    chunk = 48_000  # 1 s of 24 kHz PCM16
    tracemalloc.start()
    try:
        for n in range(60 * 2**20 // chunk):
            # A new buffer each time, as a socket gives; letters, so the frame is the
            # JSON text a real client sends (raw control bytes would not be).
            pcm = bytes([97 + n % 26]) * chunk
            recorder.audio_in(pcm, 24000, n)
            tap.sent(b'{"type":"input_audio_buffer.append","audio":"' + pcm + b'"}', True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit + 8 * chunk, peak  # 60 MiB and more before
    started = time.perf_counter()
    recorders.ride()
    encoding = time.perf_counter() - started
    await written(recorders)
    assert encoding < 1.0  # the lines of ~1 MiB, not of 60 MiB
    assert recorder.stopped  # that write crossed the limit: the recording is cut there
    assert isinstance((await read(store))[-1], Cut)


async def test_room_comes_back_as_the_store_answers() -> None:
    store = await stored(MemoryStore())
    recorders = Recorders(store, limit=64 << 10, audio="all")
    recorder = recorders.start("s1", header())
    for n in range(6):  # 6 writes of ~8 KiB each fit in 64 KiB: nothing is dropped
        recorder.audio_in(bytes([n]) * 6000, 24000, n)
        recorders._last = -1e9  # the next round is due
        recorders.ride()
        await written(recorders)
    await recorders.finish(recorder)
    audio = [r for r in await read(store) if isinstance(r, ClientAudio)]
    assert [r.seq for r in audio] == list(range(6))


async def test_large_recordings_are_taken_over_several_loop_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recorder's take joins and scrubs its lines: eight sessions that each recorded a
    15 MiB append (~20 MB of lines) were taken in one pass, and the loop waited ~30 ms.
    A write now leaves the loop free once it took ``TAKE_PER_PASS`` of them."""
    store = MemoryStore()
    recorders = Recorders(store, limit=1 << 30, secrets=[SECRET])
    sids = [f"s{n}" for n in range(4)]
    loop, passes = asyncio.get_running_loop(), [0]

    def next_pass() -> None:
        passes[0] += 1
        handle[0] = loop.call_soon(next_pass)

    handle = [loop.call_soon(next_pass)]
    taken_in: dict[str, int] = {}
    take = SessionRecorder.take

    def timed(self: SessionRecorder, secrets: tuple[bytes, ...]) -> bytes:
        taken_in[self.sid] = passes[0]
        return take(self, secrets)

    monkeypatch.setattr(SessionRecorder, "take", timed)
    for sid in sids:
        await stored(store, sid)
        tap = recorders.start(sid, header(sid)).connected("sim", "sim")
        tap.received(b'{"type":"x","pad":"' + b"a" * (2 << 20) + b'"}')
    recorders.ride()
    await written(recorders)
    handle[0].cancel()
    assert len(set(taken_in.values())) == len(sids), taken_in  # one a pass: each > 1 MiB
    for sid in sids:
        assert any(isinstance(r, UpstreamFrame) for r in await read(store, sid))


def test_a_recording_saved_with_a_byte_order_mark_reads_the_same() -> None:
    """An editor may save a recording with a UTF-8 BOM; it was read as "JSON is
    malformed: invalid character (byte 0)", which said nothing of the cause."""
    line = encode_record(header())
    assert list(read_records(b"\xef\xbb\xbf" + line + line)) == list(read_records(line + line))
