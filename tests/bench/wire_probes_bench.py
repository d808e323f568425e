"""Issue 38's wire probes on a real node, from outside: what one client costs the node.

Run: ``.venv/bin/python tests/bench/wire_probes_bench.py [audio|fragments|pings]
[--mib 60] [--frame-kb 64] [--code DIR]`` (``--code``: run the node from another
checkout, e.g. main's, for the figures before)

One ``gateway serve --record --record-audio all`` process (memory store, no
keys, the in-process simulator) while ``StallProbe`` polls ``/healthz``;
reports the node's peak RSS growth, CPU, the slowest ``/healthz`` and what
the client got:

- ``audio``: a voice client sends ``--mib`` MiB of PCM in binary frames of
  ``--frame-kb`` KB as fast as the node takes them (before: 60 MiB in 2.8 s,
  +195 MB, /healthz 335 ms);
- ``fragments``: a message in 1,048,574 one-byte fragments;
- ``pings``: 108 MB of 125-byte pings, never reading the pongs.
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

from tests.support.hostile import PING, PeakRss, fragments, raw_flood  # noqa: E402
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
    parser.add_argument(
        "probe", nargs="?", default="audio", choices=["audio", "fragments", "pings"]
    )
    parser.add_argument("--mib", type=int, default=60)
    parser.add_argument("--frame-kb", type=int, default=64)
    parser.add_argument("--code", default="", help="run the node from this checkout")
    args = parser.parse_args()
    env = {"REDIS_URL": ""}
    if args.code:
        env["PYTHONPATH"] = args.code
    with tempfile.TemporaryDirectory() as root:
        cli = ["serve", "--port", "0", "--record", "--record-audio", "all"]
        cli += ["--client-frames-per-second", "0", "--workspace-root", root]
        cwd = Path(args.code) if args.code else None
        with NodeProcess(cli, env=env, cwd=cwd) as node:
            assert node.proc is not None
            with StallProbe(node.http) as probe, PeakRss(node.proc.pid) as memory:
                started = time.monotonic()
                if args.probe == "audio":
                    took, sent = await flood(node.url, args.mib << 20, args.frame_kb * 1000)
                    what = f"{sent >> 20} MiB of PCM in {took:.1f} s"
                elif args.probe == "fragments":
                    what = await raw_flood(node.url, fragments(1_048_574), 1 << 16)
                else:
                    what = await raw_flood(node.url, PING * 824_427, 1 << 16)  # 108 MB
                took = time.monotonic() - started
                await asyncio.sleep(2.0)  # what the node does after (recordings: backstop 1 s)
            print(
                f"{args.probe}: {what}, {took:.1f} s; node RSS +{memory.grew / 1e6:.0f} MB "
                f"(peak), CPU {memory.cpu:.1f} s; {probe.summary()}"
            )


if __name__ == "__main__":
    asyncio.run(main())
