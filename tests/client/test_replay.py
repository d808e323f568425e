"""Record → get → replay → report, as docs/recording.md ("Debugging a session") does it.

Real ``gateway serve`` processes on the built-in simulator: one records a
session (a tool call, a cancelled answer, a turn that quotes the
instructions), ``gateway recording get`` exports it, and ``gateway replay``
drives a fresh gateway with its user side: no change (exit 0, the same
report twice), a changed answer with other instructions (exit 1), and a fork
left open for the app to go on in. The gateways and the exported recording
are the module's (``recorded_file``): recorded once, copied by a test that
changes it.

A file that is not a recording to replay (empty, cut short, damaged, cut at
its size limit, header only, no user side, a version or seq no gateway
writes, a device, too large) and a flag out of range are one line on stderr
and exit 2, before any connection. The key may come from ``GATEWAY_TOKEN``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from gateway.cli import main
from gateway.client import Client
from gateway.client.dial import TOKEN_ENV
from gateway.client.replay_plan import plan_replay
from protocol.events import ApprovalRequired, Metric, Respond, User
from protocol.recording import Cut, encode_record
from tests.client.conftest import API_KEY
from tests.support.client import GatewayClient
from tests.support.procs import NodeProcess
from tests.support.recorded import TOOL_TURN, api_of, complete_recording, gateway_cli

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
    recorded_file: Path, module_fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    recording, fresh_gateway = recorded_file, module_fresh_gateway
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
    recorded_file: Path, module_fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    recording, fresh_gateway = recorded_file, module_fresh_gateway
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
    recorded_file: Path, module_fresh_gateway: NodeProcess
) -> None:
    recording, fresh_gateway = recorded_file, module_fresh_gateway
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
    module_recorded_gateway: NodeProcess, module_fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    recorded_gateway, fresh_gateway = module_recorded_gateway, module_fresh_gateway
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


# ------------------------------------------------------------------ refusals

NOWHERE = "ws://127.0.0.1:1/v1/realtime"  # nothing listens: a refusal comes before dialling


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def without_user_side(path: Path) -> bytes:
    return b"".join(
        line
        for line in lines_of(path)
        if b'"kind":"client"' not in line and b'"kind":"audio"' not in line
    )


def damaged(path: Path) -> bytes:
    lines = lines_of(path)
    middle = len(lines) // 2
    return b"".join([*lines[:middle], b'{"kind":"event","t":1.5,"ev\x00\xff\n', *lines[middle:]])


def cut_at_limit(path: Path) -> bytes:
    lines = lines_of(path)
    kept = lines[: len(lines) // 2]
    return b"".join(kept) + encode_record(Cut(t=4e9, limit=len(b"".join(kept))))


def versioned(path: Path, version: int) -> bytes:
    lines = lines_of(path)
    header = msgspec.json.decode(lines[0])
    return msgspec.json.encode({**header, "version": version}) + b"\n" + b"".join(lines[1:])


def huge_seq(path: Path) -> bytes:
    return re.sub(rb'("kind":"client","seq":)\d+', rb"\g<1>%d" % 2**70, path.read_bytes())


def deep(path: Path) -> bytes:
    lines = lines_of(path)
    nested = b'{"kind":"event","t":2.0,"event":' + b"[" * 10_000 + b"]" * 10_000 + b"}\n"
    return b"".join([lines[0], nested, *lines[1:]])


BAD_FILES: dict[str, tuple[Callable[[Path], bytes], str]] = {
    "empty": (lambda p: b"", "the file is empty: not a recording"),
    "truncated": (
        lambda p: p.read_bytes()[: p.read_bytes().rindex(b"\n", 0, len(p.read_bytes()) // 2) + 9],
        "is cut short (the file ends inside it): export it again",
    ),
    "corrupt": (damaged, "the file is damaged: line "),
    "cut at its limit": (cut_at_limit, "was cut at its size limit"),
    "header only": (lambda p: lines_of(p)[0], "holds no events"),
    "no user side": (without_user_side, "nothing the user sent (no client records)"),
    "newer version": (lambda p: versioned(p, 99), "version 99, from a newer gateway"),
    "version -1": (lambda p: versioned(p, -1), "names version -1, which no gateway writes"),
    "seq of 2**70": (huge_seq, "Expected `int` <= 9007199254740991"),
    "10,000-deep JSON": (deep, "JSON nested too deeply"),
    "not JSON Lines": (lambda p: b"x\n" * 1000, "not a recording (line 1:"),
}


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    printed = capsys.readouterr()
    assert printed.out == ""
    lines = printed.err.splitlines()
    assert len(lines) == 1, printed.err
    return lines[0]


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_file_that_is_not_a_recording_to_replay_is_one_line_and_exit_2(
    name: str, recorded_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, says = BAD_FILES[name]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(make(recorded_file))
    assert main(["replay", str(bad), "--url", NOWHERE]) == 2
    line = one_line(capsys)
    assert line.startswith("gateway replay: ") and says in line, line


def test_a_device_or_a_file_too_large_is_refused_before_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "/dev/zero", "--url", NOWHERE]) == 2
    assert (
        one_line(capsys)
        == "gateway replay: /dev/zero is not a file (a character device): give a recording"
    )
    junk = tmp_path / "junk.jsonl"
    with junk.open("wb") as file:
        file.truncate(200_000_000)  # 200 MB that take no disk: read, they would take memory
    assert main(["replay", str(junk), "--url", NOWHERE]) == 2
    # Refused on its size, before a byte is read.
    assert "holds 200,000,000 bytes: larger than a recording can be" in one_line(capsys)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--fork-at", "99999"], "fork at seq 99999: the recording's events are seq "),
        (["--fork-at", "0"], "--fork-at 0: give the seq of a recorded event"),
        (["--min-similarity", "5"], "--min-similarity 5: give a ratio from 0 to 1"),
        (["--latency-factor", "-1"], "--latency-factor -1: give a factor >= 0"),
        (["--turn-timeout", "0"], "--turn-timeout 0: give seconds above 0"),
        (["--chat"], "--chat goes on in a forked session: give --fork-at SEQ too"),
    ],
)
def test_a_flag_out_of_range_is_one_line_and_exit_2(
    flags: list[str], says: str, recorded_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(recorded_file), "--url", NOWHERE, *flags]) == 2
    assert says in one_line(capsys)


async def test_a_cut_recording_replays_up_to_the_cut_when_forked_before_it(
    recorded_file: Path, module_fresh_gateway: NodeProcess, tmp_path: Path
) -> None:
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(cut_at_limit(recorded_file))
    code, _, err = await gateway_cli("replay", str(cut), "--url", module_fresh_gateway.url)
    assert code == 2 and "fork at seq" in err, err
    last = int(re.search(r"after seq (\d+)", err).group(1))  # type: ignore[union-attr]
    code, out, err = await gateway_cli(
        "replay", str(cut), "--url", module_fresh_gateway.url, "--fork-at", str(last)
    )
    assert code == 0, out + err
    assert re.search(r"session \S+ is open", out), out


async def test_the_key_can_come_from_gateway_token(
    recorded_file: Path,
    keyed_gateway: NodeProcess,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["replay", str(recorded_file), "--url", keyed_gateway.url]
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert await asyncio.to_thread(main, argv) == 2
    assert "401" in one_line(capsys)
    monkeypatch.setenv(TOKEN_ENV, API_KEY)
    assert await asyncio.to_thread(main, argv) == 0
    assert "no change beyond thresholds" in capsys.readouterr().out
