"""CPU of a ``gateway serve`` node per server event: its own door against the OpenAI door.

    .venv/bin/python -m tests.bench.openai_door_bench [--sessions 20] [--turns 5] [--baseline DIR]

Starts one node (the simulator, no keys, the memory store, uvloop), runs the same
text turns through ``/v1/realtime`` and through ``/openai/v1/realtime``, and prints the
node's CPU seconds (user + system, from /proc) per event each client received.
``--baseline DIR`` also runs the OpenAI door of another source tree (e.g.
``git archive main | tar -x -C DIR``) on its own node, for a before/after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from websockets.asyncio.client import connect

from tests.support.procs import NodeProcess

TEXT = "please echo this whole sentence back to me"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def native_session(base: str, turns: int) -> int:
    events = 0
    async with connect(f"{base}/v1/realtime", max_size=None) as ws:
        await ws.recv()
        for _ in range(turns):
            await ws.send(json.dumps({"type": "user", "content": TEXT}))
            while True:
                event = json.loads(await ws.recv())
                events += 1
                if event["type"] == "metric":
                    break
    return events


async def door_session(base: str, turns: int) -> int:
    events = 0
    async with connect(f"{base}/openai/v1/realtime?model=gpt-realtime-2.1", max_size=None) as ws:
        await ws.recv()  # session.created
        for _ in range(turns):
            item = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": TEXT}],
            }
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create"}))
            while True:
                event = json.loads(await ws.recv())
                events += 1
                if event["type"] == "response.done":
                    break
    return events


async def measure(
    node: NodeProcess, run: object, sessions: int, turns: int
) -> tuple[int, float, float]:
    assert node.proc is not None
    before, started = cpu_seconds(node.proc.pid), time.monotonic()
    counts = await asyncio.gather(*(run(node.base, turns) for _ in range(sessions)))  # type: ignore[operator]
    return sum(counts), cpu_seconds(node.proc.pid) - before, time.monotonic() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another source tree's OpenAI door, too")
    args = parser.parse_args()
    targets: list[tuple[str, Path | None, object]] = [
        ("gateway door", None, native_session),
        ("OpenAI door", None, door_session),
    ]
    if args.baseline is not None:
        targets.append(("OpenAI door (baseline)", args.baseline, door_session))
    for name, cwd, run in targets:
        node = NodeProcess(["serve", "--port", "0"], env={"REDIS_URL": ""}, cwd=cwd).start()
        try:
            await measure(node, run, 2, 1)  # warm up
            events, cpu, wall = await measure(node, run, args.sessions, args.turns)
            print(
                f"{name:22s} {args.sessions} sessions x {args.turns} turns: {events} events, "
                f"node CPU {cpu:.2f} s = {cpu / events * 1e6:.0f} µs/event, wall {wall:.1f} s"
            )
        finally:
            node.kill()


if __name__ == "__main__":
    asyncio.run(main())
