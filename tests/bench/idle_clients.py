"""Many idle client connections in one process, driven over stdin (for idle_scale_bench).

Run by ``idle_scale_bench.py``: ``python tests/bench/idle_clients.py URL N RAMP``
opens ``N`` gateway sessions over ``RAMP`` seconds and holds them, sending
nothing (no client ping either: the server's keepalive is what an idle
connection costs it). Lines on stdin:

- ``turn RATE [COUNT]``: every connection (or the first ``COUNT``) sends one
  ``user`` message, ``RATE`` new turns a second, and reads its turn through
  ``metric``;
- ``quit``: exit (the sockets close with the process).

It prints ``open K failed F`` once a second while it opens, then ``ready K F``;
after a ``turn`` command ``turned OK FAILED``. A process holds at most what its
open-file limit allows, so the bench runs several.
"""

from __future__ import annotations

import asyncio
import sys
import time

import orjson
from websockets.asyncio.client import ClientConnection, connect


async def open_one(url: str, at: float) -> ClientConnection | None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    try:
        ws = await connect(
            url, compression=None, ping_interval=None, max_size=2**20, open_timeout=60
        )
        await asyncio.wait_for(ws.recv(), 60)  # the session frame
        return ws
    except Exception:  # counted as failed; the bench reports it
        return None


async def one_turn(ws: ClientConnection, at: float) -> bool:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    try:
        await ws.send(orjson.dumps({"type": "user", "content": "hello"}).decode())
        ended = False
        async with asyncio.timeout(120):
            while True:
                kind = orjson.loads(await ws.recv()).get("type")
                if kind == "end":
                    ended = True
                elif kind == "metric" and ended:
                    return True
    except Exception:
        return False


async def main() -> None:
    url, n, ramp = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    start = time.monotonic()
    tasks = [asyncio.create_task(open_one(url, start + ramp * i / n)) for i in range(n)]

    def report(prefix: str) -> None:
        done = [t for t in tasks if t.done()]
        ok = sum(1 for t in done if t.result() is not None)
        print(f"{prefix} {ok} {len(done) - ok}", flush=True)

    while not all(t.done() for t in tasks):
        await asyncio.sleep(1.0)
        report("open")
    report("ready")
    conns = [ws for t in tasks if (ws := t.result()) is not None]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().split():
        if line[0] == "turn":
            rate = float(line[1])
            count = int(line[2]) if len(line) > 2 else len(conns)
            t0 = time.monotonic()
            results = await asyncio.gather(
                *(one_turn(ws, t0 + i / rate) for i, ws in enumerate(conns[:count]))
            )
            print(f"turned {sum(results)} {len(results) - sum(results)}", flush=True)
        elif line[0] == "quit":
            break
    # Exit without a close handshake each: the process's sockets close with it.


if __name__ == "__main__":
    asyncio.run(main())
