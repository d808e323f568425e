"""The executor keeps the protocol's promises for an ``<execute>`` batch.

Calls run in parallel, results come back in call order, and nothing one call
does (fail, raise, hang, return too much) blocks, delays or hides the others.
Ordering is proven with events the test controls, never with timing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest

from protocol.calls import ToolCall, encode_results
from tools.base import Tool, ToolContext, ToolFailure
from tools.builtin import default_registry
from tools.executor import Executor
from tools.registry import Registry

from .helpers import failed, ok


class KeyArgs(msgspec.Struct, forbid_unknown_fields=True):
    key: str = ""


class Probe:
    """What the test tools report back: who started, who finished, who was cancelled."""

    def __init__(self) -> None:
        self.started: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.release: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.cancelled: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.finished: list[str] = []
        self.finished_event: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    def finish(self, key: str) -> None:
        self.finished.append(key)
        self.finished_event[key].set()


class Gate(Tool[KeyArgs]):
    """Blocks until the test sets ``probe.release[key]``."""

    name = "gate"
    description = "waits for the test"
    args_type = KeyArgs

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    async def run(self, args: KeyArgs, ctx: ToolContext) -> Any:
        self.probe.started[args.key].set()
        try:
            await self.probe.release[args.key].wait()
        except asyncio.CancelledError:
            self.probe.cancelled[args.key].set()
            raise
        self.probe.finish(args.key)
        return f"gate {args.key} done"


class Fast(Tool[KeyArgs]):
    name = "fast"
    description = "returns at once"
    args_type = KeyArgs

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    async def run(self, args: KeyArgs, ctx: ToolContext) -> Any:
        self.probe.finish(args.key)
        return f"fast {args.key} done"


class Hang(Tool[KeyArgs]):
    """Never returns on its own."""

    name = "hang"
    description = "waits forever"
    args_type = KeyArgs

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    async def run(self, args: KeyArgs, ctx: ToolContext) -> Any:
        self.probe.started["hang"].set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.probe.cancelled["hang"].set()
            raise


class Boom(Tool[KeyArgs]):
    name = "boom"
    description = "has a bug"
    args_type = KeyArgs

    async def run(self, args: KeyArgs, ctx: ToolContext) -> Any:
        raise ValueError("boom at line 3")


class Refuse(Tool[KeyArgs]):
    name = "refuse"
    description = "fails cleanly"
    args_type = KeyArgs

    async def run(self, args: KeyArgs, ctx: ToolContext) -> Any:
        raise ToolFailure("no such thing; use list to see what exists")


class SizeArgs(msgspec.Struct):
    size: int
    kind: str = "str"


class Big(Tool[SizeArgs]):
    name = "big"
    description = "returns a lot"
    args_type = SizeArgs

    async def run(self, args: SizeArgs, ctx: ToolContext) -> Any:
        if args.kind == "str":
            return "x" * args.size
        if args.kind == "utf8":
            return "é" * args.size
        if args.kind == "object":
            return {"items": list(range(args.size))}
        return object()  # not JSON


class SelfCancel(Tool[KeyArgs]):
    """Awaits a task someone else cancels: a CancelledError that is not the batch's."""

    name = "self_cancel"
    description = "awaits a cancelled task"
    args_type = KeyArgs

    async def run(self, args: KeyArgs, ctx: ToolContext) -> Any:
        inner = asyncio.get_running_loop().create_future()
        inner.cancel()
        return await inner


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
def registry(probe: Probe) -> Registry:
    return Registry([Gate(probe), Fast(probe), Hang(probe), Boom(), Refuse(), Big(), SelfCancel()])


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path, session_id="s1")


def calls(*specs: tuple[str, dict[str, Any]]) -> list[ToolCall]:
    return [ToolCall(name=name, args=args) for name, args in specs]


async def test_fast_call_completes_while_slow_call_is_still_blocked(
    registry: Registry, probe: Probe, ctx: ToolContext
) -> None:
    executor = Executor(registry)
    batch = asyncio.create_task(
        executor.run_batch(calls(("gate", {"key": "slow"}), ("fast", {"key": "quick"})), ctx)
    )
    await probe.finished_event["quick"].wait()
    # The fast call is done although the slow one, listed first, has not been released.
    assert probe.started["slow"].is_set()
    assert probe.finished == ["quick"]
    assert not batch.done()

    probe.release["slow"].set()
    results = await batch
    assert [ok(r) for r in results] == ["gate slow done", "fast quick done"]
    assert probe.finished == ["quick", "slow"]


async def test_results_are_in_call_order_whatever_the_completion_order(
    registry: Registry, probe: Probe, ctx: ToolContext
) -> None:
    executor = Executor(registry)
    batch = asyncio.create_task(
        executor.run_batch(calls(*(("gate", {"key": k}) for k in "abc")), ctx)
    )
    for key in "cba":  # finish them in reverse order, one after the other
        await probe.started[key].wait()
        probe.release[key].set()
        await probe.finished_event[key].wait()
    results = await batch
    assert probe.finished == ["c", "b", "a"]
    assert [r.tool for r in results] == ["gate"] * 3
    assert [ok(r) for r in results] == ["gate a done", "gate b done", "gate c done"]


async def test_timed_out_call_fails_and_is_stopped_while_others_succeed(
    registry: Registry, probe: Probe, ctx: ToolContext
) -> None:
    executor = Executor(registry, timeout=0.05)
    results = await executor.run_batch(
        calls(("fast", {"key": "1"}), ("hang", {}), ("fast", {"key": "2"})), ctx
    )
    assert ok(results[0]) == "fast 1 done"
    message = failed(results[1])
    assert "'hang' timed out after 0.05s" in message
    assert "narrower" in message  # says what to do about it
    assert ok(results[2]) == "fast 2 done"
    assert probe.cancelled["hang"].is_set(), "the hung tool must be cancelled, not left running"


async def test_per_tool_timeout_applies_only_to_that_tool(
    registry: Registry, probe: Probe, ctx: ToolContext
) -> None:
    executor = Executor(registry, timeout=30.0, per_tool_timeout={"hang": 0.05})
    assert executor.timeout_for("hang") == 0.05
    assert executor.timeout_for("gate") == 30.0
    batch = asyncio.create_task(
        executor.run_batch(calls(("hang", {}), ("gate", {"key": "g"})), ctx)
    )
    await probe.cancelled["hang"].wait()  # "hang" hit its own 0.05 s limit...
    assert not batch.done()  # ...while "gate", under the 30 s default, still runs
    probe.release["g"].set()
    results = await batch
    assert "timed out after 0.05s" in failed(results[0])
    assert ok(results[1]) == "gate g done"


async def test_exception_in_one_tool_is_reported_without_traceback_and_logged(
    registry: Registry, ctx: ToolContext, caplog: pytest.LogCaptureFixture
) -> None:
    executor = Executor(registry)
    with caplog.at_level(logging.ERROR, logger="tools.executor"):
        results = await executor.run_batch(calls(("boom", {}), ("fast", {"key": "after"})), ctx)
    message = failed(results[0])
    assert "ValueError: boom at line 3" in message
    assert "Traceback" not in message
    assert ok(results[1]) == "fast after done"
    [record] = [r for r in caplog.records if r.name == "tools.executor"]
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert "boom" in record.getMessage() and "s1" in record.getMessage()


async def test_tool_failure_message_reaches_the_model_verbatim(
    registry: Registry, ctx: ToolContext
) -> None:
    [result] = await Executor(registry).run_batch(calls(("refuse", {})), ctx)
    assert result == result.__class__(
        tool="refuse", status="failure", content="no such thing; use list to see what exists"
    )


async def test_self_inflicted_cancellation_is_a_failure_not_a_cancelled_batch(
    registry: Registry, ctx: ToolContext
) -> None:
    results = await Executor(registry).run_batch(
        calls(("self_cancel", {}), ("fast", {"key": "x"})), ctx
    )
    assert "was cancelled" in failed(results[0])
    assert ok(results[1]) == "fast x done"


async def test_cancelling_the_batch_cancels_every_running_tool_before_propagating(
    registry: Registry, probe: Probe, ctx: ToolContext
) -> None:
    executor = Executor(registry)
    batch = asyncio.create_task(
        executor.run_batch(calls(("gate", {"key": "g"}), ("hang", {})), ctx)
    )
    await probe.started["g"].wait()
    await probe.started["hang"].wait()
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    # Both tools had seen their cancellation (and cleaned up) by the time the caller did.
    assert probe.cancelled["g"].is_set()
    assert probe.cancelled["hang"].is_set()
    assert probe.finished == []


async def test_unknown_tool_lists_available_names_and_others_still_run(
    registry: Registry, ctx: ToolContext
) -> None:
    results = await Executor(registry).run_batch(
        calls(("reed", {"path": "a"}), ("fast", {"key": "k"})), ctx
    )
    message = failed(results[0])
    assert results[0].tool == "reed"
    assert "unknown tool 'reed'" in message
    for name in ("gate", "fast", "hang", "boom", "refuse", "big"):
        assert name in message
    assert ok(results[1]) == "fast k done"


async def test_invalid_args_fail_before_the_tool_runs(
    registry: Registry, probe: Probe, ctx: ToolContext
) -> None:
    [result] = await Executor(registry).run_batch(calls(("fast", {"key": 7})), ctx)
    assert "args.key: expected str, got int" in failed(result)
    assert probe.finished == []


async def test_empty_batch_gives_no_results(registry: Registry, ctx: ToolContext) -> None:
    assert await Executor(registry).run_batch([], ctx) == []


async def test_oversize_string_output_is_truncated_with_a_note(
    registry: Registry, ctx: ToolContext
) -> None:
    results = await Executor(registry).run_batch(
        calls(("big", {"size": 1_234_567}), ("big", {"size": 64_000})), ctx
    )
    content = ok(results[0])
    assert content == "x" * 64_000 + (
        "\n[output truncated: 1,234,567 bytes, showing the first 64,000]"
    )
    assert ok(results[1]) == "x" * 64_000  # exactly at the cap: untouched


async def test_oversize_structured_output_is_truncated_as_json_text(
    registry: Registry, ctx: ToolContext
) -> None:
    [result] = await Executor(registry, max_output=50).run_batch(
        calls(("big", {"size": 1000, "kind": "object"})), ctx
    )
    full = msgspec.json.encode({"items": list(range(1000))})
    content = ok(result)
    assert content == full[:50].decode() + (
        f"\n[output truncated: {len(full):,} bytes, showing the first 50]"
    )
    encode_results([result])  # still encodes into the <results> block


async def test_truncation_never_splits_a_utf8_character(
    registry: Registry, ctx: ToolContext
) -> None:
    [result] = await Executor(registry, max_output=5).run_batch(
        calls(("big", {"size": 10, "kind": "utf8"})), ctx
    )
    # 5 bytes would end inside the third two-byte "é": only two whole ones are kept.
    assert ok(result) == "éé\n[output truncated: 20 bytes, showing the first 5]"


async def test_per_tool_output_cap_applies_only_to_that_tool(
    registry: Registry, ctx: ToolContext
) -> None:
    executor = Executor(registry, max_output=1000, per_tool_max_output={"big": 10})
    results = await executor.run_batch(
        calls(("big", {"size": 20}), ("fast", {"key": "y" * 500})), ctx
    )
    assert ok(results[0]).startswith("x" * 10 + "\n[output truncated: 20 bytes")
    assert ok(results[1]) == f"fast {'y' * 500} done"


async def test_output_that_is_not_json_is_a_failure_not_a_broken_batch(
    registry: Registry, ctx: ToolContext
) -> None:
    results = await Executor(registry).run_batch(
        calls(("big", {"size": 1, "kind": "opaque"}), ("fast", {"key": "z"})), ctx
    )
    assert "could not be encoded as JSON" in failed(results[0])
    assert ok(results[1]) == "fast z done"
    encode_results(results)


def test_executor_rejects_nonsense_limits(registry: Registry) -> None:
    with pytest.raises(ValueError, match="positive"):
        Executor(registry, timeout=0)
    with pytest.raises(ValueError, match="positive"):
        Executor(registry, max_output=-1)
    with pytest.raises(ValueError, match="positive"):
        Executor(registry, max_calls=0)
    with pytest.raises(ValueError, match="positive"):
        Executor(registry, max_batch_output=0)


# --- the batch as a whole is bounded (issue 13) --------------------------------


async def test_calls_past_the_batch_limit_do_not_run_and_say_how_to_proceed(
    registry: Registry, probe: Probe, ctx: ToolContext
) -> None:
    batch = calls(*(("fast", {"key": str(i)}) for i in range(7)))
    results = await Executor(registry, max_calls=5).run_batch(batch, ctx)
    assert [ok(r) for r in results[:5]] == [f"fast {i} done" for i in range(5)]
    for result in results[5:]:
        message = failed(result)
        assert "at most 5 calls" in message and "held 7" in message
        assert "later <execute> block" in message
    assert probe.finished == [str(i) for i in range(5)]


async def test_a_400_read_batch_stays_within_a_few_mib(workspace_with_text: Path) -> None:
    """9,000 reads once made a 567 MB result; now the count and the total are capped."""
    ctx = ToolContext(workspace=workspace_with_text, session_id="s1")
    batch = [ToolCall(name="read", args={"path": "big.txt"}) for _ in range(400)]
    results = await Executor(default_registry()).run_batch(batch, ctx)
    assert len(results) == 400
    assert sum(r.status == "success" for r in results) == 64
    assert "at most 64 calls" in failed(results[64])
    encoded = encode_results(results)
    assert len(encoded.encode()) < 2 * 1_048_576
    assert "limited to 1,048,576 bytes in all" in ok(results[0])


@pytest.fixture
def workspace_with_text(tmp_path: Path) -> Path:
    (tmp_path / "big.txt").write_text("a line of text that is fairly ordinary\n" * 20_000)
    return tmp_path


async def test_batch_budget_keeps_small_results_whole_and_cuts_the_big_ones(
    registry: Registry, ctx: ToolContext
) -> None:
    executor = Executor(registry, max_output=1_000_000, max_batch_output=10_000)
    batch = calls(
        ("big", {"size": 50_000}),
        *(("fast", {"key": str(i)}) for i in range(10)),
        ("big", {"size": 50_000}),
    )
    results = await executor.run_batch(batch, ctx)
    assert [ok(r) for r in results[1:11]] == [f"fast {i} done" for i in range(10)]
    for big in (ok(results[0]), ok(results[-1])):
        shown = big.split("\n", 1)[0]
        assert 4_000 < len(shown) <= 5_000  # an equal share of what the small ones left
        assert "limited to 10,000 bytes in all" in big
    assert len(encode_results(results)) < 12_000
