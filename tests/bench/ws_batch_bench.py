"""Server CPU per text frame: websockets' public ``send()`` vs ``gateway.wsfast.write_now``.

Run: ``python tests/bench/ws_batch_bench.py [--frames N] [--rounds R]``. The
server runs in its own process (its CPU time is what is measured) and streams
tiny JSON frames in batches of 1, 4 and 16 to a client in this process;
figures are medians of the rounds, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from gateway.wsfast import BatchingConnection, write_now

FRAME = b'{"type":"respond","content":"abcd","seq":123456,"timestamp":1796227216.018}'


async def _server(mode: str, frames: int, batch: int) -> None:
    async def handler(ws: ServerConnection) -> None:
        started = time.process_time()
        for _ in range(frames // batch):
            if mode == "public":
                for _ in range(batch):
                    await ws.send(FRAME, text=True)
            else:
                write_now(ws, [FRAME] * batch)
            await asyncio.sleep(0)
        print(time.process_time() - started, flush=True)
        await ws.close()

    factory = BatchingConnection if mode == "wsfast" else ServerConnection
    async with serve(handler, "127.0.0.1", 0, create_connection=factory) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()


async def _drain(port: int) -> None:
    async with connect(f"ws://127.0.0.1:{port}", max_queue=None) as client:
        async for _ in client:
            pass


def _one(mode: str, frames: int, batch: int) -> float:
    args = [
        sys.executable,
        __file__,
        "--serve",
        mode,
        "--frames",
        str(frames),
        "--batch",
        str(batch),
    ]
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        try:
            port = int(proc.stdout.readline())
            asyncio.run(_drain(port))
            return float(proc.stdout.readline()) / frames * 1e6
        finally:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--serve", choices=("public", "wsfast"))
    ns = parser.parse_args()
    if ns.serve:
        asyncio.run(_server(ns.serve, ns.frames, ns.batch))
        return
    for batch in (1, 4, 16):
        runs: dict[str, list[float]] = {"public": [], "wsfast": []}
        for _ in range(ns.rounds):
            for mode, got in runs.items():
                got.append(_one(mode, ns.frames, batch))
        public, fast = (statistics.median(runs[m]) for m in ("public", "wsfast"))
        print(
            f"batch {batch:2}: public send() {public:6.2f} µs/frame, "
            f"wsfast {fast:6.2f} µs/frame, ratio {fast / public:.2f}"
        )


if __name__ == "__main__":
    main()
