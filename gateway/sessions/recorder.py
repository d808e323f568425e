"""The flight recorder: what a session's upstream, clients, tools and log did, kept with it.

A session records (``SessionSetup.record``: the node's ``--record``, its key
policy's ``record``, or its own configuration's ``record``) on the node that
drives it. ``SessionRecorder`` is the session's: taps call it with what
happens — the upstream socket with each frame both ways
(``gateway.upstream.provider_socket.FrameTap``), the session log with each
batch of events it delivered, the command dispatch with each client command,
the voice input with each chunk of the user's audio, the tool executor with
each call — and it keeps them as they come, stamped, in a list: one append
per frame or batch, nothing encoded, nothing written. The record format is
``protocol.recording``.

**Written by the log writer's rounds, never on the hot path.** ``Recorders``
(one per node) writes the recordings of every session that recorded
something: when a log round starts (``LogWriter``'s ``on_round``), at most
every ``FLUSH_EVERY`` seconds, and ``BACKSTOP`` seconds after the first
thing waiting when no round comes (the frames after a session's last event).
A write encodes every waiting session's records into JSON Lines and sends
them all at once (``Recordings.append_recordings``: one pipeline on Redis),
in a task of its own: no event waits for a recording, and a store outage
only holds the lines (bounded by the limit) until it answers.

**Bounded.** A recording stops at ``record_max_bytes`` with a ``cut`` record
(the store decides, so every node driving the session agrees), after the
whole lines of the write that crossed it that fit; a session not stored yet
(or a store that does not answer) holds its lines until it is, up to the
same limit: past it the recorder records nothing more, and the store cuts
what it held at the limit. What a session takes in between two writes is
kept only while it fits in the room the recording has left (60 MiB of a
client's PCM in 3 s with ``--record-audio all`` once grew the node 119 MB
and held /healthz 416 ms). Audio
frames are kept by size (and the user's audio once, in ``audio`` records)
unless the audio policy is ``all``.

**No secrets.** Headers and URLs are never recorded (an upstream connection
is recorded by provider and model), and every line written is scrubbed of
the node's secrets (provider API keys, the token secret) should one ever
appear in a frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import msgspec

from gateway.config import Config
from gateway.store.base import NOT_STORED, RECORDING_CUT, LogEntry, Recordings, StoreError
from gateway.upstream import providers
from protocol.calls import ToolCall, ToolResult
from protocol.events import Call, Error, ToolResultMessage, decode_event
from protocol.recording import (
    AudioPolicy,
    ClientAudio,
    ClientCommand,
    Connected,
    Cut,
    Record,
    ToolRun,
    UpstreamFrame,
    encode_record,
)
from tools.base import ToolContext
from tools.executor import CallObserver
from tools.registry import Registry

__all__ = ["BACKSTOP", "FLUSH_EVERY", "Recorders", "SessionRecorder"]

log = logging.getLogger("gateway.sessions.recorder")

FLUSH_EVERY: Final = 0.25
"""Seconds between two writes of the recordings, at most (a log round starts one)."""
BACKSTOP: Final = 1.0
"""Seconds after which waiting records are written even if no log round comes."""
TAKE_PER_PASS: Final = 1 << 20
"""Bytes of recordings a write takes in one loop pass (one recorder's may be more)."""
AUDIO_MIN: Final = 1024
"""A frame this large (bytes) that names ``audio`` near its start is an audio frame."""
AUDIO_PEEK: Final = 100
CLIENT_CALLS: Final = 256
"""Client-side calls waiting for their answers that a recorder remembers (for durations)."""
_CLIENT_CALL: Final = b'"runs_on":"client"'
_SECRET: Final = b"[secret]"

# What a recorder keeps until its next write: a frame, a batch of events, a record.
_FRAME: Final = 0
_EVENTS: Final = 1
_RECORD: Final = 2
_Item = tuple[Any, ...]


def _ignore(result: ToolResult) -> None:
    pass


class _ConnectionTap:
    """The ``FrameTap`` of one upstream connection: its frames to its session's recorder."""

    __slots__ = ("_connection", "_recorder")

    def __init__(self, recorder: SessionRecorder, connection: int) -> None:
        self._recorder = recorder
        self._connection = connection

    def sent(self, data: bytes, audio: bool) -> None:
        self._recorder.frame(self._connection, True, data, audio)

    def received(self, data: bytes) -> None:
        self._recorder.frame(self._connection, False, data, False)


class SessionRecorder:
    """One session's recording on the node that drives it (see the module docstring)."""

    __slots__ = (
        "_audio_ids",
        "_base",
        "_client_calls",
        "_connections",
        "_held",
        "_items",
        "_last_audio",
        "_marked",
        "_pending",
        "_room",
        "_writer",
        "audio",
        "full",
        "guarded",
        "limit",
        "sid",
        "stopped",
    )

    def __init__(
        self, sid: str, writer: Recorders, first: Record, *, audio: AudioPolicy, limit: int
    ) -> None:
        self.sid = sid
        self.audio = audio
        self.limit = limit
        self.stopped = False
        self.full = False  # lines past the limit held for a session not stored yet
        # The session has guardrails: upstream frames (the model's raw text, the context
        # sent) are kept as sizes only, so the recording never holds what a rule withheld.
        self.guarded = False
        self._writer = writer
        # Unix time at monotonic 0: stamps are monotonic, and read as wall-clock times.
        self._base = time.time() - time.monotonic()
        first.t = self.now()
        self._items: list[_Item] = [(_RECORD, first)]
        self._held = b""  # lines written once but not stored (the session was not stored yet)
        self._marked = False
        # Bytes taken in since the last write (about what their lines will be), and the
        # room the recording has left: past it, nothing more is kept (the next write
        # crosses the limit and is cut), so a session holds at most its limit in memory.
        self._pending = 0
        self._room = limit
        self._connections = 0
        self._audio_ids = 0
        self._last_audio = b""
        self._client_calls: dict[str, tuple[float, str, bytes]] = {}
        writer.mark(self)

    def now(self) -> float:
        return self._base + time.monotonic()

    # ------------------------------------------------------------------ taps

    def connected(self, provider: str, model: str) -> _ConnectionTap:
        """An upstream connection opens: its record, and the tap of its frames."""
        self._connections += 1
        self._record(Connected(connection=self._connections, provider=provider, model=model))
        return _ConnectionTap(self, self._connections)

    def frame(self, connection: int, out: bool, data: bytes, audio: bool) -> None:
        """A frame on an upstream connection (``audio``: the socket knows it carries audio)."""
        if self.stopped or self.full or self._pending > self._room:
            self._refuse()
            return
        self._pending += len(data)
        self._items.append(
            (_FRAME, time.monotonic(), connection, out, data, audio, self._audio_ids)
        )
        if not self._marked:
            self._mark()

    def delivered(self, entries: Sequence[LogEntry]) -> None:
        """Events the session logged and delivered to its clients, in one batch."""
        if self.stopped or self.full or self._pending > self._room:
            self._refuse()
            return
        self._pending += sum(len(entry.data) for entry in entries)
        t = time.monotonic()
        self._items.append((_EVENTS, t, entries))
        for entry in entries:
            if _CLIENT_CALL in entry.data:
                self._client_call(entry.data, t)
        if not self._marked:
            self._mark()

    def heard(self, message: msgspec.Struct, refused: Error | None, seq: int) -> None:
        """A client's command, and the error it was refused with (None: taken)."""
        if isinstance(message, ToolResultMessage) and refused is None:
            call = self._client_calls.pop(message.id, None)
            if call is not None:
                t, name, args = call
                self._record(
                    ToolRun(
                        name=name,
                        args=msgspec.Raw(args),
                        status=message.status,
                        duration_ms=round((time.monotonic() - t) * 1000, 3),
                        runs_on="client",
                        id=message.id,
                    )
                )
        code = "" if refused is None else refused.code
        self._record(ClientCommand(seq=seq, message=msgspec.Raw(_encode(message)), refused=code))

    def audio_in(self, pcm16: bytes, rate: int, seq: int) -> None:
        """A chunk of the user's audio (kept unless the audio policy is ``none``). The
        same chunk heard again (the relay's fast path declined it) is recorded once."""
        if self.audio == "none" or pcm16 is self._last_audio or self._pending > self._room:
            return
        self._last_audio = pcm16
        self._audio_ids += 1
        self._record(ClientAudio(id=self._audio_ids, seq=seq, rate=rate, pcm=pcm16))
        self._pending += len(pcm16) * 4 // 3  # base64 in its line

    def observe_tools(self, inner: CallObserver | None) -> CallObserver:
        """The executor's observer of each call: ``inner``'s (tracing), and a ``tool`` record."""
        return functools.partial(self._observe, inner)

    @contextlib.contextmanager
    def _observe(
        self, inner: CallObserver | None, call: ToolCall, context: ToolContext
    ) -> Iterator[Callable[[ToolResult], None]]:
        started = time.monotonic()
        around = inner(call, context) if inner is not None else contextlib.nullcontext(_ignore)
        with around as seen:

            def both(result: ToolResult) -> None:
                seen(result)
                self._record(
                    ToolRun(
                        name=call.name,
                        args=msgspec.Raw(_encode(call.args)),
                        status=result.status,
                        duration_ms=round((time.monotonic() - started) * 1000, 3),
                        id=context.call_id,
                    )
                )

            yield both

    def _client_call(self, data: bytes, t: float) -> None:
        """A call sent to the client: remembered until its answer (its duration)."""
        try:
            event = decode_event(data)
            if not isinstance(event, Call):
                return
            spec = _call_decoder.decode(event.content)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return
        calls = self._client_calls
        if len(calls) >= CLIENT_CALLS:
            calls.pop(next(iter(calls)))
        calls[event.id] = (t, spec.name, _encode(spec.args))

    def _record(self, record: Record) -> None:
        if self.stopped or self.full or self._pending > self._room:
            self._refuse()
            return
        record.t = self.now()
        self._items.append((_RECORD, record))
        if not self._marked:
            self._mark()

    def _refuse(self) -> None:
        """Nothing is recorded now. A full recorder's held lines are written again on
        the session's next activity (once stored, the store cuts them at the limit)."""
        if self.full and not self.stopped and not self._marked:
            self._mark()

    def _mark(self) -> None:
        self._marked = True
        self._writer.mark(self)

    # ------------------------------------------------------------------ the writer's side

    def take(self, secrets: Sequence[bytes]) -> bytes:
        """Every record waiting, as JSON Lines (with any held back), scrubbed of ``secrets``."""
        self._marked = False
        items, self._items = self._items, []
        lines = self._held + b"".join(self._lines(items))
        self._held = b""
        self._pending = 0
        self._room -= len(lines)  # in flight: ``written`` says what the store has
        for secret in secrets:
            if secret in lines:
                lines = lines.replace(secret, _SECRET)
        return lines

    def cut_line(self) -> bytes:
        return encode_record(Cut(t=self.now(), limit=self.limit))

    def written(self, size: int, lines: bytes) -> None:
        """The store's answer for ``lines``: the size it has now, or why not."""
        if size == RECORDING_CUT:
            self.stop()
        elif size == NOT_STORED or size < 0:
            self._room += len(lines)  # held, and counted again when taken
            self.hold(lines)
        else:
            self._room = self.limit - size

    def hold(self, lines: bytes) -> None:
        """``lines`` were not stored: written again, first, with the next records. A
        session not stored yet holds no more than its limit and one byte: past it the
        recorder is ``full`` (records nothing more), and the store, once it holds the
        session, keeps the whole lines that fit and the cut line."""
        if self.stopped:
            return
        held = lines + self._held
        if len(held) > self.limit:
            held = held[: self.limit + 1]  # still past the limit: the store cuts it there
            self.full = True
            self._items.clear()
            self._client_calls.clear()
        # Not marked: a session not stored yet is written again with its next activity.
        self._held = held

    def stop(self) -> None:
        """Record nothing more (the recording is cut, turned off, or the session closed)."""
        self.stopped = True
        self._items.clear()
        self._client_calls.clear()

    def _lines(self, items: list[_Item]) -> Iterator[bytes]:
        base = self._base
        for item in items:
            kind = item[0]
            if kind is _FRAME:
                yield self._frame_line(base + item[1], *item[2:])
            elif kind is _EVENTS:
                stamp = b'{"kind":"event","t":%.6f,"event":' % (base + item[1])
                for entry in item[2]:
                    yield stamp + entry.data + b"}\n"
            else:
                yield encode_record(item[1])

    def _frame_line(
        self, t: float, connection: int, out: bool, data: bytes, audio: bool, ref: int
    ) -> bytes:
        elided = ""
        if self.audio != "all" and (
            audio or (len(data) >= AUDIO_MIN and b"audio" in data[:AUDIO_PEEK])
        ):
            elided = "audio"
        elif data[:1] != b"{":
            elided = "binary"  # not a JSON frame: its size only
        elif self.guarded:
            elided = "guardrails"
        if elided:
            return encode_record(
                UpstreamFrame(
                    t=t,
                    connection=connection,
                    dir="out" if out else "in",
                    bytes=len(data),
                    elided=elided,
                    ref=ref if out and elided == "audio" else 0,
                )
            )
        return b'{"kind":"upstream","t":%.6f,"connection":%d,"dir":"%s","frame":%s}\n' % (
            t,
            connection,
            b"out" if out else b"in",
            data,
        )


class Recorders:
    """The recordings of a node's sessions, written on the log writer's rounds.

    ``limit`` is each recording's size limit (bytes), ``audio`` the audio
    policy of new recordings, ``secrets`` what no line may carry.
    """

    def __init__(
        self,
        store: Recordings,
        *,
        limit: int,
        audio: AudioPolicy = "user",
        secrets: Sequence[str] = (),
        flush_every: float = FLUSH_EVERY,
        backstop: float = BACKSTOP,
    ) -> None:
        self.store = store
        self.limit = limit
        self.audio = audio
        self.secrets = tuple(s.encode() for s in secrets if len(s) >= 8)
        self.flush_every = flush_every
        self.backstop = backstop
        self.writes = 0
        """Writes sent (each carries every waiting session's lines)."""
        self._dirty: list[SessionRecorder] = []
        self._writing: asyncio.Task[None] | None = None
        self._last = -1e9  # perf_counter() of the last write
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self, sid: str, first: Record, audio: AudioPolicy | None = None) -> SessionRecorder:
        """A recorder for ``sid`` whose first record is ``first`` (a header, or a node's)."""
        return SessionRecorder(
            sid, self, first, audio=self.audio if audio is None else audio, limit=self.limit
        )

    def mark(self, recorder: SessionRecorder) -> None:
        """``recorder`` has records waiting (called once until they are taken)."""
        self._dirty.append(recorder)
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(self.backstop, self._backstopped)

    def ride(self) -> None:
        """A log round starts: write the recordings if one is due (``LogWriter.on_round``)."""
        if not self._dirty or self._writing is not None:
            return
        if time.perf_counter() - self._last >= self.flush_every:
            self._write()

    def _backstopped(self) -> None:
        self._timer = None
        if self._dirty and self._writing is None:
            self._write()
        elif self._dirty and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(self.backstop, self._backstopped)

    def _write(self) -> None:
        dirty, self._dirty = self._dirty, []
        self._last = time.perf_counter()
        self._writing = asyncio.get_running_loop().create_task(
            self._send(dirty), name="recordings-write"
        )

    async def _take(self, dirty: list[SessionRecorder]) -> list[tuple[SessionRecorder, bytes]]:
        """Each recorder's lines, the loop free after every ``TAKE_PER_PASS`` of them: a
        recorder's take joins and scrubs its lines (a recorded 15 MiB append is ~20 MB of
        them), and eight taken in one pass held the loop ~30 ms."""
        chunks: list[tuple[SessionRecorder, bytes]] = []
        taken = 0
        for recorder in dirty:
            if taken >= TAKE_PER_PASS:
                await asyncio.sleep(0)
                taken = 0
            if not recorder.stopped and (lines := recorder.take(self.secrets)):
                chunks.append((recorder, lines))
                taken += len(lines)
        return chunks

    async def _send(self, dirty: list[SessionRecorder]) -> None:
        try:
            chunks = await self._take(dirty)
            if not chunks:
                return
            self.writes += 1
            try:
                sizes = await self.store.append_recordings(
                    [(r.sid, lines, r.cut_line()) for r, lines in chunks], self.limit
                )
            except StoreError as exc:
                log.info("recordings not written (held for the next write): %s", exc)
                sizes = [NOT_STORED] * len(chunks)
            for (recorder, lines), size in zip(chunks, sizes, strict=True):
                recorder.written(size, lines)
        except Exception:  # a bug here must not stop the node's other recordings
            log.exception("writing recordings failed")
        finally:
            self._writing = None
        if self._dirty and self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(self.backstop, self._backstopped)

    async def finish(self, recorder: SessionRecorder, timeout: float = 2.0) -> None:
        """The session closes here: write what its recorder holds (after the write in
        flight, so its lines keep their order), then stop it."""
        if recorder.stopped:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                if self._writing is not None:
                    await asyncio.shield(self._writing)
                lines = recorder.take(self.secrets)
                if lines:
                    sizes = await self.store.append_recordings(
                        [(recorder.sid, lines, recorder.cut_line())], self.limit
                    )
                    if sizes[0] == NOT_STORED:
                        log.info(
                            "session %s: the last lines of its recording were not stored",
                            recorder.sid,
                        )
        recorder.stop()
        with contextlib.suppress(ValueError):
            self._dirty.remove(recorder)

    async def close(self) -> None:
        """Write what is waiting (bounded), then stop."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                if self._writing is not None:
                    await asyncio.shield(self._writing)
                if self._dirty:
                    self._write()
                    if self._writing is not None:
                        await asyncio.shield(self._writing)


class _CallSpec(msgspec.Struct):
    name: str = ""
    args: Any = None


_encode: Final = msgspec.json.Encoder().encode
_call_decoder: Final = msgspec.json.Decoder(_CallSpec)


def secrets_to_scrub(config: Config, registry: Registry) -> list[str]:
    """What no recording may carry: every provider's API key, the simulator's, the
    client tokens' secrets, and what the gateway holds for its tools (headers,
    environment values: the executor scrubs those from results already)."""
    found = [config.upstream(name).api_key for name in providers.NAMES if name != providers.SIM]
    found += [config.sim.api_key or "", *config.token_secret.split(",")]
    for tool in registry:
        held = getattr(tool, "secrets", None)
        if held:
            found += held.values
    return [s for s in found if s]
