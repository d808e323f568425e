"""Record → get → replay → report, as the README's "Debugging a session" does it.

Real ``gateway serve`` processes on the built-in simulator: one records a
session (a tool call, a cancelled answer, a turn that quotes the
instructions), ``gateway recording get`` exports it, and ``gateway replay``
drives a fresh gateway with its user side: no change (exit 0, the same
report twice), a changed answer with other instructions (exit 1), and a fork
left open for the app to go on in.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from gateway.client import Client
from gateway.client.replay_plan import plan_replay
from protocol.events import ApprovalRequired, Metric, Respond, User
from tests.support.client import GatewayClient
from tests.support.procs import NodeProcess
from tests.support.recorded import (
    TOOL_TURN,
    api_of,
    complete_recording,
    exported,
    gateway_cli,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def report_turns(path: Path) -> list[tuple[object, ...]]:
    """What a report says of each turn, latencies aside (they are the clock's)."""
    report = msgspec.json.decode(path.read_bytes())
    return [
        (
            d["recorded"]["user"],
            d["replayed"]["outcome"],
            [(t["name"], t["args"]) for t in d["replayed"]["tools"]],
            d["similarity"],
            d["changes"],
        )
        for d in report["turns"]
    ]


async def test_a_replay_on_a_fresh_gateway_reports_no_change_and_the_same_report_twice(
    recorded_gateway: NodeProcess, fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    recording = await exported(recorded_gateway, tmp_path)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    code, out, err = await gateway_cli(
        "replay", str(recording), "--url", fresh_gateway.url, "--report", str(first)
    )
    assert code == 0, out + err
    assert "no change beyond thresholds" in out
    rows = out.splitlines()
    assert any(r.startswith("1 ") and "list" in r and "end" in r for r in rows), out
    assert any(r.startswith("2 ") and "cancelled" in r for r in rows), out
    code, out, err = await gateway_cli(
        "replay", str(recording), "--url", fresh_gateway.url, "--report", str(second)
    )
    assert code == 0, out + err
    # Deterministic on the simulator: the same recording, the same report.
    assert report_turns(first) == report_turns(second)
    turns = report_turns(first)
    assert [t[1] for t in turns] == ["end", "cancelled", "end"]
    assert turns[0][2] == [("list", {"path": "."})]


async def test_other_instructions_report_the_changed_answer_and_exit_1(
    recorded_gateway: NodeProcess, fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    recording = await exported(recorded_gateway, tmp_path)
    instructions = tmp_path / "instructions.txt"
    instructions.write_text("Answer like a pirate, in one short sentence.")
    code, out, err = await gateway_cli(
        "replay",
        str(recording),
        "--url",
        fresh_gateway.url,
        "--instructions-file",
        str(instructions),
    )
    assert code == 1, out + err
    assert "turn 3 changed: answer" in out, out
    # Where the answers part: the replayed one quotes the new instructions.
    (replayed,) = [line for line in out.splitlines() if line.startswith("  replayed: ")]
    assert replayed.endswith("Answer like a pirate, in one short sentence."), out
    assert "turn 1 changed" not in out and "turn 2 changed" not in out


async def test_a_fork_replays_up_to_its_seq_and_leaves_the_session_open(
    recorded_gateway: NodeProcess, fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    recording = await exported(recorded_gateway, tmp_path)
    plan = plan_replay(recording.read_bytes())
    # The seq before the second turn's user event: its first turn's closing metric.
    after_first = [e.seq for _, e in plan.events if isinstance(e, User)][1] - 1
    code, out, err = await gateway_cli(
        "replay", str(recording), "--url", fresh_gateway.url, "--fork-at", str(after_first)
    )
    assert code == 0, out + err
    found = re.search(r"session (\S+) is open", out)
    assert found, out
    # The app goes on in the forked session: it holds the first turn, and answers.
    async with Client(fresh_gateway.url, session_id=found.group(1)) as client:
        answer = ""
        async for event in client.send("hello"):
            if isinstance(event, Respond):
                answer += event.content
    assert answer == "Echo: hello"
    assert "/tool list" in out and "/long" not in out


async def test_an_approved_call_is_approved_again_with_the_replayed_calls_digest(
    recorded_gateway: NodeProcess, fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    client = await GatewayClient.connect(recorded_gateway.url)
    await client.send({"type": "configure", "record": True, "require_approval": ["list"]})
    await client.until_type("configured")
    await client.user(TOOL_TURN)
    pending = (await client.until_type("approval_required"))[-1]
    assert isinstance(pending, ApprovalRequired)
    approve = {"type": "approve", "id": pending.id, "digest": pending.digest}
    await client.send({**approve, "decision": "allow"})
    await client.until(lambda e: isinstance(e, Metric) and e.seq > pending.seq + 3)
    sid = client.sid
    await client.close()
    await complete_recording(api_of(recorded_gateway), sid, turns=1)
    recording = tmp_path / "approved.jsonl"
    code, out, err = await gateway_cli(
        "recording", "get", "-o", str(recording), "--api", api_of(recorded_gateway), "--", sid
    )
    assert code == 0, out + err
    report = tmp_path / "report.json"
    code, out, err = await gateway_cli(
        "replay", str(recording), "--url", fresh_gateway.url, "--report", str(report)
    )
    assert code == 0, out + err
    assert "note:" not in out  # the approve was sent, and taken
    [(_, outcome, tools, _, changes)] = report_turns(report)
    assert (outcome, tools, changes) == ("end", [("list", {"path": "."})], [])
