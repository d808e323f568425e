"""No tool call may stall the event loop (issue 13, finding 1).

A backtracking regex or glob held the GIL in its worker thread, so every
other session, lease renewal and the tool timeout itself stopped for a
minute. These tests run such calls while a concurrent task records how late
its ticks come: a gap of a second means the loop was held. The last test does
the same through a real ``gateway serve`` process, polling ``/healthz``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from pathlib import Path

from websockets.asyncio.client import connect

from protocol.calls import ToolCall
from protocol.events import Call, End, Result, Session, decode_event
from tests.support.procs import NodeProcess
from tests.support.stall import LoopWatch
from tools.base import ToolContext
from tools.builtin import default_registry
from tools.executor import Executor

from .helpers import Call as CallFn
from .helpers import failed, ok

_MAX_GAP = 5.0
"""A loaded machine's margin: a tick normally comes within milliseconds; a held loop missed it
by tens of seconds (a minute for the backtracking regex)."""

_EVIL_LINE = "a" * 30 + "!"
_EVIL_REGEX = "(a+)+$"


def _deep_tree(root: Path, depth: int) -> None:
    path = root
    for _ in range(depth):
        path = path / "d"
    path.mkdir(parents=True)
    (path / "y.txt").write_text("leaf\n")


async def test_catastrophic_regex_search_does_not_hold_the_loop(
    call: CallFn, workspace: Path
) -> None:
    (workspace / "evil.txt").write_text((_EVIL_LINE + "\n") * 200)
    (workspace / "fine.txt").write_text("aaaa\n")
    async with LoopWatch(0.02) as watch:
        found = ok(await call("search", pattern=_EVIL_REGEX, regex=True))
    assert found["matches"] == ["fine.txt:1:aaaa"]
    assert watch.longest < _MAX_GAP, f"the loop was held for {watch.longest:.1f}s"


async def test_regex_features_without_a_linear_engine_are_refused_with_a_way_out(
    call: CallFn, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("abab\n")
    message = failed(await call("search", pattern=r"(ab)\1", regex=True))
    assert "invalid regex" in message and "backreferences" in message
    assert "regex=false" in message


async def test_find_with_many_double_stars_on_a_deep_tree_does_not_hold_the_loop(
    call: CallFn, workspace: Path
) -> None:
    _deep_tree(workspace, 40)
    pattern = "/".join(["**"] * 30 + ["d"] * 5 + ["x.txt"])
    async with LoopWatch(0.02) as watch:
        found = ok(await call("find", pattern=pattern))
        by_glob = ok(await call("search", pattern="leaf", glob=pattern))
    assert found == {"files": []}
    assert by_glob == {"matches": []}
    assert watch.longest < _MAX_GAP, f"the loop was held for {watch.longest:.1f}s"


async def test_a_batch_of_slow_searches_keeps_the_loop_and_the_timeout(
    workspace: Path, ctx: ToolContext
) -> None:
    """Many files of pathological lines, a short timeout: ticks continue; the batch ends."""
    for i in range(20):
        (workspace / f"evil{i}.txt").write_text((_EVIL_LINE + "\n") * 2_000)
    executor = Executor(default_registry(), timeout=5.0)
    calls = [
        ToolCall(name="search", args={"pattern": _EVIL_REGEX, "regex": True}) for _ in range(8)
    ]
    async with LoopWatch(0.02) as watch:
        # The batch ends: each call within the executor's timeout, the batch well within
        # the 5x margin a loaded machine needs.
        results = await asyncio.wait_for(executor.run_batch(calls, ctx), 5.0 * 5)
    assert len(results) == len(calls)
    for result in results:
        # Linear matching finds that no line ends in an "a", well inside the timeout; on a
        # loaded machine the timeout may end a call instead, and then it says so.
        if result.status == "success":
            assert result.content == {"matches": []}, result
        else:
            assert "timed out" in failed(result), result
    assert watch.longest < _MAX_GAP, f"the loop was held for {watch.longest:.1f}s"


def _poll_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                resp.read()
        finally:
            latencies.append(time.monotonic() - started)
        stop.wait(0.05)


def test_a_pathological_search_through_the_gateway_leaves_health_checks_answered(
    tmp_path: Path,
) -> None:
    """The sim's ``/tool search`` makes the model call the tool inside a real node."""
    workspaces = tmp_path / "workspaces"
    with NodeProcess(
        ["serve", "--port", "0", "--workspace-root", str(workspaces)], env={"REDIS_URL": ""}
    ) as node:
        latencies: list[float] = []
        stop = threading.Event()
        poller = threading.Thread(
            target=_poll_health, args=(node.http + "/healthz", stop, latencies), daemon=True
        )

        async def converse() -> list[object]:
            async with connect(node.base + "/v1/realtime") as ws:
                session = decode_event(await asyncio.wait_for(ws.recv(), 10))
                assert isinstance(session, Session)
                # The node's memory store claimed its namespace at start.
                (namespace,) = workspaces.glob("memory.*/")
                workspace = namespace / session.session_id
                workspace.mkdir(parents=True, exist_ok=True)
                (workspace / "evil.txt").write_text((_EVIL_LINE + "\n") * 2_000)
                args = json.dumps({"pattern": _EVIL_REGEX, "regex": True})
                poller.start()
                await ws.send(json.dumps({"type": "user", "content": f"/tool search {args}"}))
                events: list[object] = []
                while not isinstance(events[-1] if events else None, End):
                    events.append(decode_event(await asyncio.wait_for(ws.recv(), 30)))
                return events

        try:
            events = asyncio.run(converse())
        finally:
            stop.set()
            if poller.is_alive() or poller.ident is not None:
                poller.join(35)
        calls = [e for e in events if isinstance(e, Call)]
        results = [e for e in events if isinstance(e, Result)]
        assert calls and results, node.log
        assert '"status":"success"' in results[0].content.replace(" ", ""), results[0].content
        assert latencies, "no health check was made"
        assert max(latencies) < _MAX_GAP, f"a health check took {max(latencies):.1f}s"


async def test_one_sessions_slow_file_tools_leave_threads_for_the_others(tmp_path: Path) -> None:
    """Found from outside (2026-12-07): eight slow searches of one session ran on the
    loop's default executor (six threads here) and held all of them, so every other
    session's ``list`` timed out. A session's file tools take two threads at most, of
    the tools' own pool."""
    from tools.builtin._fs import THREADS_PER_WORKSPACE, Stop, in_thread

    release, two_running, running, most = threading.Event(), threading.Event(), [0], [0]
    lock = threading.Lock()

    def slow(stop: Stop, workspace: Path) -> str:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            if running[0] == 2:
                two_running.set()
        release.wait(20)
        with lock:
            running[0] -= 1
        return "slow"

    def quick(stop: Stop, workspace: Path) -> str:
        return "quick"

    mine, other = tmp_path / "a", tmp_path / "b"
    hogs = [asyncio.create_task(in_thread(slow, mine)) for _ in range(8)]
    async with asyncio.timeout(10):
        await asyncio.to_thread(two_running.wait, 10)  # the session's two threads are taken
        assert await in_thread(quick, other) == "quick"  # not behind the eight
        assert running[0] == 2  # the other six wait for the session's share
        release.set()
        assert await asyncio.gather(*hogs) == ["slow"] * 8
    assert most[0] == THREADS_PER_WORKSPACE == 2
