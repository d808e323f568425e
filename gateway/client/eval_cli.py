"""``gateway eval scenarios.toml``: scripted conversations against a gateway, judged per turn.

Each scenario (``gateway.client.evals``) runs in its own session, the
scenarios concurrently (``--concurrency``), each ``--repeat`` times; every
turn is judged against its expectations. Printed: a row per turn (its pass
rate over the repeats, latency, tokens, cost), then each failure in a line;
``--junit FILE`` writes JUnit XML for CI (a test case per turn and repeat).

**Where the key goes.** The API key (``--token``, or the ``GATEWAY_TOKEN``
environment variable) is sent only to the gateway given on the command line
(``--url``, else the default): in CI scenario files come from pull requests,
and a file's ``url`` may name anyone's server. A file's ``url`` is used with
a key only when ``--allow-url`` names it; without a key it is used as is.

**Untrusted files.** The scenario file and the recordings it starts from
are read within bounds before parsing (``evals``, ``replay_plan``), and
every recording is read and planned before anything runs: a bad file is one
line and exit 2, before a connection.

Exit status: 0 every expectation held; 1 one did not; 2 a flag out of
range, the file is not a scenario file (or a recording it names is not one
to replay), or the gateway cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Final, TextIO

import msgspec

from gateway.client import Client, ClientError, ConfigureRefused
from gateway.client.dial import TOKEN_ENV, Refused, Unreachable, normalize_url, token_from_env
from gateway.client.evals import (
    MAX_SCENARIO_BYTES,
    Scenario,
    ScenarioError,
    ScenarioFile,
    check,
    read_scenarios,
)
from gateway.client.files import FileRefused, read_bounded
from gateway.client.replay import ReplayOptions, ReplayRefused, replay
from gateway.client.replay_plan import MAX_RECORDING_BYTES, Plan, PlanError, plan_replay
from gateway.client.transcript import Turn, turns_of
from gateway.common.pcm import read_wav
from protocol.events import Event

__all__ = ["TurnResult", "add_eval_arguments", "run_eval_cli", "run_scenario"]

DEFAULT_URL: Final = "ws://127.0.0.1:8765/v1/realtime"
MAX_REPEAT: Final = 1000
MAX_CONCURRENCY: Final = 256
MAX_FROM_BYTES: Final = MAX_RECORDING_BYTES
"""The recordings a scenario file starts from, together: each is read and planned first,
so they take memory as one recording of that size would."""


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenarios", metavar="FILE.toml", help="the scenario file")
    parser.add_argument(
        "--url",
        help=f"the gateway (default: the file's url, without a key or when --allow-url names "
        f"it, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        help=f"an API key of the gateway (Bearer), sent only to --url or an --allow-url "
        f"(default: ${TOKEN_ENV}, which other processes cannot read as they can a command line)",
    )
    parser.add_argument(
        "--allow-url",
        action="append",
        default=[],
        metavar="URL",
        help="a url the scenario file may name that the key may be sent to (repeatable)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help=f"run each scenario N times: pass rates (1..{MAX_REPEAT})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=4,
        metavar="N",
        help=f"scenarios run at once (4; at most {MAX_CONCURRENCY})",
    )
    parser.add_argument("--junit", type=Path, metavar="FILE.xml", help="write JUnit XML (for CI)")
    parser.add_argument(
        "--turn-timeout", type=float, default=60.0, metavar="S", help="longest wait for a turn"
    )


class TurnResult(msgspec.Struct, kw_only=True):
    """One turn of one run of a scenario, judged."""

    scenario: str
    run: int
    index: int
    user: str
    failures: list[str]
    turn: Turn | None
    seconds: float


class _ScenarioFailed(Exception):
    """A scenario could not run at all (its session refused, its recording unreadable)."""


async def run_scenario(
    scenario: Scenario,
    url: str,
    token: str | None,
    run: int,
    turn_timeout: float,
    plan: Plan | None = None,
) -> list[TurnResult]:
    """One run of ``scenario`` in a new session (or one forked from ``plan``, the
    replay of its recording)."""
    session_id: str | None = None
    if plan is not None:
        session_id = await _forked(scenario, plan, url, token, turn_timeout)
    results: list[TurnResult] = []
    try:
        async with Client(url, token=token, session_id=session_id) as client:
            fields: dict[str, Any] = {
                k: v
                for k, v in (
                    ("instructions", scenario.instructions),
                    ("provider", scenario.provider),
                    ("model", scenario.model),
                )
                if v is not None
            }
            if fields:
                await client.configure(**fields)
            spoken_rate = 0
            for index, step in enumerate(scenario.turn, start=1):
                started = time.monotonic()
                stream: list[tuple[float, Event]] = []
                try:
                    async with asyncio.timeout(turn_timeout):
                        if step.say is not None:
                            pcm, rate = await speech(step.say, step.voice)
                            if rate != spoken_rate:
                                spoken_rate = rate
                                await client.configure(input_audio=_spoken(rate))
                            events = client.speak(pcm, rate)
                        else:
                            assert step.user is not None
                            events = client.send(step.user)
                        async for event in events:
                            stream.append((time.monotonic(), event))
                except TimeoutError:
                    pass
                turns = turns_of(stream)
                turn = turns[0] if turns else None
                failures = check(turn, step.expect)
                if turn is not None and turn.outcome == "open":
                    failures.insert(0, f"the turn did not end within {turn_timeout:g} s")
                results.append(
                    TurnResult(
                        scenario=scenario.name,
                        run=run,
                        index=index,
                        user=step.text,
                        failures=failures,
                        turn=turn,
                        seconds=time.monotonic() - started,
                    )
                )
                if turn is not None and turn.outcome == "open":
                    break  # the session is still in that turn: the next would be refused
    except ConfigureRefused as exc:
        raise _ScenarioFailed(f"the gateway refused its configuration: {exc}") from None
    return results


def _spoken(rate: int) -> dict[str, Any]:
    return {"format": "pcm16", "rate": rate, "turn_detection": "server_vad"}


async def speech(text: str, voice: str) -> tuple[bytes, int]:
    """``text`` spoken by espeak-ng in ``voice``: PCM16 and its rate."""
    with tempfile.TemporaryDirectory(prefix="gateway-eval-") as folder:
        wav = Path(folder) / "say.wav"
        try:
            proc = await asyncio.create_subprocess_exec(
                "espeak-ng",
                "-v",
                voice,
                "-w",
                str(wav),
                "--",
                text,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            raise _ScenarioFailed(
                "a spoken turn (say = ...) needs espeak-ng: install it (apt install espeak-ng) "
                "or write the turn as user = ..."
            ) from None
        _, err = await proc.communicate()
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip()[:200]
            raise _ScenarioFailed(f"espeak-ng could not say it in voice {voice!r}: {why}")
        return await asyncio.to_thread(read_wav, wav)


async def _forked(
    scenario: Scenario, plan: Plan, url: str, token: str | None, turn_timeout: float
) -> str:
    options = ReplayOptions(
        url=url,
        token=token,
        provider=scenario.provider,
        model=scenario.model,
        instructions=scenario.instructions,
        fork_at=scenario.fork_at,
        turn_timeout=turn_timeout,
    )
    try:
        result = await replay(plan, options)
    except ReplayRefused as exc:
        raise _ScenarioFailed(str(exc)) from None
    return result.session_id


def _flag_problem(ns: argparse.Namespace) -> str | None:
    """What is wrong with the flags' values, in one line (None: nothing)."""
    if not 1 <= ns.repeat <= MAX_REPEAT:
        return f"--repeat {ns.repeat}: give a whole number from 1 to {MAX_REPEAT}"
    if not 1 <= ns.concurrency <= MAX_CONCURRENCY:
        return f"--concurrency {ns.concurrency}: give a whole number from 1 to {MAX_CONCURRENCY}"
    if not (math.isfinite(ns.turn_timeout) and 0 < ns.turn_timeout <= 86400):
        return f"--turn-timeout {ns.turn_timeout:g}: give seconds above 0 (at most 86400)"
    return None


def gateway_url(
    cli_url: str | None, file_url: str | None, allowed: list[str], token: str | None
) -> tuple[str, str | None]:
    """The gateway to run on, and a note if its URL was corrected. A key goes only to
    the command line's gateway: a file's url with a key must be ``allowed``
    (``ClientError`` says so)."""
    if cli_url is not None:
        return normalize_url(cli_url)
    if file_url is None:
        return normalize_url(DEFAULT_URL)
    url, note = normalize_url(file_url)
    if token is not None and url not in {normalize_url(a)[0] for a in allowed}:
        raise ClientError(
            f"the scenario file names url = {file_url!r}, and an API key is sent only to a "
            f"gateway given on the command line, never to a url from a file: pass --url {url} "
            f"(or --allow-url {url}) to send it there"
        )
    return url, note


def read_plans(scenarios: ScenarioFile, source: Path) -> dict[int, Plan]:
    """The replay of every recording the scenarios start from (by scenario index), each
    read within bounds and planned now: a bad one is a ``ScenarioError`` before
    anything runs."""
    plans: dict[int, Plan] = {}
    read: dict[tuple[Path, int | None], Plan] = {}
    total = 0
    for index, scenario in enumerate(scenarios.scenario):
        if scenario.from_ is None:
            continue
        path = source.parent / scenario.from_
        where = f"{source}: scenario {scenario.name!r}: from = {scenario.from_!r}"
        key = (path, scenario.fork_at)
        if key not in read:
            try:
                data = read_bounded(path, MAX_RECORDING_BYTES, "a recording")
                total += len(data)
                if total > MAX_FROM_BYTES:
                    raise ScenarioError(
                        f"{where}: the recordings the scenarios start from take more than "
                        f"{MAX_FROM_BYTES:,} bytes together: split the file"
                    )
                read[key] = plan_replay(data, fork_at=scenario.fork_at)
            except OSError as exc:
                raise ScenarioError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
            except (FileRefused, PlanError) as exc:
                raise ScenarioError(f"{where}: {exc}") from None
        plans[index] = read[key]
    return plans


def _read_file(source: Path) -> tuple[ScenarioFile, dict[int, Plan]]:
    data = read_bounded(source, MAX_SCENARIO_BYTES, "a scenario file")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{source}: not UTF-8 text (byte {exc.start}): not TOML") from None
    scenarios = read_scenarios(text, str(source))
    return scenarios, read_plans(scenarios, source)


async def run_eval_cli(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    """``gateway eval``: read, run, print, write the XML; the exit status."""
    out = out or sys.stdout
    err = sys.stderr
    problem = _flag_problem(ns)
    if problem is not None:
        print(f"gateway eval: {problem}", file=err)
        return 2
    token = ns.token or token_from_env()
    source = Path(ns.scenarios)
    try:
        scenarios, plans = await asyncio.to_thread(_read_file, source)
        url, note = gateway_url(ns.url, scenarios.url, ns.allow_url, token)
    except OSError as exc:
        print(f"gateway eval: cannot read {source}: {exc.strerror or exc}", file=err)
        return 2
    except (ScenarioError, ClientError, FileRefused) as exc:
        print(f"gateway eval: {exc}", file=err)
        return 2
    if note:
        print(f"gateway eval: {note}", file=err)
    gate = asyncio.Semaphore(ns.concurrency)
    problems: dict[str, list[str]] = {}  # what went wrong → the scenarios it happened to
    gone: list[str] = []  # the gateway cannot be reached: no run tries again

    async def one(index: int, scenario: Scenario, run: int) -> list[TurnResult]:
        async with gate:
            try:
                if gone:
                    raise _ScenarioFailed(gone[0])
                return await run_scenario(
                    scenario, url, token, run, ns.turn_timeout, plans.get(index)
                )
            except (Unreachable, Refused) as exc:
                if isinstance(exc, Unreachable) or exc.final:
                    gone.append(str(exc))
                problems.setdefault(str(exc), []).append(scenario.name)
            except (_ScenarioFailed, ClientError) as exc:
                problems.setdefault(str(exc), []).append(scenario.name)
            return [
                TurnResult(
                    scenario=scenario.name,
                    run=run,
                    index=i,
                    user=t.text,
                    failures=["the scenario could not run (see above)"],
                    turn=None,
                    seconds=0.0,
                )
                for i, t in enumerate(scenario.turn, start=1)
            ]

    runs = [one(i, s, r) for i, s in enumerate(scenarios.scenario) for r in range(1, ns.repeat + 1)]
    results = [r for batch in await asyncio.gather(*runs) for r in batch]
    failed = sum(len(names) for names in problems.values())
    if failed == len(runs) and len(problems) == 1:
        print(f"gateway eval: {next(iter(problems))}", file=err)  # the same for every run
        return 2
    for problem, names in problems.items():
        distinct = list(dict.fromkeys(names))
        more = f" (and {len(distinct) - 1} more)" if len(distinct) > 1 else ""
        print(f"gateway eval: scenario {distinct[0]!r}{more}: {problem}", file=err)
    if failed == len(runs):
        return 2
    out.write(format_results(results, ns.repeat))
    out.flush()
    if ns.junit is not None:
        try:
            await asyncio.to_thread(ns.junit.write_bytes, junit_xml(results))
        except OSError as exc:
            print(f"gateway eval: cannot write {ns.junit}: {exc.strerror or exc}", file=err)
            return 2
    return 1 if any(r.failures for r in results) else 0


def format_results(results: list[TurnResult], repeat: int) -> str:
    """A row per scenario turn (pass rate over the repeats), then each failure."""
    header = ("scenario", "turn", "user", "passed", "end ms", "tokens", "cost $")
    rows = [header]
    keyed: dict[tuple[str, int], list[TurnResult]] = {}
    for r in results:
        keyed.setdefault((r.scenario, r.index), []).append(r)
    for (name, index), runs in keyed.items():
        passed = sum(1 for r in runs if not r.failures)
        ends = [r.turn.end_ms for r in runs if r.turn is not None and r.turn.end_ms is not None]
        tokens = [r.turn.input_tokens + r.turn.output_tokens for r in runs if r.turn is not None]
        costs = [r.turn.cost for r in runs if r.turn is not None]
        mark = "ok" if passed == len(runs) else "FAIL"
        rows.append(
            (
                _clip(name, 32),
                str(index),
                _clip(runs[0].user, 32),
                f"{passed}/{len(runs)} {mark}",
                f"{sum(ends) / len(ends):.0f}" if ends else "-",
                f"{sum(tokens) // len(tokens)}" if tokens else "-",
                f"{sum(costs) / len(costs):.4f}" if costs else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.append("")
    failed = [r for r in results if r.failures]
    for r in failed:
        run = f" (run {r.run})" if repeat > 1 else ""
        for failure in r.failures:
            lines.append(f"FAIL {r.scenario} turn {r.index}{run}: {failure}")
    total = len(results)
    lines.append(f"{total - len(failed)} of {total} turns passed")
    return "\n".join(lines) + "\n"


def junit_xml(results: list[TurnResult]) -> bytes:
    """JUnit XML: a test suite per scenario, a test case per turn and run."""
    root = ET.Element("testsuites", name="gateway eval")
    suites: dict[str, ET.Element] = {}
    for r in results:
        suite = suites.get(r.scenario)
        if suite is None:
            suite = suites[r.scenario] = ET.SubElement(root, "testsuite", name=r.scenario)
        case = ET.SubElement(
            suite,
            "testcase",
            classname=r.scenario,
            name=f"turn {r.index} (run {r.run}): {_clip(r.user, 60)}",
            time=f"{r.seconds:.3f}",
        )
        if r.failures:
            failure = ET.SubElement(case, "failure", message=r.failures[0])
            failure.text = "\n".join(r.failures)
    for suite in suites.values():
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    root.set("tests", str(len(results)))
    root.set("failures", str(sum(1 for r in results if r.failures)))
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
