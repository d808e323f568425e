"""``gateway eval``: scenario files run against a gateway process, as CI runs them.

The manual's example file (docs/examples/scenarios.toml) passes against
``gateway serve`` on its simulator; a file with one passing and one failing
expectation prints both, writes JUnit XML and exits 1; a scenario can start
from a recording; a bad file is one line that says what to fix. The
expectations themselves are checked without sockets below.

Scenario files are untrusted (in CI they come from pull requests): the key
goes only to the command line's gateway, and a file that is not TOML, too
large, too deep, with too many scenarios, no scenario, no turns, a bad
``from`` or a pattern RE2 cannot run is one line and exit 2 before a
connection; a pattern that would backtrack for ever runs in linear time. The
gateways and the recording are the module's (``tests/client/conftest.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from gateway.cli import main
from gateway.client.dial import TOKEN_ENV
from gateway.client.evals import Expect, ScenarioError, ToolExpect, check, read_scenarios
from gateway.client.transcript import ToolUse, Turn
from tests.client.conftest import API_KEY
from tests.support.procs import NodeProcess
from tests.support.recorded import gateway_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "scenarios.toml"

MIXED = """
[[scenario]]
name = "greets"

[[scenario.turn]]
user = "hello"
expect = { contains = "Echo: hello", no_tool = true }

[[scenario.turn]]
user = "hello again"
expect = { contains = "Bonjour" }
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_the_readme_example_passes_against_the_simulator(
    module_fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    fresh_gateway = module_fresh_gateway
    doc = (ROOT / "docs" / "recording.md").read_text()
    assert EXAMPLE.read_text() in doc  # the manual shows the file the suite runs
    junit = tmp_path / "eval.xml"
    code, out, err = await gateway_cli(
        "eval", str(EXAMPLE), "--url", fresh_gateway.url, "--junit", str(junit), "--repeat", "2"
    )
    assert code == 0, out + err
    assert "6 of 6 turns passed" in out and "2/2 ok" in out
    assert ET.parse(junit).getroot().get("failures") == "0"


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_a_failing_expectation_is_printed_with_the_passing_one_in_junit_and_exits_1(
    module_fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    fresh_gateway = module_fresh_gateway
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(MIXED)
    junit = tmp_path / "eval.xml"
    code, out, err = await gateway_cli(
        "eval", str(scenarios), "--url", fresh_gateway.url, "--junit", str(junit)
    )
    assert code == 1, out + err
    rows = out.splitlines()
    assert any("hello " in r and "1/1 ok" in r for r in rows), out
    assert any("hello again" in r and "0/1 FAIL" in r for r in rows), out
    assert "FAIL greets turn 2: the answer does not contain 'Bonjour': 'Echo: hello again'" in out
    root = ET.parse(junit).getroot()
    cases = root.findall("./testsuite/testcase")
    assert [c.find("failure") is not None for c in cases] == [False, True]
    assert root.get("tests") == "2" and root.get("failures") == "1"


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_scenario_goes_on_from_a_recording(
    recorded_file: Path, module_fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    fresh_gateway = module_fresh_gateway
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(
        f"""
[[scenario]]
name = "after the recorded call"
from = "{recorded_file}"
fork_at = 5

[[scenario.turn]]
user = "/context"
expect = {{ matches = "Context: [1-9]", ends = "end" }}
"""
    )
    code, out, err = await gateway_cli("eval", str(scenarios), "--url", fresh_gateway.url)
    assert code == 0, out + err


async def test_a_file_that_is_not_a_scenario_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text('[[scenario]]\nname = "x"\n[[scenario.turn]]\nuser = "hi"\nexpct = {}\n')
    code, _, err = await gateway_cli("eval", str(scenarios))
    assert code == 2 and "expct" in err and len(err.strip().splitlines()) == 1, err


def test_expectations_say_how_a_turn_fell_short() -> None:
    turn = Turn(
        user="hi",
        tools=[ToolUse("search", {"pattern": "TODO", "path": "."})],
        answer="Found 3.",
        outcome="end",
        end_ms=900.0,
        cost=0.02,
    )
    assert check(turn, Expect(tool=ToolExpect("search", {"pattern": "re:^TO"}))) == []
    assert check(turn, Expect(tool=ToolExpect("search", {"pattern": "FIXME"}))) == [
        """search was called with {"pattern":"TODO","path":"."}, not with {'pattern': 'FIXME'}"""
    ]
    assert check(turn, Expect(no_tool=True, latency_ms=500, cost_usd=0.01, ends="cancelled")) == [
        "expected no tool call; the model called search",
        "the turn ended end, not cancelled",
        "the turn took 900 ms (over 500 ms)",
        "the turn cost $0.020000 (over $0.01)",
    ]
    assert check(None, Expect()) != []


def test_a_bad_pattern_is_refused_before_anything_runs() -> None:
    with pytest.raises(ScenarioError, match="not a regular expression"):
        read_scenarios(
            '[[scenario]]\nname = "x"\n[[scenario.turn]]\nuser = "a"\nexpect = { matches = "(" }\n'
        )


def test_a_turn_is_typed_or_spoken_not_both() -> None:
    with pytest.raises(ScenarioError, match="either user = TEXT"):
        read_scenarios('[[scenario]]\nname = "x"\n[[scenario.turn]]\nuser = "a"\nsay = "a"\n')


# ------------------------------------------------------------------ untrusted files

NOWHERE = "ws://127.0.0.1:1/v1/realtime"  # nothing listens: a refusal comes before dialling
ONE_TURN = '[[scenario]]\nname = "s{i}"\n[[scenario.turn]]\nuser = "hi"\n'


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    printed = capsys.readouterr()
    assert printed.out == ""
    lines = printed.err.splitlines()
    assert len(lines) == 1, printed.err
    return lines[0]


def from_file(name: str) -> str:
    return f'[[scenario]]\nname = "f"\nfrom = "{name}"\n'


BAD_SCENARIOS: dict[str, tuple[str | bytes, str]] = {
    "not TOML": ("this is = = not toml\n", "not TOML (Expected"),
    "not UTF-8": (b"\xff\xfe[[scenario]]\n", "not UTF-8 text (byte 0)"),
    "no scenario": ('url = "ws://127.0.0.1:1"\n', "no [[scenario]] in it"),
    "no turns": ('[[scenario]]\nname = "lonely"\n', "scenario 'lonely' has no [[scenario.turn]]"),
    "10,000-deep tables": (
        "[" + ".".join(["a"] * 10_000) + "]\nx = 1\n",
        "tables or arrays nested more than 32 deep",
    ),
    "10,000-deep inline tables": (
        "a = " + "{b = " * 10_000 + "1" + "}" * 10_000 + "\n",
        "tables or arrays nested more than 32 deep",
    ),
    "1,001 scenarios": (
        "".join(ONE_TURN.format(i=i) for i in range(1001)),
        "Expected `array` of length <= 1000 - at `$.scenario`",
    ),
    "over 1 MiB": (
        "".join(ONE_TURN.format(i=i) for i in range(25_000)),
        "larger than a scenario file can be (1,048,576 bytes at most)",
    ),
    "a lookahead": (
        '[[scenario]]\nname = "x"\n[[scenario.turn]]\nuser = "a"\nexpect = { matches = "(?=a)" }\n',
        "is not a regular expression (invalid perl operator: (?=; RE2 syntax",
    ),
    "from a file that is not there": (from_file("nope.jsonl"), "cannot read"),
    "from a folder": (from_file("."), "cannot read"),
    "from /dev/zero": (from_file("/dev/zero"), "/dev/zero is not a file (a character device)"),
    "from a file that is not a recording": (from_file("scenarios.toml"), "not a recording"),
    "from 200 MB": (from_file("junk.jsonl"), "holds 200,000,000 bytes: larger than a recording"),
    "a fork at 0": (from_file("junk.jsonl") + "fork_at = 0\n", "Expected `int` >= 1"),
}


@pytest.mark.parametrize("name", list(BAD_SCENARIOS))
def test_a_file_that_cannot_run_is_one_line_and_exit_2_before_a_connection(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, says = BAD_SCENARIOS[name]
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_bytes(text if isinstance(text, bytes) else text.encode())
    with (tmp_path / "junk.jsonl").open("wb") as junk:
        junk.truncate(200_000_000)  # sparse: refused on its size, never read
    assert main(["eval", str(scenarios), "--url", NOWHERE]) == 2
    line = one_line(capsys)
    assert line.startswith("gateway eval: ") and says in line, line


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_recording_that_is_not_one_to_replay_is_named_with_its_scenario(
    recorded_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header_only = tmp_path / "header.jsonl"
    header_only.write_bytes(recorded_file.read_bytes().split(b"\n", 1)[0] + b"\n")
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(from_file("header.jsonl"))
    assert main(["eval", str(scenarios), "--url", NOWHERE]) == 2
    assert one_line(capsys) == (
        f"gateway eval: {scenarios}: scenario 'f': from = 'header.jsonl': the recording holds "
        "no events: the session did nothing while it was recorded, so there is nothing to replay"
    )
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(recorded_file.read_bytes())
    scenarios.write_text(from_file("whole.jsonl") + "fork_at = 99999\n")
    assert main(["eval", str(scenarios), "--url", NOWHERE]) == 2
    assert "fork at seq 99999: the recording's events are seq 1 to " in one_line(capsys)


def test_an_unreachable_gateway_is_one_line_for_every_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text("".join(ONE_TURN.format(i=i) for i in range(20)))
    assert main(["eval", str(scenarios), "--url", NOWHERE, "--repeat", "3"]) == 2
    assert one_line(capsys) == (
        f"gateway eval: nothing is listening at {NOWHERE}: is the gateway running? "
        "(start it: gateway serve)"
    )


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--repeat", "0"], "--repeat 0: give a whole number from 1 to 1000"),
        (["--concurrency", "100000"], "--concurrency 100000: give a whole number from 1 to 256"),
        (["--turn-timeout", "-1"], "--turn-timeout -1: give seconds above 0"),
    ],
)
def test_a_flag_out_of_range_is_one_line_and_exit_2(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(ONE_TURN.format(i=1))
    assert main(["eval", str(scenarios), "--url", NOWHERE, *flags]) == 2
    assert says in one_line(capsys)


@contextlib.asynccontextmanager
async def spy() -> AsyncIterator[tuple[str, list[str | None]]]:
    """A WebSocket server that keeps each handshake's Authorization header, and refuses it."""
    seen: list[str | None] = []

    def keep(connection: ServerConnection, request: Request) -> Response:
        seen.append(request.headers.get("Authorization"))
        return connection.respond(403, "spy\n")

    async with serve(lambda ws: ws.close(), "127.0.0.1", 0, process_request=keep) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/realtime", seen


async def test_the_key_goes_only_to_the_gateway_on_the_command_line(
    module_fresh_gateway: NodeProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "the-ci-secret-key")
    async with spy() as (elsewhere, seen):
        scenarios = tmp_path / "scenarios.toml"
        scenarios.write_text(f'url = "{elsewhere}"\n' + MIXED)
        # The file names a url and there is a key: refused, nothing dialled.
        assert await asyncio.to_thread(main, ["eval", str(scenarios)]) == 2
        line = one_line(capsys)
        assert "an API key is sent only to a gateway given on the command line" in line
        assert f"--url {elsewhere}" in line and f"--allow-url {elsewhere}" in line
        # --url wins over the file's url: the key goes there, and only there.
        argv = ["eval", str(scenarios), "--url", module_fresh_gateway.url]
        assert await asyncio.to_thread(main, argv) == 1  # MIXED fails one expectation
        assert seen == []
        # --allow-url sends it to the file's url, on purpose.
        argv = ["eval", str(scenarios), "--allow-url", elsewhere]
        assert await asyncio.to_thread(main, argv) == 2
        assert seen and set(seen) == {"Bearer the-ci-secret-key"}
    capsys.readouterr()


async def test_the_key_can_come_from_gateway_token(
    keyed_gateway: NodeProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(ONE_TURN.format(i=1))
    argv = ["eval", str(scenarios), "--url", keyed_gateway.url]
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert await asyncio.to_thread(main, argv) == 2
    assert "401" in one_line(capsys)
    monkeypatch.setenv(TOKEN_ENV, API_KEY)
    assert await asyncio.to_thread(main, argv) == 0
    assert "1 of 1 turns passed" in capsys.readouterr().out


async def test_a_pattern_that_backtracks_for_ever_in_re_is_judged_at_once(
    module_fresh_gateway: NodeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (a+)+$ against 40 a's and a "!" is 2**40 steps for a backtracking engine.
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(
        '[[scenario]]\nname = "redos"\n[[scenario.turn]]\n'
        f'user = "{"a" * 40}!"\nexpect = {{ matches = "(a+)+$" }}\n'
        '[[scenario.turn]]\nuser = "aaaa"\nexpect = { matches = "(a+)+$" }\n'
    )
    argv = ["eval", str(scenarios), "--url", module_fresh_gateway.url]
    assert await asyncio.to_thread(main, argv) == 1
    out = capsys.readouterr().out
    assert "FAIL redos turn 1: the answer does not match '(a+)+$'" in out
    assert "1 of 2 turns passed" in out
