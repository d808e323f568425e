"""``gateway loadtest --phone URL``: many concurrent phone calls, dialled as a carrier dials.

Each of ``sessions`` calls is a ``gateway.client.carrier.SimulatedCall`` on
the media-stream endpoint (``ws://HOST:PORT/v1/phone/twilio``), signed with
the Twilio auth token (``TWILIO_AUTH_TOKEN``) when one is given; with
``--phone-webhook`` each call first asks the number's voice webhook for its
stream (its one-time token), as Twilio does. A call
says its utterance ``turns`` times at real time (``--audio FILE.wav``,
resampled to 8 kHz μ-law, or a 0.8 s tone between silences), waits for the
answer and plays it to its end, echoing marks as a carrier does, then hangs
up. Calls start over ``ramp`` seconds; ``duration`` caps the run.

``--phone-barge-in``: the caller speaks again ``BARGE_IN_AFTER`` seconds
into each answer instead of hearing it out, and the report adds barge-in →
silence (the caller's first speech frame over the answer to the ``clear``
that stopped it).

What it reports (``PhoneLoadReport``): speech end (the utterance's last loud
frame sent) → the answer's first audio received, as percentiles; barge-in
→ silence; calls and turns that worked; media, marks and clears counted.
It imports the protocol, ``pcm`` and this package only (a client program).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
import urllib.error
from typing import Final

import msgspec
from websockets.exceptions import InvalidStatus

from gateway.client.carrier import CallSetup, SimulatedCall, speech_mulaw
from gateway.client.loadtest import raise_nofile_limit
from gateway.client.loadtest_config import LoadTestConfig
from gateway.client.report import LatencySummary, Reservoir
from gateway.common.pcm import resample, silence, tone

__all__ = [
    "BARGE_IN_AFTER",
    "PhoneLoadReport",
    "PhoneLoadTest",
    "encode_phone_report",
    "format_phone_report",
]

BARGE_IN_AFTER: Final = 0.3
"""Seconds into an answer's playback the caller speaks over it (``--phone-barge-in``)."""
CALL_RATE: Final = 8000


class PhoneLoadReport(msgspec.Struct, kw_only=True):
    """The outcome of a phone load test (``--json FILE`` writes exactly this)."""

    url: str
    calls: int
    turns_per_call: int
    ramp_s: float
    barge_in: bool
    started_at: str
    elapsed_s: float
    stopped_by_duration: bool
    calls_connected: int
    calls_failed: int
    turns_planned: int
    turns_ok: int
    turns_failed: int
    media_received: int
    marks_echoed: int
    clears: int
    played_s: float
    first_audio: LatencySummary
    """The caller's speech end → the answer's first audio received."""
    barge_in_to_silence: LatencySummary
    """The caller's first speech frame over an answer → the answer stopped (``clear``)."""
    errors: dict[str, int]
    error_examples: dict[str, str]

    @property
    def ok(self) -> bool:
        return (
            not self.errors
            and self.turns_ok == self.turns_planned
            and self.calls_connected == self.calls
        )


def caller_speech(config: LoadTestConfig) -> bytes:
    """What each caller says, as 8 kHz μ-law: the ``audio`` given, or a tone."""
    if config.audio:
        pcm = resample(config.audio, config.audio_rate, CALL_RATE)
    else:
        pcm = silence(0.3, CALL_RATE) + tone(0.8, CALL_RATE) + silence(0.8, CALL_RATE)
    return speech_mulaw(pcm)


class PhoneLoadTest:
    """One run: ``await PhoneLoadTest(config).run()`` returns the report."""

    def __init__(
        self, config: LoadTestConfig, *, auth_token: str | None = None, barge_in: bool = False
    ) -> None:
        self.config = config
        self.auth_token = auth_token
        self.barge_in = barge_in
        self.speech = caller_speech(config)
        self.first_audio = Reservoir(config.sample_cap, seed=1)
        self.barge = Reservoir(config.sample_cap, seed=2)
        self.errors: dict[str, int] = {}
        self.error_examples: dict[str, str] = {}
        self.connected = self.failed = self.turns_ok = self.turns_failed = 0
        self.media = self.marks = self.clears = self.played_ms = 0

    async def run(self) -> PhoneLoadReport:
        cfg = self.config
        raise_nofile_limit(cfg.sessions + 64)
        started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        step = cfg.ramp / cfg.sessions
        tasks = [
            asyncio.create_task(self._call(i, t0 + i * step), name=f"phone-call:{i}")
            for i in range(cfg.sessions)
        ]
        _, pending = await asyncio.wait(tasks, timeout=cfg.duration)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                self._error("client_bug", f"{type(exc).__name__}: {exc}")
        return PhoneLoadReport(
            url=cfg.url,
            calls=cfg.sessions,
            turns_per_call=cfg.turns,
            ramp_s=cfg.ramp,
            barge_in=self.barge_in,
            started_at=started_at,
            elapsed_s=time.perf_counter() - t0,
            stopped_by_duration=bool(pending),
            calls_connected=self.connected,
            calls_failed=self.failed,
            turns_planned=cfg.sessions * cfg.turns,
            turns_ok=self.turns_ok,
            turns_failed=self.turns_failed,
            media_received=self.media,
            marks_echoed=self.marks,
            clears=self.clears,
            played_s=self.played_ms / 1000,
            first_audio=self.first_audio.summary(),
            barge_in_to_silence=self.barge.summary(),
            errors=dict(self.errors),
            error_examples=dict(self.error_examples),
        )

    def _error(self, kind: str, example: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.error_examples.setdefault(kind, example[:200])

    async def _call(self, index: int, start_at: float) -> None:
        cfg = self.config
        delay = start_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        call = SimulatedCall(
            CallSetup(
                url=cfg.url,
                auth_token=self.auth_token,
                parameters={"from": f"+1555{index:07d}", "to": "+15550000000"},
                webhook_url=cfg.phone_webhook or None,
            )
        )
        try:
            await call.dial(timeout=cfg.connect_timeout)
        except InvalidStatus as exc:
            self.failed += 1
            body = exc.response.body.decode("utf-8", "replace") if exc.response.body else ""
            self._error(f"http_{exc.response.status_code}", body.strip())
            return
        except urllib.error.HTTPError as exc:  # the voice webhook refused (before OSError)
            self.failed += 1
            body = exc.read().decode("utf-8", "replace")
            self._error(f"webhook_{exc.code}", body.strip())
            return
        except (OSError, TimeoutError, ValueError) as exc:
            self.failed += 1
            self._error("connect_error", f"{type(exc).__name__}: {exc}")
            return
        self.connected += 1
        try:
            for turn in range(cfg.turns):
                if turn and cfg.think_time:
                    await asyncio.sleep(cfg.think_time)
                await self._turn(call)
        except ConnectionError:
            pass  # counted by _turn (stream_closed, with the reason): the call is over
        finally:
            with contextlib.suppress(Exception):
                await call.hang_up()
            self.media += call.media_received
            self.marks += call.marks_echoed
            self.clears += call.clears
            self.played_ms += call.played_ms
            for value in call.barge_in_to_silence:
                self.barge.add(value)

    async def _turn(self, call: SimulatedCall) -> None:
        timeout = self.config.turn_timeout
        try:
            async with asyncio.timeout(timeout):
                await call.say(self.speech)
                self.first_audio.add(await call.answered(timeout))
                if self.barge_in:
                    start = call.played_ms
                    await call.wait_for(lambda: call.played_ms - start >= BARGE_IN_AFTER * 1000)
                    await call.say(self.speech)  # over the answer: the gateway clears it
                    self.first_audio.add(await call.answered(timeout))
                await call.heard_all(timeout)
            self.turns_ok += 1
        except TimeoutError:
            self.turns_failed += 1
            self._error("turn_timeout", f"no answer heard within {timeout:g}s")
        except ConnectionError as exc:
            self.turns_failed += 1
            self._error("stream_closed", str(exc))
            raise


_encoder: Final = msgspec.json.Encoder()


def encode_phone_report(report: PhoneLoadReport) -> bytes:
    return msgspec.json.format(_encoder.encode(report), indent=2) + b"\n"


def _ms(value: float) -> str:
    return f"{value:,.1f}"


def format_phone_report(r: PhoneLoadReport) -> str:
    """A compact text table of ``r`` for the terminal."""
    lines = [
        f"phone load test {r.url}",
        f"  {r.calls} calls x {r.turns_per_call} turns, ramp {r.ramp_s:g}s"
        + (", barging in" if r.barge_in else ""),
        f"  elapsed {r.elapsed_s:.2f}s"
        + ("  (stopped by the --duration cap)" if r.stopped_by_duration else ""),
        f"  calls     connected {r.calls_connected}/{r.calls}  failed {r.calls_failed}",
        f"  turns     ok {r.turns_ok}/{r.turns_planned}  failed {r.turns_failed}",
        f"  media {r.media_received:,} frames, {r.played_s:,.1f}s played, "
        f"marks echoed {r.marks_echoed:,}, clears {r.clears:,}",
        "",
        f"  {'latency (ms)':<26}{'count':>7}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}{'mean':>9}",
    ]
    rows = [("speech end → first audio", r.first_audio)]
    if r.barge_in:
        rows.append(("barge-in → silence", r.barge_in_to_silence))
    for name, s in rows:
        lines.append(
            f"  {name:<26}{s.count:>7,}{_ms(s.p50_ms):>9}{_ms(s.p95_ms):>9}"
            f"{_ms(s.p99_ms):>9}{_ms(s.max_ms):>9}{_ms(s.mean_ms):>9}"
        )
    lines.append("")
    if r.errors:
        lines.append("  errors:")
        for kind, count in sorted(r.errors.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"    {kind:<24}{count:>8,}  {r.error_examples.get(kind, '')[:100]}")
    else:
        lines.append("  errors: none")
    return "\n".join(lines)
