"""The Python path of one voice frame through the node, in-process: warm and cold.

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/voice_frame_bench.py [--frames 20000]
[--cold 1500] [--flush-mb 8]``

A simulator and a gateway run in this process; one client session configures
24 kHz input audio and streams a second of frames, so its upstream is open.
Then the upstream socket's transport is swapped for one whose ``write`` does
nothing, and the server side of the client's connection is fed the bytes of
one masked 20 ms binary frame (960 bytes of PCM16) straight into its
``data_received``, as the event loop hands them over: the frame parse, the
session's hand-off, base64 and JSON, the mask, every Python step up to the
socket write (``tests/bench/voice_cost_bench.py`` measures the whole node,
syscalls and event loop included).

- **warm**: the best of 5 runs of ``--frames`` frames back to back, µs per frame.
- **cold**: the median of ``--cold`` frames, each after ``--flush-mb`` of
  memory was written (the caches hold none of the path): what a node pays when
  every frame wakes it after other processes ran, as on a shared machine. A
  no-op Python call measured the same way is printed for scale.

To compare checkouts, run it from each in turn (``cd`` there, ``PYTHONPATH=.``:
each imports its own ``gateway``) on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from websockets.asyncio.client import connect

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build without the C extension
    from websockets.utils import apply_mask

import gateway.edge.audio_in as audio_in
from gateway.app import running_gateway
from gateway.config import load_config
from gateway.edge.frame_rate import FrameRate
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim

RATE = 24000
FRAME = RATE // 50 * 2  # 20 ms of PCM16


class NullTransport:
    """An upstream transport whose writes go nowhere (no syscall in the figure)."""

    written = 0

    def write(self, data: bytes) -> None:
        self.written += 1


def _noop() -> None:
    pass


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--cold", type=int, default=1_500)
    parser.add_argument("--flush-mb", type=int, default=8)
    ns = parser.parse_args()
    mics: list[Any] = []
    made = audio_in.AudioIn.__init__

    def keep(self: Any, conn: Any) -> None:
        made(self, conn)
        mics.append(self)

    audio_in.AudioIn.__init__ = keep  # type: ignore[method-assign]
    sim_config = SimConfig(flavor="openai", api_key="k", vad_threshold=40000)
    async with serve_sim(sim_config) as sim:
        settings = {
            "provider": "openai",
            "openai_base_url": sim.url,
            "openai_api_key": "k",
            "model": "sim",
            "port": 0,
            "workspace_root": tempfile.mkdtemp(),
            "log_level": "WARNING",
        }
        async with (
            running_gateway(load_config(settings, env={})) as gw,
            connect(gw.url, max_size=None, compression=None) as ws,
        ):
            await ws.recv()  # session
            configure = {"type": "configure", "input_audio": {"rate": RATE}}
            await ws.send(orjson.dumps(configure).decode())
            while orjson.loads(await ws.recv())["type"] != "configured":
                pass
            for _ in range(50):  # a second of audio: the upstream opens and takes it
                await ws.send(bytes(FRAME))
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            mic = mics[-1]
            # The frames below come back to back, far over a client's 500 a second
            # (``AUDIO_FRAMES_PER_SECOND``): what is timed is the path, not the refusal.
            mic.rate = FrameRate(0, 1, 0.0)
            server = mic.conn.ws
            upstream_ws = mic.conn.driven.link.upstream._socket._ws
            real, null = upstream_ws.transport, NullTransport()
            upstream_ws.transport = null
            try:
                mask = os.urandom(4)
                frame = b"\x82\xfe" + FRAME.to_bytes(2) + mask
                frame += apply_mask(os.urandom(FRAME), mask)
                feed = server.data_received
                assert server.recv_messages._waiter is not None, "the reader must be waiting"
                warm = []
                for _ in range(5):
                    start = time.perf_counter()
                    for _ in range(ns.frames):
                        feed(frame)
                    warm.append((time.perf_counter() - start) / ns.frames * 1e6)
                assert null.written == 5 * ns.frames, "every frame must reach the upstream"
                junk = np.ones(ns.flush_mb * 2**20 // 8)
                clock = time.perf_counter
                cold: dict[str, list[float]] = {"frame": [], "no-op": []}
                for _ in range(ns.cold):
                    for name, call, args in (("frame", feed, (frame,)), ("no-op", _noop, ())):
                        junk += 1.0
                        start = clock()
                        call(*args)
                        cold[name].append((clock() - start) * 1e6)
            finally:
                upstream_ws.transport = real
    print(f"one 20 ms 24 kHz binary frame, client socket -> provider frame ({Path.cwd()})")
    print(f"  warm  {min(warm):6.2f} µs/frame (best of 5 x {ns.frames})")
    for name, times in cold.items():
        times.sort()
        print(
            f"  cold  {times[len(times) // 2]:6.2f} µs ({name}, median of {ns.cold}, "
            f"{ns.flush_mb} MB written before each)"
        )


if __name__ == "__main__":
    asyncio.run(main())
