"""``gateway eval``: scenario files run against a gateway process, as CI runs them.

The README's example file (docs/examples/scenarios.toml) passes against
``gateway serve`` on its simulator; a file with one passing and one failing
expectation prints both, writes JUnit XML and exits 1; a scenario can start
from a recording; a bad file is one line that says what to fix. The
expectations themselves are checked without sockets below.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gateway.client.evals import Expect, ScenarioError, ToolExpect, check, read_scenarios
from gateway.client.transcript import ToolUse, Turn
from tests.support.procs import NodeProcess
from tests.support.recorded import exported, gateway_cli

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
    fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    readme = (ROOT / "README.md").read_text()
    assert EXAMPLE.read_text() in readme  # the README shows the file the suite runs
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
    fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
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
    recorded_gateway: NodeProcess, fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    recording = await exported(recorded_gateway, tmp_path)
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(
        f"""
[[scenario]]
name = "after the recorded call"
from = "{recording.name}"
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
