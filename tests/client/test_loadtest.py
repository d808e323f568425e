"""The load-test client: against a real in-process gateway, and against scripted servers.

Scripted servers (a few lines of ``websockets``) produce exactly the faults the
client must classify: a seq gap, an error event, a close mid-turn, a turn that
never ends. No assertion is about timing: only counts, kinds and ordering.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
from websockets.asyncio.server import ServerConnection, serve

from gateway.app import running_gateway
from gateway.client.loadtest import (
    MAX_SESSIONS,
    LoadTest,
    LoadTestConfig,
    check_seq,
    run_loadtest,
    sized_message,
)
from gateway.client.loadtest_cli import add_loadtest_arguments, config_from_args, run_loadtest_cli
from gateway.client.loadtest_progress import LoadTestCounters, progress_line
from gateway.client.report import (
    LatencySummary,
    LoadTestReport,
    Reservoir,
    decode_report,
    format_report,
    percentile,
)
from gateway.common.pcm import last_loud_frame, silence, tone
from gateway.config import load_config
from tests.support.redis_server import free_port

Handler = Callable[[ServerConnection], Awaitable[None]]


def assert_ordered(s: LatencySummary) -> None:
    assert 0.0 <= s.p50_ms <= s.p95_ms <= s.p99_ms <= s.max_ms


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gateway loadtest")
    add_loadtest_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
async def gateway_url() -> AsyncIterator[str]:
    async with running_gateway(load_config({"port": 0})) as gw:
        yield gw.url


@contextlib.asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[str]:
    """A WebSocket server on 127.0.0.1 running ``handler`` per connection."""
    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/realtime"


def frame(kind: str, seq: int, **fields: object) -> bytes:
    return msgspec.json.encode({"type": kind, "seq": seq, "timestamp": 0.0, **fields})


async def session_frame(ws: ServerConnection, head: int = 0) -> None:
    await ws.send(frame("session", head, session_id="s1"), text=True)


async def send_all(ws: ServerConnection, frames: list[bytes]) -> None:
    for data in frames:
        await ws.send(data, text=True)


def turn_frames(first: int, *, skip: int | None = None) -> list[bytes]:
    """A normal turn's events from seq ``first``; ``skip`` leaves one seq out."""
    kinds = ["user", "think", "respond", "respond", "end", "metric"]
    out, seq = [], first
    for kind in kinds:
        if seq == skip:
            seq += 1
        extra: dict[str, object] = {}
        if kind in ("user", "think", "respond"):
            extra["content"] = "x"
        if kind == "metric":
            extra = {"step": {"input": 1, "output": 1}, "total": {"input": 1, "output": 1}}
        out.append(frame(kind, seq, **extra))
        seq += 1
    return out


# --------------------------------------------------------------------- real gateway


async def test_counts_against_a_real_gateway(gateway_url: str, tmp_path: Path) -> None:
    config = LoadTestConfig(url=gateway_url, sessions=20, turns=2)
    report = await run_loadtest(config)

    assert report.errors == {}
    assert report.ok
    assert report.sessions_connected == 20
    assert report.sessions_failed == 0
    assert 1 <= report.sessions_peak_open <= 20
    assert report.turns_planned == report.turns_ok == 40
    assert report.turns_failed == report.turns_aborted == report.turns_skipped == 0
    assert not report.stopped_by_duration
    # Every turn: the user echo, model output, end, metric.
    assert report.events_by_type["user"] == 40
    assert report.events_by_type["end"] == 40
    assert report.events_by_type["metric"] == 40
    assert report.events_by_type["think"] >= 40
    assert report.events_by_type["respond"] >= 40
    assert report.events == sum(report.events_by_type.values())
    assert report.events_per_s > 0
    assert report.connect.count == 20
    assert report.ttfe.count == report.ttft.count == report.turn.count == 40
    assert report.gap.count == report.events - 40
    for summary in (report.connect, report.ttfe, report.ttft, report.gap, report.turn):
        assert_ordered(summary)
    # The first event comes before the first token, which comes before the turn's end.
    assert report.ttfe.max_ms <= report.turn.max_ms
    assert "ok 40/40" in format_report(report)


async def test_cli_writes_a_json_report_that_decodes(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    ns = parse(gateway_url, "--sessions", "5", "--turns", "2", "--quiet", "--json", str(out))
    ns.token = "secret-key"

    assert await run_loadtest_cli(ns) == 0

    report = decode_report(out.read_bytes())
    assert isinstance(report, LoadTestReport)
    assert report.turns_ok == 10
    assert report.errors == {}
    assert "secret-key" not in out.read_text()
    printed = capsys.readouterr()
    assert "ok 10/10" in printed.out
    assert printed.err == ""  # --quiet


async def test_message_and_duration_flags_reach_the_run(gateway_url: str) -> None:
    ns = parse(gateway_url, "--message", "ping", "--message-chars", "300", "--quiet")
    config = config_from_args(ns)
    assert len(config.message) == 300
    assert config.message.startswith("ping ping")
    report = await LoadTest(config).run()
    assert report.ok
    assert report.message_chars == 300


# --------------------------------------------------------------------- refusals


async def test_a_wrong_path_is_counted_as_http_404(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = gateway_url.replace("/v1/realtime", "/v2/nothing")
    out = tmp_path / "r.json"
    ns = parse(url, "--sessions", "3", "--turns", "2", "--quiet", "--json", str(out))

    # No session connected: one line that names the refusal, no table of zeros.
    assert await run_loadtest_cli(ns) == 2

    report = decode_report(out.read_bytes())
    assert report.errors == {"http_404": 3}
    assert "/v1/realtime" in report.error_examples["http_404"]
    assert report.sessions_failed == 3
    assert report.sessions_connected == 0
    assert report.turns_ok == 0
    assert report.turns_skipped == 6
    assert not report.ok
    printed = capsys.readouterr()
    assert printed.out == ""
    [line] = printed.err.splitlines()
    assert line.startswith("gateway loadtest: none of the 3 sessions connected")
    assert "http_404" in line and "/v1/realtime" in line


async def test_nothing_listening_is_connect_refused() -> None:
    url = f"ws://127.0.0.1:{free_port()}/v1/realtime"
    report = await run_loadtest(LoadTestConfig(url=url, sessions=2, turns=1))
    assert report.errors == {"connect_refused": 2}
    assert report.turns_skipped == 2


@pytest.mark.parametrize("phone", [False, True])
async def test_the_command_against_nothing_listening_says_so_in_one_line_and_exits_2(
    phone: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/v1/phone/twilio" if phone else "/v1/realtime"
    url = f"ws://127.0.0.1:{free_port()}{path}"
    ns = parse(url, "--sessions", "3", *(["--phone"] if phone else []))

    assert await run_loadtest_cli(ns) == 2

    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.splitlines() == [
        f"gateway loadtest: nothing is listening at {url}: is the gateway running? "
        "(start it: gateway serve)"
    ]


async def test_token_is_sent_as_a_bearer_header() -> None:
    seen: list[str | None] = []

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        seen.append(ws.request.headers.get("Authorization"))
        await session_frame(ws)
        await ws.recv()
        await send_all(ws, turn_frames(1))
        await ws.wait_closed()

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=1, token="k1"))
    assert report.ok
    assert seen == ["Bearer k1"]


# --------------------------------------------------------------------- faults mid-stream


async def test_a_seq_gap_is_detected_and_fails_the_turn() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.recv()
        await send_all(ws, turn_frames(1, skip=3))  # seq 3 never comes
        await ws.recv()
        await send_all(ws, turn_frames(8))  # the next turn is contiguous again
        await ws.wait_closed()

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=2, turns=2))
    assert report.errors == {"seq_gap": 2}
    assert report.turns_failed == 2
    assert report.turns_ok == 2


async def test_a_repeated_seq_is_a_duplicate_but_an_error_reply_is_not() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws, head=10)
        await ws.recv()
        frames = turn_frames(11)
        # An unlogged error reply repeats the last seq: allowed. A logged event
        # repeating a seq is not.
        frames.insert(2, frame("error", 12, code="turn_active", content="busy"))
        frames.insert(4, frames[3])
        await send_all(ws, frames)
        await ws.wait_closed()

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=1, turns=1))
    assert report.errors == {"seq_duplicate": 1, "error_turn_active": 1}
    assert report.turns_failed == 1


async def test_error_events_are_counted_by_code_and_end_the_turn_at_end() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.recv()
        # The upstream-failure shape: metric, error, end — and no metric after end.
        await send_all(
            ws,
            [
                frame("user", 1, content="hi"),
                frame("metric", 2, step={}, total={}),
                frame("error", 3, code="upstream", content="the model's API failed"),
                frame("end", 4),
            ],
        )
        await ws.wait_closed()

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=1, turn_timeout=30))
    assert report.errors == {"error_upstream": 1}
    assert report.error_examples["error_upstream"] == "the model's API failed"
    assert report.turns_failed == 1
    assert report.turns_ok == 0


async def test_metric_then_end_also_ends_a_turn() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        for first in (1, 5):
            await ws.recv()
            await send_all(
                ws,
                [
                    frame("user", first, content="hi"),
                    frame("respond", first + 1, content="no end marker"),
                    frame("metric", first + 2, step={}, total={}),
                    frame("end", first + 3),
                ],
            )
        await ws.wait_closed()

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=1, turns=2))
    assert report.ok
    assert report.turns_ok == 2


async def test_a_close_mid_turn_is_counted_by_close_code() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.recv()
        await ws.send(frame("user", 1, content="hi"), text=True)
        await ws.close(1012, "node draining")

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=3, turns=2))
    assert report.errors == {"close_1012": 3}
    assert report.error_examples["close_1012"] == "node draining"
    assert report.turns_failed == 3
    assert report.turns_skipped == 3


async def test_a_turn_that_never_ends_times_out() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.recv()
        await ws.send(frame("user", 1, content="hi"), text=True)
        await ws.wait_closed()

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=2, turns=3, turn_timeout=0.2))
    assert report.errors == {"turn_timeout": 2}
    assert report.turns_failed == 2
    assert report.turns_skipped == 4


async def test_the_duration_cap_stops_the_run_and_counts_aborted_turns() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.recv()
        await ws.wait_closed()

    async with scripted(handler) as url:
        # Long enough for four sessions to connect and start a turn on a loaded machine
        # (at 0.3 s a CI run's sessions were still connecting when the cap came).
        report = await run_loadtest(
            LoadTestConfig(url=url, sessions=4, turns=2, duration=2.0, turn_timeout=60)
        )
    assert report.stopped_by_duration
    assert report.turns_aborted == 4
    assert report.turns_skipped == 4
    assert report.turns_failed == 0
    assert report.errors == {}


async def test_sessions_the_cap_stops_before_they_start_are_not_failures() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.wait_closed()

    async with scripted(handler) as url:
        # Session 0 starts at once and holds; session 1 would start after the cap.
        config = LoadTestConfig(url=url, sessions=2, turns=0, ramp=120, hold=60, duration=0.3)
        report = await run_loadtest(config)
    assert report.stopped_by_duration
    assert report.sessions_connected == 1
    assert report.sessions_failed == 0
    assert report.errors == {}


async def test_stop_ends_a_run_early() -> None:
    messages = 0
    all_sent = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        nonlocal messages
        await session_frame(ws)
        await ws.recv()  # a user message: this session is open on the client side
        messages += 1
        if messages == 3:
            all_sent.set()
        await ws.wait_closed()  # the turn never ends

    async with scripted(handler) as url:
        lt = LoadTest(LoadTestConfig(url=url, sessions=3, turns=1))
        task = asyncio.create_task(lt.run())
        await asyncio.wait_for(all_sent.wait(), 30)
        lt.stop()
        report = await task
    assert report.stopped_by_request
    assert not report.stopped_by_duration
    assert report.sessions_peak_open == 3
    assert report.turns_aborted == 3
    assert report.errors == {}


async def test_a_first_frame_that_is_not_session_is_reported() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.send(frame("respond", 1, content="hi"), text=True)
        await ws.wait_closed()

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=1))
    assert report.errors == {"bad_first_frame": 1}
    assert report.sessions_failed == 1


async def test_idle_sessions_are_held_open_and_progress_lines_are_written() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.wait_closed()

    out = io.StringIO()
    async with scripted(handler) as url:
        config = LoadTestConfig(
            url=url, sessions=5, turns=0, hold=0.2, progress="lines", progress_interval=0.05
        )
        report = await LoadTest(config, out=out).run()
    assert report.ok
    assert report.sessions_peak_open == 5
    assert report.events == 0
    lines = out.getvalue().splitlines()
    assert lines
    assert all(line.startswith("loadtest ") and "ev/s" in line for line in lines)


async def test_the_server_closing_an_idle_session_is_an_error() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.close(1001, "going away")

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=2, turns=0, hold=30))
    assert report.errors == {"close_1001": 2}


# --------------------------------------------------------------------- units


def test_check_seq() -> None:
    assert check_seq("think", 5, 4) == (5, None)
    assert check_seq("think", 7, 4) == (7, "seq_gap")
    assert check_seq("think", 4, 4) == (4, "seq_duplicate")
    assert check_seq("think", 2, 4) == (4, "seq_duplicate")
    # An error reply to the client's own frame is not logged: it repeats the last seq.
    assert check_seq("error", 4, 4) == (4, None)
    assert check_seq("error", 5, 4) == (5, None)
    assert check_seq("error", 9, 4) == (9, "seq_gap")


def test_check_seq_of_coalesced_frames() -> None:
    # A frame carrying chunks 5..9 continues after 4 and moves the check to 9.
    assert check_seq("respond", 9, 4, seq_from=5) == (9, None)
    assert check_seq("respond", 9, 4, seq_from=6) == (9, "seq_gap")
    assert check_seq("respond", 9, 6, seq_from=5) == (9, "seq_duplicate")
    assert check_seq("respond", 4, 4, seq_from=9)[1] == "seq_duplicate"


async def test_coalesced_frames_are_contiguous_and_counted() -> None:
    async def handler(ws: ServerConnection) -> None:
        await session_frame(ws)
        await ws.recv()
        await send_all(
            ws,
            [
                frame("user", 1, content="hi"),
                frame("think", 4, content="abc", seq_from=2),
                frame("respond", 5, content="x"),
                frame("respond", 7, content="yz", seq_from=6),
                frame("end", 8),
                frame("metric", 9, step={}, total={}),
            ],
        )
        await ws.wait_closed()

    async with scripted(handler) as url:
        report = await run_loadtest(LoadTestConfig(url=url, sessions=1))
    assert report.ok
    assert report.events == 6
    assert report.coalesced_frames == 2
    assert report.coalesced_chunks == 5
    assert "coalesced" in format_report(report)


def test_seq_checking_over_a_stream() -> None:
    last, problems = 0, []
    for kind, seq in [("user", 1), ("think", 2), ("think", 4), ("think", 5), ("end", 5)]:
        last, problem = check_seq(kind, seq, last)
        problems.append(problem)
    assert problems == [None, None, "seq_gap", None, "seq_duplicate"]
    assert last == 5


def test_percentile_is_nearest_rank() -> None:
    data = [float(i) for i in range(1, 101)]
    assert percentile(data, 50) == 50.0
    assert percentile(data, 95) == 95.0
    assert percentile(data, 99) == 99.0
    assert percentile(data, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) == 0.0


def test_reservoir_is_exact_below_its_cap() -> None:
    r = Reservoir(cap=1000)
    for i in range(1000, 0, -1):
        r.add(i / 1000)
    s = r.summary()
    assert s.count == 1000
    assert not s.sampled
    assert s.p50_ms == pytest.approx(500.0)
    assert s.p99_ms == pytest.approx(990.0)
    assert s.max_ms == pytest.approx(1000.0)
    assert s.mean_ms == pytest.approx(500.5)


def test_reservoir_bounds_memory_and_keeps_exact_count_and_max() -> None:
    r = Reservoir(cap=500, seed=7)
    n = 200_000
    for i in range(n):
        r.add((i % 1000) / 1000)  # uniform over [0, 1)
    s = r.summary()
    assert len(r.samples) == 500
    assert s.count == n
    assert s.sampled
    assert s.max_ms == pytest.approx(999.0)
    assert_ordered(s)
    # A uniform sample of a uniform distribution: the median is near the middle.
    assert 350.0 < s.p50_ms < 650.0


def test_empty_summary_is_zero() -> None:
    assert Reservoir().summary() == LatencySummary()


def test_sized_message() -> None:
    assert sized_message("hello", 5) == "hello"
    assert sized_message("hello", 12) == "hello hello."
    assert len(sized_message("ab", 1001)) == 1001
    assert sized_message("x", 0) == ""


def test_limits_are_enforced() -> None:
    with pytest.raises(ValueError, match="sessions"):
        LoadTestConfig(url="ws://127.0.0.1:1/v1/realtime", sessions=MAX_SESSIONS + 1)
    with pytest.raises(ValueError, match="duration"):
        LoadTestConfig(url="ws://127.0.0.1:1/v1/realtime", duration=0)
    with pytest.raises(ValueError, match="WebSocket URL"):
        LoadTestConfig(url="http://127.0.0.1:1/")
    with pytest.raises(SystemExit):
        parse("ws://127.0.0.1:1/v1/realtime", "--sessions", str(MAX_SESSIONS + 1))
    with pytest.raises(SystemExit):
        parse("ws://127.0.0.1:1/v1/realtime", "--turn-timeout", "0")
    with pytest.raises(SystemExit):
        parse("ws://127.0.0.1:1/v1/realtime", "--quiet", "--progress")


def test_progress_mode_follows_the_flags() -> None:
    not_a_tty = io.StringIO()
    url = "ws://127.0.0.1:1/v1/realtime"
    assert config_from_args(parse(url), stderr=not_a_tty).progress == "lines"
    assert config_from_args(parse(url, "--progress"), stderr=not_a_tty).progress == "bar"
    assert config_from_args(parse(url, "--quiet"), stderr=not_a_tty).progress == "off"


def test_progress_bar_line() -> None:
    config = LoadTestConfig(url="ws://127.0.0.1:1/v1/realtime", sessions=4, turns=5)
    counters = LoadTestCounters()
    counters.turns_ok = 10
    counters.sessions_open = 4
    counters.errors = 2
    line = progress_line(config, counters, 3.0, 1234.0, bar=True)
    assert line.startswith("[##########..........]")
    assert "open     4/4" in line
    assert "turns      10/20" in line
    assert "1,234 ev/s" in line
    assert "errors 2" in line


def test_the_report_table_lists_errors() -> None:
    async def go() -> LoadTestReport:
        url = f"ws://127.0.0.1:{free_port()}/v1/realtime"
        return await run_loadtest(LoadTestConfig(url=url, sessions=1))

    text = format_report(asyncio.run(go()))
    assert "connect_refused" in text
    assert "connected 0/1" in text


async def test_a_closed_pipe_gives_no_traceback(gateway_url: str) -> None:
    # `gateway loadtest URL | true`: the reader is gone before the report is written.
    proc = await asyncio.create_subprocess_shell(
        f"{sys.executable} -m gateway.cli loadtest {gateway_url} --quiet --sessions 2 | true",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert out == b""
    assert "Traceback" not in err.decode()
    assert "BrokenPipe" not in err.decode()


async def test_thresholds_fail_the_run_and_say_which(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first.json"
    ns = parse(gateway_url, "--sessions", "3", "--quiet", "--json", str(first))
    assert await run_loadtest_cli(ns) == 0
    printed = capsys.readouterr().out
    assert "first token (ms)" in printed  # the histogram
    assert sum(decode_report(first.read_bytes()).ttft_histogram.counts) == 3

    ns = parse(
        gateway_url,
        "--sessions",
        "3",
        "--quiet",
        "--fail-if",
        "p99_ttft_ms>0",
        "--fail-if",
        "errors>0",
        "--compare",
        str(first),
    )
    assert await run_loadtest_cli(ns) == 1
    printed = capsys.readouterr().out
    assert "threshold failed: p99_ttft_ms>0 (p99_ttft_ms = " in printed
    assert "errors>0" not in printed  # it held: no errors
    assert "compared with" in printed and "p99_ttft_ms" in printed


async def test_a_bad_threshold_or_compare_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "ws://127.0.0.1:1/v1/realtime"
    assert await run_loadtest_cli(parse(url, "--fail-if", "p99_nope_ms>1")) == 2
    assert "unknown figure" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert await run_loadtest_cli(parse(url, "--compare", str(bad))) == 2
    assert "not a loadtest --json report" in capsys.readouterr().err


class _SlowOnce:
    """A socket whose send of one frame takes ``delay`` (a send that waits for the
    network, or a late wake-up); it records when each frame went out."""

    def __init__(self, slow_index: int, delay: float) -> None:
        self.slow_index = slow_index
        self.delay = delay
        self.sent_at: list[float] = []

    async def send(self, data: bytes, text: bool = False) -> None:
        if len(self.sent_at) == self.slow_index:
            await asyncio.sleep(self.delay)
        self.sent_at.append(time.perf_counter())


async def test_the_silence_after_speech_is_paced_from_when_the_speech_went_out() -> None:
    """A late last speech frame must not be made up by the silence after it: the
    VAD would then hear its window end sooner after the stamped speech end, and
    speech-to-respond would read under the VAD's wait (a CI run saw 498 ms)."""
    rate = 16000
    audio = silence(0.1, rate) + tone(0.5, rate)
    test = LoadTest(LoadTestConfig(url="ws://127.0.0.1:9/", audio=audio, audio_rate=rate))
    last_loud = last_loud_frame(audio, rate)
    ws = _SlowOnce(last_loud, 0.05)
    speech_end: list[float] = []
    async with asyncio.timeout(10):
        await test._speak(ws, speech_end)  # type: ignore[arg-type]
    assert len(speech_end) == 1
    # 500 ms of silence after the speech, 20 ms a frame: not sent before 500 ms passed.
    window_end = ws.sent_at[last_loud + 25]
    assert window_end - speech_end[0] >= 0.5 - 0.001
