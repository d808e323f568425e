"""Issue 38's wire probes on a real node: what one client's audio costs a recording node.

Run: ``.venv/bin/python tests/bench/wire_probes_bench.py [--mib 60] [--frame-kb 64]``

One ``gateway serve --record --record-audio all`` process (memory store, no
keys, the in-process simulator); one voice client sends ``--mib`` MiB of PCM
in binary frames of ``--frame-kb`` KB as fast as the node takes them, while
``StallProbe`` polls ``/healthz``. Reports the node's peak RSS growth, the
slowest ``/healthz`` and the send time. Before the recorder's bound: 60 MiB
in ~3 s grew the node 119 MB, /healthz 416 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from websockets.asyncio.client import connect  # noqa: E402

from tests.support.hostile import PeakRss  # noqa: E402
from tests.support.procs import NodeProcess  # noqa: E402
from tests.support.stall import StallProbe  # noqa: E402


async def flood(url: str, total: int, frame: int) -> tuple[float, int]:
    sent = 0
    async with connect(url, max_size=None) as ws:
        await ws.recv()  # the session frame
        await ws.send('{"type":"configure","input_audio":{"rate":24000}}')
        while b"configured" not in (await ws.recv()).encode():
            pass
        started = time.monotonic()
        chunk = bytes(range(256)) * (frame // 256)
        try:
            while sent < total:
                await ws.send(chunk)
                sent += len(chunk)
        except Exception as exc:  # the node may close a flooding client
            print(f"  closed after {sent >> 20} MiB: {exc}")
        return time.monotonic() - started, sent


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=60)
    parser.add_argument("--frame-kb", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        cli = ["serve", "--port", "0", "--record", "--record-audio", "all"]
        cli += ["--client-frames-per-second", "0", "--workspace-root", root]
        with NodeProcess(cli, env={"REDIS_URL": ""}) as node:
            assert node.proc is not None
            with StallProbe(node.http) as probe, PeakRss(node.proc.pid) as memory:
                took, sent = await flood(node.url, args.mib << 20, args.frame_kb * 1000)
                await asyncio.sleep(2.0)  # the writes after the flood (backstop 1 s)
            print(
                f"record-audio all: {sent >> 20} MiB of PCM in {took:.1f} s; node RSS "
                f"+{memory.grew / 1e6:.0f} MB (peak), CPU {memory.cpu:.1f} s; {probe.summary()}"
            )


if __name__ == "__main__":
    asyncio.run(main())
