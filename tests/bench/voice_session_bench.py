"""Benchmark of voice through the gateway: latency it adds, and audio relay CPU.

Run: ``PYTHONPATH=. /work/venv/bin/python tests/bench/voice_session_bench.py [--sessions 100]
[--repeats 5] [--pin]``

1. **Speech end → first chunk**, at N concurrent voice sessions, each
   streaming 0.3 s of silence, 0.6 s of speech (a tone) and 1 s of silence at
   real-time pace in 20 ms frames. *Direct*: the OpenAI adapter talks to the
   simulator itself, and the time runs from the last speech frame sent to the
   first ``TextDelta``. *Gateway*: a ``gateway serve`` subprocess in between,
   from the last speech frame sent to the first ``think``/``respond`` event.
   Both include the simulator's VAD silence wait (500 ms), so the difference
   of the two is what the gateway adds (its own process, its own core share).
   ``--repeats K`` runs direct and gateway K times each, interleaved
   (direct, gateway, direct, …) so a burst of other work hits both alike, and
   prints the median of each percentile. ``--pin`` puts the gateway alone on
   CPU 1 and the simulator and this client on CPU 0 (``sched_setaffinity``),
   in both runs: the gateway then has a core of its own, as on its own
   machine, and the added latency is its processing and the extra hop rather
   than three busy processes queueing for two cores.
2. **Audio frames relayed per CPU-second** of the gateway process (its
   ``utime + stime`` from ``/proc``) while N sessions stream audio the
   simulator never answers (VAD threshold out of reach), against the adapter
   alone relaying in this process (``tests/bench/voice_bench.py``'s figure:
   the relay floor, no session, edge or log).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
from websockets.asyncio.client import connect

from gateway.upstream.audio import silence, tone
from gateway.upstream.base import AudioIn, TextDelta, VoiceConfig
from gateway.upstream.openai import OpenAIRealtime

RATE = 24000
FRAME = RATE // 50 * 2
LEAD, SPEECH, TAIL = silence(0.3, RATE), tone(0.6, RATE), silence(1.0, RATE)


# CPUs for each process with --pin (None: wherever the kernel puts them).
PINS: dict[str, set[int] | None] = {"gateway": None, "others": None}


@contextlib.asynccontextmanager
async def process(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[tuple[str, int]]:
    """A ``gateway`` subcommand in a subprocess; yields (its URL, its pid)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    while True:
        line = (await proc.stdout.readline()).decode()
        if not line:
            raise RuntimeError(f"gateway {args[0]} exited before listening")
        if "listening on ws://" in line:
            url = line.split("listening on ", 1)[1].split()[0]
            break
    drain = asyncio.create_task(proc.stdout.read())
    pin = PINS["gateway" if args[0] == "serve" else "others"]
    if pin is not None:
        os.sched_setaffinity(proc.pid, pin)
    try:
        yield url, proc.pid
    finally:
        proc.terminate()
        await proc.wait()
        drain.cancel()


def gateway_args(base: str) -> tuple[str, ...]:
    """``gateway serve`` with the OpenAI adapter on the separate simulator at ``base``.

    ``--provider openai`` matters: the default provider ``sim`` would run a
    second simulator inside the gateway process, so its figures would carry
    the simulator's VAD and framing too, and the direct run's simulator is
    not the one the gateway talks to.
    """
    return (
        "serve",
        "--port",
        "0",
        "--provider",
        "openai",
        "--model",
        "sim",
        "--openai-base-url",
        base,
        "--log-level",
        "WARNING",
    )


async def paced(send: object, pcm: bytes, start: float, first: int) -> int:
    """Send ``pcm`` in 20 ms frames from frame index ``first`` at real-time pace."""
    index = first
    for at in range(0, len(pcm), FRAME):
        delay = start + index * 0.02 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(pcm[at : at + FRAME])  # type: ignore[operator]
        index += 1
    return index


async def direct_session(base: str) -> float:
    upstream = OpenAIRealtime(base_url=base, api_key="k")
    await upstream.open("", [], voice=VoiceConfig(audio_in=AudioIn(rate=RATE)))
    try:
        start = time.monotonic()
        index = await paced(upstream.send_audio, LEAD + SPEECH, start, 0)
        ended = time.perf_counter()
        tail = asyncio.create_task(paced(upstream.send_audio, TAIL, start, index))
        while True:
            event = await upstream.recv()
            if isinstance(event, TextDelta):
                got = time.perf_counter() - ended
                break
        tail.cancel()
        return got
    finally:
        await upstream.close()


async def gateway_session(url: str) -> float:
    async with connect(url, max_size=None, compression=None) as ws:
        await ws.recv()  # session
        await ws.send(orjson.dumps({"type": "configure", "input_audio": {"rate": RATE}}).decode())
        start = time.monotonic()
        index = await paced(ws.send, LEAD + SPEECH, start, 0)
        ended = time.perf_counter()
        tail = asyncio.create_task(paced(ws.send, TAIL, start, index))
        while True:
            frame = await ws.recv()
            if isinstance(frame, str) and (
                '"type":"think"' in frame or '"type":"respond"' in frame
            ):
                got = time.perf_counter() - ended
                break
        tail.cancel()
        return got


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def relay_cpu(sim_url: str, sessions: int, seconds: float) -> float:
    """Gateway frames per CPU-second while ``sessions`` stream ``seconds`` of quiet speech."""
    env = {"OPENAI_API_KEY": "k"}
    async with process(*gateway_args(sim_url), env=env) as (url, pid):
        frames = tone(seconds, RATE, amplitude=300)  # under the VAD threshold: never answered

        async def one() -> int:
            async with connect(url, max_size=None, compression=None) as ws:
                await ws.recv()
                await ws.send(orjson.dumps({"type": "configure", "input_audio": {}}).decode())
                await ws.recv()  # configured
                return await paced(ws.send, frames, time.monotonic(), 0)

        before = cpu_seconds(pid)
        counts = await asyncio.gather(*(one() for _ in range(sessions)))
        used = cpu_seconds(pid) - before
    return sum(counts) / used if used else float("inf")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs of each")
    parser.add_argument("--pin", action="store_true", help="gateway on CPU 1, the rest on CPU 0")
    ns = parser.parse_args()
    n = ns.sessions
    if ns.pin:
        PINS.update(gateway={1}, others={0})
        os.sched_setaffinity(0, {0})
    runs: dict[str, list[tuple[float, float]]] = {"direct": [], "gateway": []}
    async with process("sim", "--port", "0") as (sim_ws, _):
        base = sim_ws.split("/v1/")[0] + "/v1"
        env = {"OPENAI_API_KEY": "k"}
        for _ in range(ns.repeats):
            direct = await asyncio.gather(*(direct_session(base) for _ in range(n)))
            runs["direct"].append((pct(direct, 50), pct(direct, 99)))
            async with process(*gateway_args(base), env=env) as (url, _):
                through = await asyncio.gather(*(gateway_session(url) for _ in range(n)))
            runs["gateway"].append((pct(through, 50), pct(through, 99)))
        pinned = ", gateway pinned to CPU 1, the rest to CPU 0" if ns.pin else ""
        print(
            f"speech end -> first chunk, {n} concurrent voice sessions (ms), "
            f"median of {ns.repeats} interleaved run(s){pinned}"
        )
        print(f"  {'':10}{'p50':>10}{'p99':>10}   runs (p50/p99)")
        medians = {}
        for name, got in runs.items():
            medians[name] = (median([a for a, _ in got]), median([b for _, b in got]))
            each = "  ".join(f"{a:.0f}/{b:.0f}" for a, b in got)
            print(f"  {name:10}{medians[name][0]:>10.1f}{medians[name][1]:>10.1f}   {each}")
        print(
            f"  added     {medians['gateway'][0] - medians['direct'][0]:>10.1f}"
            f"{medians['gateway'][1] - medians['direct'][1]:>10.1f}"
        )
        rate = await relay_cpu(base, n, 5.0)
        print(f"gateway: {rate:,.0f} audio frames relayed per CPU-second ({n} sessions, 5 s)")


if __name__ == "__main__":
    asyncio.run(main())
