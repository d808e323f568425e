"""CPU per WebRTC call-second: N aiortc peers hold calls to an in-process gateway
(simulator upstream) for SECONDS, the microphones sending silence, the gateway's
track sending silence/speech; prints process CPU seconds per call-second.

Both ends run in this one process (the peers' Opus encode/decode, DTLS/SRTP and
ICE cost about what the gateway's do), so the gateway's share is about half of
the figure printed. Usage: python -m tests.bench.webrtc_bench [N] [SECONDS]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from tests.voice.conftest import voice_gateway
from tests.webrtc.conftest import Peer
from tests.webrtc.test_calls import calls_url


async def main(n: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with voice_gateway("openai", Path(tmp)) as gw:
            peers = [Peer() for _ in range(n)]
            for peer in peers:
                assert (await peer.call(calls_url(gw.url))).status == 201
            await asyncio.sleep(1)  # settle: DTLS done, tracks flowing
            cpu, wall = time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            frames = sum(p.frames for p in peers)
            for peer in peers:
                await peer.close()
    print(
        f"{n} calls, {wall:.1f} s: {cpu:.2f} CPU s; {cpu / (n * wall) * 100:.1f}% of a core "
        f"per call (both ends); {frames} frames received"
    )


if __name__ == "__main__":
    asyncio.run(
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 1,
            float(sys.argv[2]) if len(sys.argv) > 2 else 10,
        )
    )
