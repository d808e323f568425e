"""``gateway eval scenarios.toml``: scripted conversations against a gateway, judged per turn.

Each scenario (``gateway.client.evals``) runs in its own session, the
scenarios concurrently (``--concurrency``), each ``--repeat`` times; every
turn is judged against its expectations. Printed: a row per turn (its pass
rate over the repeats, latency, tokens, cost), then each failure in a line;
``--junit FILE`` writes JUnit XML for CI (a test case per turn and repeat).

Exit status: 0 every expectation held; 1 one did not; 2 the file is not a
scenario file, or the gateway cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Final, TextIO

import msgspec

from gateway.client import Client, ClientError, ConfigureRefused
from gateway.client.dial import normalize_url
from gateway.client.evals import Scenario, ScenarioError, check, read_scenarios
from gateway.client.replay import ReplayOptions, ReplayRefused, replay
from gateway.client.replay_plan import PlanError, plan_replay
from gateway.client.transcript import Turn, turns_of
from gateway.pcm import read_wav
from protocol.events import Event

__all__ = ["TurnResult", "add_eval_arguments", "run_eval_cli", "run_scenario"]

DEFAULT_URL: Final = "ws://127.0.0.1:8765/v1/realtime"


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenarios", metavar="FILE.toml", help="the scenario file")
    parser.add_argument("--url", help=f"the gateway (default: the file's url, else {DEFAULT_URL})")
    parser.add_argument("--token", help="an API key of that gateway (Bearer)")
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="run each scenario N times: pass rates"
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, metavar="N", help="scenarios run at once (4)"
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
    scenario: Scenario, url: str, token: str | None, run: int, turn_timeout: float, base: Path
) -> list[TurnResult]:
    """One run of ``scenario`` in a new session (or one forked from its recording)."""
    session_id: str | None = None
    if scenario.from_ is not None:
        session_id = await _forked(scenario, url, token, base, turn_timeout)
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
    scenario: Scenario, url: str, token: str | None, base: Path, turn_timeout: float
) -> str:
    assert scenario.from_ is not None
    path = base / scenario.from_
    try:
        data = await asyncio.to_thread(path.read_bytes)
        plan = plan_replay(data, fork_at=scenario.fork_at)
    except OSError as exc:
        raise _ScenarioFailed(f"cannot read {path}: {exc.strerror or exc}") from None
    except PlanError as exc:
        raise _ScenarioFailed(f"{path}: {exc}") from None
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


async def run_eval_cli(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    """``gateway eval``: read, run, print, write the XML; the exit status."""
    out = out or sys.stdout
    err = sys.stderr
    source = Path(ns.scenarios)
    try:
        text = await asyncio.to_thread(source.read_text)
        scenarios = read_scenarios(text, str(source))
        url, note = normalize_url(ns.url or scenarios.url or DEFAULT_URL)
    except OSError as exc:
        print(f"gateway eval: cannot read {source}: {exc.strerror or exc}", file=err)
        return 2
    except (ScenarioError, ClientError) as exc:
        print(f"gateway eval: {exc}", file=err)
        return 2
    if ns.repeat < 1 or ns.concurrency < 1:
        print("gateway eval: --repeat and --concurrency are whole numbers >= 1", file=err)
        return 2
    if note:
        print(f"gateway eval: {note}", file=err)
    gate = asyncio.Semaphore(ns.concurrency)
    problems: list[str] = []

    async def one(scenario: Scenario, run: int) -> list[TurnResult]:
        async with gate:
            try:
                return await run_scenario(
                    scenario, url, ns.token, run, ns.turn_timeout, source.parent
                )
            except _ScenarioFailed as exc:
                problems.append(f"scenario {scenario.name!r}: {exc}")
            except ClientError as exc:
                problems.append(f"scenario {scenario.name!r}: {exc}")
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

    runs = [one(s, r) for s in scenarios.scenario for r in range(1, ns.repeat + 1)]
    results = [r for batch in await asyncio.gather(*runs) for r in batch]
    for problem in problems:
        print(f"gateway eval: {problem}", file=err)
    if problems and len(problems) == len(runs):
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
