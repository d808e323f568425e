"""``gateway loadtest URL``: many concurrent client sessions against a gateway.

``N`` sessions are opened over ``ramp`` seconds (session ``i`` starts at
``i * ramp / N``); each sends ``turns`` user messages, one at a time, waiting
``think_time`` between them, and optionally stays connected ``hold`` seconds
after its last turn (to measure idle connections). Everything is bounded: at
most ``MAX_SESSIONS`` sessions, a per-turn timeout, and a ``duration`` cap on
the whole run after which whatever still runs is stopped (its turn counted as
*aborted*, not failed).

The client must not be what limits the test, so the hot path is lean: frames
are received as bytes (no UTF-8 decode) and decoded by msgspec into a Struct of
two fields (``type``, ``seq``), skipping the rest; only ``error`` frames are
decoded again for their ``code``. Per event it does that decode, a ``seq``
check and one sample.

What is checked: the first frame is ``session``; ``seq`` is contiguous per
session and a turn ends by the rules every client of this package shares
(``gateway.client.stream``: ``check_seq`` and ``TurnTracker``). Unlike
``Client``, the load test reports faults instead of repairing them: a gap, a
repeat or a dropped connection is counted, never resumed. See
``gateway.client.report`` for what is measured and how it is reported.

Entry points: ``run_loadtest(config)`` (programmatic), ``LoadTest`` (the same,
with live ``counters`` and an optional per-event ``observer`` for benchmarks).
``LoadTestConfig`` (``gateway.client.loadtest_config``) declares each setting
once; the counters and the progress line are ``gateway.client.loadtest_progress``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import resource
import sys
import time
from typing import Final, NoReturn, Protocol, TextIO

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
)

from gateway.client.dial import NO_PROXY
from gateway.client.loadtest_config import MAX_SESSIONS, LoadTestConfig, ProgressMode
from gateway.client.loadtest_progress import LoadTestCounters, show_progress
from gateway.client.report import LoadTestReport, Reservoir, histogram
from gateway.client.stream import METRIC_GRACE, TurnTracker, check_seq
from gateway.common.pcm import last_loud_frame

__all__ = [
    "FD_MARGIN",
    "MAX_SESSIONS",
    "LoadTest",
    "LoadTestConfig",
    "LoadTestCounters",
    "LoadTestObserver",
    "ProgressMode",
    "check_seq",
    "raise_nofile_limit",
    "run_loadtest",
    "sized_message",
]

USER_AGENT: Final = "realtime-gateway-loadtest"

# Events that carry model output: the first one of a turn is "first token".
_CONTENT: Final = frozenset({"think", "respond", "call"})
# Error codes that warn but do not fail the turn (the stream goes on).
_NOTICE_CODES: Final = frozenset({"store", "log_trimmed"})
# Files besides the sessions' sockets (stdio, the event loop, imports, margin).
FD_MARGIN: Final = 64


class LoadTestObserver(Protocol):
    """Per-event hook for benchmarks (e.g. latency against a pacing schedule).

    Called inline on the client's hot path: keep it cheap. ``t`` is
    ``time.perf_counter()`` at arrival (or at send for ``turn_started``);
    ``data`` is the raw frame.
    """

    def turn_started(self, session: int, turn: int, t: float) -> None: ...

    def event(self, session: int, turn: int, kind: str, data: bytes, t: float) -> None: ...


class _Probe(msgspec.Struct):
    """The fields the client reads of every frame (msgspec skips the rest).

    ``seq_from`` is set on a frame that coalesces the chunks ``seq_from..seq``
    (the gateway merges chunks for a client that falls behind).
    """

    type: str
    seq: int = -1
    seq_from: int = -1


class _ErrorProbe(msgspec.Struct):
    code: str = ""
    content: str = ""


_probe_decoder: Final = msgspec.json.Decoder(_Probe)
_error_decoder: Final = msgspec.json.Decoder(_ErrorProbe)
_DECODE_ERRORS: Final = (msgspec.DecodeError, msgspec.ValidationError)


def sized_message(base: str, chars: int) -> str:
    """``base`` repeated (space-separated) and cut to exactly ``chars`` characters."""
    if chars <= 0:
        return ""
    unit = (base or "x") + " "
    text = (unit * (chars // len(unit) + 1))[:chars]
    return text[:-1] + "." if text.endswith(" ") else text


def raise_nofile_limit(need: int) -> int:
    """Raise this process's open-file soft limit towards ``need`` (up to the hard limit).

    Returns the soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return int(soft)


class _SessionOver(Exception):
    """This session cannot go on (already counted): close it and skip its remaining turns."""


class LoadTest:
    """One run of a load test. ``await LoadTest(config).run()`` returns the report.

    ``counters`` can be read while it runs; ``observer`` (optional) sees every
    event of every turn; ``out`` is where progress goes (default stderr).
    """

    def __init__(
        self,
        config: LoadTestConfig,
        *,
        observer: LoadTestObserver | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.config = config
        self.counters = LoadTestCounters()
        self.observer = observer
        self.out = out
        cap = config.sample_cap
        self.connect = Reservoir(cap, seed=1)
        self.ttfe = Reservoir(cap, seed=2)
        self.ttft = Reservoir(cap, seed=3)
        self.gap = Reservoir(cap, seed=4)
        self.turn = Reservoir(cap, seed=5)
        self.speech_to_respond = Reservoir(cap, seed=6)
        # The 20 ms frame of the recording where its speech ends (-1: none).
        self._last_loud_frame = (
            last_loud_frame(self.config.audio, self.config.audio_rate) if self.config.audio else -1
        )
        self.events_by_type: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.error_examples: dict[str, str] = {}
        self._payload = msgspec.json.encode({"type": "user", "content": config.message})
        headers = {"User-Agent": USER_AGENT}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._headers = headers
        self._t0 = 0.0
        self._done = asyncio.Event()
        self._stop = asyncio.Event()

    # ------------------------------------------------------------------ run

    async def run(self) -> LoadTestReport:
        cfg = self.config
        raise_nofile_limit(cfg.sessions + FD_MARGIN)
        started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._t0 = t0 = time.perf_counter()
        step = cfg.ramp / cfg.sessions
        tasks = [
            asyncio.create_task(self._session(i, t0 + i * step), name=f"loadtest:{i}")
            for i in range(cfg.sessions)
        ]
        progress = (
            asyncio.create_task(self._progress(), name="loadtest:progress")
            if cfg.progress != "off"
            else None
        )
        everything = asyncio.ensure_future(asyncio.wait(tasks))
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait(
                (everything, stop), timeout=cfg.duration, return_when=asyncio.FIRST_COMPLETED
            )
            pending = [task for task in tasks if not task.done()]
            by_request = bool(pending) and self._stop.is_set()
            by_duration = bool(pending) and not by_request
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        finally:
            everything.cancel()
            stop.cancel()
            for task in tasks:
                task.cancel()
            self._done.set()
            if progress is not None:
                with contextlib.suppress(BaseException):
                    await progress
        elapsed = time.perf_counter() - t0
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                self._error("client_bug", f"{type(exc).__name__}: {exc}")
        return self._report(started_at, elapsed, by_duration, by_request)

    def stop(self) -> None:
        """End the run now: what still runs is stopped as by the ``duration`` cap."""
        self._stop.set()

    def _report(
        self, started_at: str, elapsed: float, by_duration: bool, by_request: bool
    ) -> LoadTestReport:
        cfg, c = self.config, self.counters
        return LoadTestReport(
            url=cfg.url,
            sessions=cfg.sessions,
            turns_per_session=cfg.turns,
            ramp_s=cfg.ramp,
            think_time_s=cfg.think_time,
            hold_s=cfg.hold,
            message_chars=len(cfg.message),
            duration_cap_s=cfg.duration,
            turn_timeout_s=cfg.turn_timeout,
            started_at=started_at,
            elapsed_s=elapsed,
            stopped_by_duration=by_duration,
            stopped_by_request=by_request,
            sessions_connected=c.sessions_connected,
            sessions_failed=c.sessions_failed,
            sessions_peak_open=c.peak_open,
            turns_planned=cfg.sessions * cfg.turns,
            turns_ok=c.turns_ok,
            turns_failed=c.turns_failed,
            turns_aborted=c.turns_aborted,
            turns_skipped=c.turns_skipped,
            events=c.events,
            events_per_s=c.events / elapsed if elapsed > 0 else 0.0,
            coalesced_frames=c.coalesced_frames,
            coalesced_chunks=c.coalesced_chunks,
            events_by_type=dict(self.events_by_type),
            bytes_received=c.bytes,
            connect=self.connect.summary(),
            ttfe=self.ttfe.summary(),
            ttft=self.ttft.summary(),
            gap=self.gap.summary(),
            turn=self.turn.summary(),
            errors=dict(self.errors),
            error_examples=dict(self.error_examples),
            sample_cap=cfg.sample_cap,
            ttft_histogram=histogram(self.ttft),
            turn_histogram=histogram(self.turn),
            speech_to_respond=self.speech_to_respond.summary(),
        )

    def _error(self, kind: str, example: str = "") -> None:
        self.counters.errors += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if kind not in self.error_examples:
            self.error_examples[kind] = example

    def _closed(self, exc: ConnectionClosed) -> None:
        close = exc.rcvd
        if close is None:
            self._error("close_1006", "connection lost without a close frame")
        else:
            self._error(f"close_{close.code}", close.reason)

    # ------------------------------------------------------------------ one session

    async def _session(self, index: int, start_at: float) -> None:
        cfg, c = self.config, self.counters
        delay = start_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ws: ClientConnection | None = None
        unsent = cfg.turns
        in_turn = opened = cancelled = False
        try:
            t0 = time.perf_counter()
            ws, last = await self._open()
            self.connect.add(time.perf_counter() - t0)
            opened = True
            c.sessions_connected += 1
            if cfg.audio:
                configure = {"type": "configure", "input_audio": {"rate": cfg.audio_rate}}
                await ws.send(msgspec.json.encode(configure), text=True)
            c.sessions_open += 1
            if c.sessions_open > c.peak_open:
                c.peak_open = c.sessions_open
            for turn in range(cfg.turns):
                if turn and cfg.think_time:
                    await asyncio.sleep(cfg.think_time)
                unsent -= 1
                in_turn = True
                last = await self._turn(ws, index, turn, last)
                in_turn = False
            if cfg.hold:
                await self._hold(ws)
        except _SessionOver:
            in_turn = False
        except asyncio.CancelledError:
            cancelled = True
            if in_turn:
                c.turns_aborted += 1
            raise
        except Exception as exc:  # a client-side bug must not stop the other sessions
            if in_turn:
                c.turns_failed += 1
            self._error("client_bug", f"{type(exc).__name__}: {exc}")
        finally:
            c.turns_skipped += unsent
            if opened:
                c.sessions_open -= 1
            elif not cancelled:  # stopped before it connected: not a failure
                c.sessions_failed += 1
            if ws is not None:
                with contextlib.suppress(Exception):
                    await ws.close()

    async def _open(self) -> tuple[ClientConnection, int]:
        cfg = self.config
        try:
            ws = await connect(
                cfg.url,
                additional_headers=self._headers,
                user_agent_header=None,
                compression=None,
                open_timeout=cfg.connect_timeout,
                ping_interval=None,
                close_timeout=cfg.close_timeout,
                max_size=cfg.max_frame,
                **NO_PROXY,
            )
        except InvalidStatus as exc:
            response = exc.response
            body = response.body.decode("utf-8", "replace").strip() if response.body else ""
            self._fail(f"http_{response.status_code}", body or response.reason_phrase)
        except TimeoutError:
            self._fail("connect_timeout", f"no WebSocket handshake within {cfg.connect_timeout:g}s")
        except ConnectionRefusedError as exc:
            self._fail("connect_refused", str(exc))
        except InvalidURI as exc:
            self._fail("bad_url", str(exc))
        except InvalidHandshake as exc:
            self._fail("handshake_failed", f"{type(exc).__name__}: {exc}")
        except OSError as exc:
            self._fail("connect_error", f"{type(exc).__name__}: {exc}")
        try:
            async with asyncio.timeout(cfg.connect_timeout):
                data = await ws.recv(decode=False)
        except TimeoutError:
            await _abort(ws)
            self._fail("session_frame_timeout", f"no session frame within {cfg.connect_timeout:g}s")
        except ConnectionClosed as exc:
            self._closed(exc)
            raise _SessionOver from exc
        self.counters.bytes += len(data)
        try:
            probe = _probe_decoder.decode(data)
        except _DECODE_ERRORS:
            probe = _Probe(type="")
        if probe.type != "session" or probe.seq < 0:
            await _abort(ws)
            self._fail("bad_first_frame", f"expected a session frame, got {bytes(data[:120])!r}")
        return ws, probe.seq

    def _fail(self, kind: str, example: str) -> NoReturn:
        self._error(kind, example)
        raise _SessionOver

    async def _turn(self, ws: ClientConnection, index: int, turn: int, last: int) -> int:
        """Send one user message and read its events; the new last seq."""
        c = self.counters
        observer = self.observer
        by_type = self.events_by_type
        gap = self.gap.add
        decode = _probe_decoder.decode
        now = time.perf_counter
        failed = False
        first = first_token = True
        tracker = TurnTracker()
        t = prev_t = t_send = now()
        speaker: asyncio.Task[None] | None = None
        speech_end: list[float] = []  # when the speech's last frame went out
        spoken = True  # the first respond after speech is still to come
        try:
            recv = ws.recv
            async with asyncio.timeout(self.config.turn_timeout):
                if self.config.audio:
                    speaker = asyncio.create_task(
                        self._speak(ws, speech_end), name=f"speak:{index}"
                    )
                else:
                    await ws.send(self._payload, text=True)
                if observer is not None:
                    observer.turn_started(index, turn, t_send)
                while True:
                    if tracker.closing:  # a metric may follow the closing event, or not
                        try:
                            async with asyncio.timeout(METRIC_GRACE):
                                data = await recv(decode=False)
                        except TimeoutError:
                            break
                    else:
                        data = await recv(decode=False)
                    t = now()
                    c.events += 1
                    c.bytes += len(data)
                    try:
                        probe = decode(data)
                    except _DECODE_ERRORS as exc:
                        self._error("bad_frame", f"{exc}: {bytes(data[:120])!r}")
                        failed = True
                        continue
                    kind = probe.type
                    seq = probe.seq
                    if seq == last + 1 and probe.seq_from < 0:
                        last = seq
                    else:
                        if probe.seq_from >= 0:
                            c.coalesced_frames += 1
                            c.coalesced_chunks += seq - probe.seq_from + 1
                        last, problem = check_seq(kind, seq, last, probe.seq_from)
                        if problem is not None:
                            self._error(problem, f"{kind} event with seq {seq} after seq {last}")
                            failed = True
                    by_type[kind] = by_type.get(kind, 0) + 1
                    if first:
                        first = False
                        self.ttfe.add(t - t_send)
                    else:
                        gap(t - prev_t)
                    prev_t = t
                    if observer is not None:
                        observer.event(index, turn, kind, data, t)
                    code = ""
                    if kind in _CONTENT:
                        if first_token:
                            first_token = False
                            self.ttft.add(t - t_send)
                        if spoken and kind == "respond" and speaker is not None:
                            spoken = False
                            if speech_end:
                                self.speech_to_respond.add(t - speech_end[0])
                    elif kind == "error":
                        try:
                            err = _error_decoder.decode(data)
                        except _DECODE_ERRORS:
                            err = _ErrorProbe()
                        code = err.code
                        self._error(f"error_{code or 'unknown'}", err.content)
                        if code not in _NOTICE_CODES:
                            failed = True
                    elif kind == "cancelled":
                        self._error("cancelled", "the turn was cancelled (by another client?)")
                        failed = True
                    elif kind == "interrupt":
                        self._error("interrupt", "the turn was interrupted and is being rerun")
                    if tracker.ends_before(kind) or tracker.feed(kind, code):
                        break
        except TimeoutError:
            c.turns_failed += 1
            self._error("turn_timeout", f"turn not finished within {self.config.turn_timeout:g}s")
            raise _SessionOver from None
        except ConnectionClosed as exc:
            c.turns_failed += 1
            self._closed(exc)
            raise _SessionOver from exc
        finally:
            if speaker is not None and not speaker.done():
                speaker.cancel()
        self.turn.add(t - t_send)
        if failed:
            c.turns_failed += 1
        else:
            c.turns_ok += 1
        return last

    async def _speak(self, ws: ClientConnection, speech_end: list[float]) -> None:
        """Stream the recording at real-time pace in 20 ms frames, then 1 s of silence
        (for the VAD to hear its end); ``speech_end`` gets when the last frame with
        speech in it went out (``last_loud_frame``: a recording's trailing silence
        is not speech, and the answer may come before the file has been sent)."""
        cfg = self.config
        size = cfg.audio_rate // 50 * 2
        pcm = cfg.audio + bytes(cfg.audio_rate * 2)
        last_loud = self._last_loud_frame
        due = time.monotonic()
        for index, at in enumerate(range(0, len(pcm), size)):
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                # Behind (a busy machine): go on from now, never faster than real time.
                # A burst to catch up would play the trailing silence faster than the
                # VAD's window, and the answer would seem to come sooner after speech.
                due = time.monotonic()
            await ws.send(pcm[at : at + size], text=False)
            due += 0.02
            if index == last_loud:
                speech_end.append(time.perf_counter())
                # The silence after the speech is timed from this stamp: had this frame
                # gone out late (a slow wake-up, a send that waited), the frames due
                # next would make up the delay, and the VAD's window would seem to
                # end sooner after the speech than it did.
                due = max(due, time.monotonic() + 0.02)

    async def _hold(self, ws: ClientConnection) -> None:
        """Stay connected, idle, for ``hold`` seconds; a close by the server is an error."""
        try:
            async with asyncio.timeout(self.config.hold):
                while True:
                    data = await ws.recv(decode=False)
                    self.counters.events += 1
                    self.counters.bytes += len(data)
                    self._error("unexpected_event", f"while idle: {bytes(data[:120])!r}")
        except TimeoutError:
            return
        except ConnectionClosed as exc:
            self._closed(exc)
            raise _SessionOver from exc

    async def _progress(self) -> None:
        out = self.out or sys.stderr
        await show_progress(self.config, self.counters, out, self._done, self._t0)


async def _abort(ws: ClientConnection) -> None:
    with contextlib.suppress(Exception):
        ws.transport.abort()
    with contextlib.suppress(Exception):
        await ws.wait_closed()


async def run_loadtest(
    config: LoadTestConfig, *, observer: LoadTestObserver | None = None
) -> LoadTestReport:
    """Run one load test and return its report (progress per ``config.progress``)."""
    return await LoadTest(config, observer=observer).run()
