"""``gateway loadtest URL``: the command line of the load test (``gateway.client.loadtest`` runs it).

The run's flags are ``LoadTestConfig``'s settings, added from their
declarations (``gateway.common.settings.add_flags``; the required ``url`` is the
positional argument), so a flag's name, range, default and help are written
once, beside the field. ``NOT_FLAGS`` names the settings
this command sets another way or leaves to programmatic use. The command's own
flags are what a run's settings are not: how to make the message
(``--message-chars``, ``--audio FILE.wav``) and what to do with the report
(``--json``, ``--fail-if``, ``--compare``, ``--progress``/``--quiet``).

Before the run, one TCP connection checks that something listens at the
URL: a gateway that is not running is one line, not a table of zeros; a run
in which no session connected (every handshake refused, say with 401) ends
with one line too, naming the first refusal.

Exit status: 0 every turn succeeded with no error and every ``--fail-if``
held; 1 something failed; 2 bad arguments, nothing listening at the URL or
no session connected (or the JSON file cannot be written).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import wave
from pathlib import Path
from typing import Final, TextIO
from urllib.parse import urlsplit

import msgspec

from gateway.client.dial import token_from_env
from gateway.client.judge import compare_reports, parse_threshold
from gateway.client.loadtest import (
    FD_MARGIN,
    LoadTest,
    LoadTestConfig,
    ProgressMode,
    raise_nofile_limit,
    sized_message,
)
from gateway.client.phone_loadtest import (
    PhoneLoadTest,
    encode_phone_report,
    format_phone_report,
)
from gateway.client.report import LoadTestReport, decode_report, encode_report, format_report
from gateway.common.pcm import read_wav
from gateway.common.settings import add_flags, flag_values

__all__ = ["NOT_FLAGS", "add_loadtest_arguments", "config_from_args", "run_loadtest_cli"]

NOT_FLAGS: Final = frozenset(
    {
        "progress",  # --progress / --quiet, and whether stderr is a terminal
        "audio",  # --audio FILE.wav: the file's samples ...
        "audio_rate",  # ... and its rate
        # For programs that run the engine (the benchmarks), not for the command:
        "close_timeout",
        "progress_interval",
        "sample_cap",
        "max_frame",
    }
)
MAX_MESSAGE_CHARS: Final = 1 << 20


def add_loadtest_arguments(parser: argparse.ArgumentParser) -> None:
    """Define ``gateway loadtest``'s arguments (see ``config_from_args``)."""
    add_flags(parser, LoadTestConfig, skip=NOT_FLAGS)

    turn = parser.add_argument_group("what each turn sends, besides --message")
    turn.add_argument(
        "--message-chars",
        type=_message_chars,
        default=None,
        metavar="N",
        help="repeat --message to exactly N characters (long messages make long responses "
        "from the simulator, which echoes them)",
    )
    turn.add_argument(
        "--audio",
        dest="audio_file",  # not LoadTestConfig.audio: that is the file's samples
        default=None,
        metavar="FILE.wav",
        help="each turn speaks this 16-bit PCM WAV file at real-time pace (server VAD) "
        "instead of sending --message; reports speech end → first respond",
    )

    report = parser.add_argument_group("the report")
    report.add_argument(
        "--json",
        dest="json_path",
        default=None,
        metavar="FILE",
        help="write the full report as JSON",
    )
    report.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="COND",
        help="exit 1 when COND holds, e.g. p99_ttft_ms>200 or errors>0 (repeatable; "
        "names: {p50,p95,p99,max,mean}_{connect,ttfe,ttft,gap,turn}_ms, errors, report fields)",
    )
    report.add_argument(
        "--compare",
        default=None,
        metavar="FILE",
        help="a previous run's --json report: print how this run differs from it",
    )
    shown = report.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        dest="progress_bar",  # not LoadTestConfig.progress: that is worked out from both flags
        action="store_true",
        help="show the progress bar even when stderr is not a terminal",
    )
    shown.add_argument("--quiet", action="store_true", help="no progress output on stderr")


def _message_chars(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_MESSAGE_CHARS:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_MESSAGE_CHARS}, got {value}")
    return value


def config_from_args(ns: argparse.Namespace, *, stderr: TextIO | None = None) -> LoadTestConfig:
    """The ``LoadTestConfig`` of parsed ``add_loadtest_arguments`` flags (``ValueError`` if bad)."""
    err = stderr or sys.stderr
    progress: ProgressMode
    if ns.quiet:
        progress = "off"
    elif ns.progress_bar or err.isatty():
        progress = "bar"
    else:
        progress = "lines"
    audio, audio_rate = b"", 24000
    if ns.audio_file:
        try:
            audio, audio_rate = read_wav(ns.audio_file)
        except (OSError, EOFError, wave.Error) as exc:
            raise ValueError(f"--audio {ns.audio_file}: {exc}") from exc
    values = flag_values(ns, LoadTestConfig)
    if not values.get("token"):
        values["token"] = token_from_env()  # unset: None, as no --token
    config = LoadTestConfig(**values, progress=progress, audio=audio, audio_rate=audio_rate)
    if ns.message_chars is not None:
        config = msgspec.structs.replace(
            config, message=sized_message(config.message, ns.message_chars)
        )
    return config


async def run_loadtest_cli(ns: argparse.Namespace) -> int:
    """``gateway loadtest``: run, print the table, write ``--json``; the exit status."""
    try:
        config = config_from_args(ns)
    except ValueError as exc:
        print(f"gateway loadtest: {exc}", file=sys.stderr)
        return 2
    need = config.sessions + FD_MARGIN
    if raise_nofile_limit(need) < need:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        print(
            f"gateway loadtest: {config.sessions} sessions need about {need} open files but "
            f"the limit is {soft}: raise it (ulimit -n {need}) or use fewer sessions",
            file=sys.stderr,
        )
        return 2
    try:
        thresholds = [parse_threshold(text) for text in ns.fail_if]
        before = _read_report(ns.compare) if ns.compare else None
    except ValueError as exc:
        print(f"gateway loadtest: {exc}", file=sys.stderr)
        return 2
    unreachable = await listening(config.url, config.connect_timeout)
    if unreachable is not None:
        print(f"gateway loadtest: {unreachable}", file=sys.stderr)
        return 2
    if config.phone:
        return await _run_phone(config, ns)
    report = await LoadTest(config).run()
    if report.sessions_connected == 0 and report.sessions_failed > 0 and report.errors:
        kind = next(iter(report.errors))
        example = report.error_examples.get(kind, "")
        print(
            f"gateway loadtest: none of the {report.sessions} sessions connected to "
            f"{config.url}: {kind} {example}".rstrip(),
            file=sys.stderr,
        )
        if ns.json_path:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(Path(ns.json_path).write_bytes, encode_report(report))
        return 2
    broken = [t for t in thresholds if t.broken(report)]
    text = format_report(report)
    if before is not None:
        text += f"\n\n{compare_reports(before, report)}"
    for t in broken:
        text += f"\nthreshold failed: {t} ({t.name} = {t.value(report):g})"
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # `gateway loadtest | head`: the reader left. Point stdout at /dev/null so
        # the interpreter's final flush does not raise (and print a traceback).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    if ns.json_path:
        try:
            await asyncio.to_thread(Path(ns.json_path).write_bytes, encode_report(report))
        except OSError as exc:
            print(f"gateway loadtest: cannot write {ns.json_path}: {exc}", file=sys.stderr)
            return 2
    return 0 if report.ok and not broken else 1


async def _run_phone(config: LoadTestConfig, ns: argparse.Namespace) -> int:
    """``--phone``: calls dialled as a carrier dials (``gateway.client.phone_loadtest``)."""
    if ns.fail_if or ns.compare:
        print("gateway loadtest: --fail-if and --compare are not for --phone runs", file=sys.stderr)
        return 2
    token = os.environ.get("TWILIO_AUTH_TOKEN") or None
    report = await PhoneLoadTest(config, auth_token=token, barge_in=config.phone_barge_in).run()
    print(format_phone_report(report), flush=True)
    if ns.json_path:
        try:
            await asyncio.to_thread(Path(ns.json_path).write_bytes, encode_phone_report(report))
        except OSError as exc:
            print(f"gateway loadtest: cannot write {ns.json_path}: {exc}", file=sys.stderr)
            return 2
    return 0 if report.ok else 1


async def listening(url: str, timeout: float) -> str | None:
    """Why nothing can be load-tested at ``url`` (None: something accepts connections)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "wss" else 80)
    except ValueError:
        return f"{url!r} has no valid port: use ws://HOST:PORT/v1/realtime"
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return f"nothing is listening at {url}: is the gateway running? (start it: gateway serve)"
    except TimeoutError:
        return f"{url} accepted no connection within {timeout:g}s (--connect-timeout)"
    except OSError as exc:
        return f"cannot reach {url}: {exc.strerror or exc}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


def _read_report(path: str) -> LoadTestReport:
    try:
        return decode_report(Path(path).read_bytes())
    except OSError as exc:
        raise ValueError(f"--compare: cannot read {path}: {exc.strerror or exc}") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"--compare: {path} is not a loadtest --json report ({exc})") from None
