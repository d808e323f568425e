"""Node CPU per 20 ms audio frame: a voice client's PCM16 and a call's μ-law, A/B.

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/voice_cost_bench.py [--sessions 50]
[--seconds 6] [--repeats 3] [--against /work/main] [--rates 24000,16000] [--no-door]
[--litellm-venv /tmp/litellm-venv] [--py-spy DIR] [--shared]``

A simulator (``gateway sim``, VAD threshold out of reach: it never answers)
and a ``gateway serve`` run as subprocesses; this process is the load. Each
scenario streams ``--seconds`` of audio at real-time pace from ``--sessions``
concurrent sessions, and the figure is the gateway process's CPU (``utime +
stime`` from ``/proc``) over the frames it took in, in µs per frame:

- ``voice <rate>``: a client session (``configure`` with ``input_audio.rate``)
  sends binary frames of PCM16 at that rate; the gateway relays each to the
  provider (resampled to 24 kHz when the rate differs) as
  ``input_audio_buffer.append``. The setup (connect, configure) is outside
  the measured window.
- ``door 24k``: the same microphone through the gateway's OpenAI door
  (``/openai/v1/realtime?model=gpt-realtime-2.1``, ``session.update`` with
  ``audio/pcm`` 24 kHz): JSON ``input_audio_buffer.append`` frames of base64,
  decoded and relayed as the provider's own ``input_audio_buffer.append``.
- ``litellm 24k`` (with ``--litellm-venv``): the same door-shaped frames
  through LiteLLM's realtime proxy (``side_by_side_bench.litellm_proc``: its
  model ``sim`` routed to the same simulator), LiteLLM's process tree's CPU;
  the printed ``door ÷ LiteLLM`` is the gateway's relay of the same audio
  against LiteLLM's.
- ``relay 24k`` (always): the same door-shaped frames through less than any
  relay of that wire can do (``relay_baseline.py --passthrough``: a TCP proxy
  on uvloop, each read written on at once, no frame parsed), that process's
  CPU: the floor of one read and one write per frame on this machine, in the
  same run.
- ``phone``: a Twilio media stream (``gateway.client.carrier.SimulatedCall``,
  unsigned, ``--phone-no-require-token``) sends ``media`` frames of μ-law
  8 kHz (JSON, base64); the gateway decodes, resamples 8 → 24 kHz and relays.

**Placement.** Each measured server (the gateway, the floor's proxy, LiteLLM
and what it forks) runs alone on the last CPU, and this load and the simulator
on the others (``taskset -a``), as a node in production has its cores to
itself while its clients and the provider are other machines. With all of
them sharing this machine's two cores (``--shared``, the figures before
2026-12-06) the load generator's Python and the simulator's run between the
gateway's reads and evict its caches: the same code measured 25.3 µs a frame
shared and 15.3–17.3 on a core of its own in one session, while cutting ten
Python calls from the frame's path moved the shared figure by less than its
run-to-run spread (20–24 µs). Pinned, the floor and every relay are measured
the same way, so their ratios stay like for like.

``--against DIR`` runs the same scenarios against another checkout's
gateway (``cwd`` and ``PYTHONPATH`` set to it; this venv's interpreter),
interleaved with this one's, and prints both and their ratio: the figures
of a change in one run, on one machine's load. Medians of ``--repeats``.
``--py-spy DIR`` records one profile of each (this checkout's first repeat).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import orjson
from websockets.asyncio.client import connect

from gateway.client.carrier import CallSetup, SimulatedCall
from gateway.common.pcm import tone
from tests.bench.benchlib import (
    ROOT,
    Proc,
    cpu_seconds,
    descendants,
    free_port,
    median,
    pin_tasks,
    relay_proc,
    start_py_spy,
)
from tests.bench.side_by_side_bench import (
    LITELLM_KEY,
    ensure_litellm,
    litellm_proc,
    tree_cpu_seconds,
)

FRAME_S = 0.02
TOKEN = "bench-token"


def sim() -> Proc:
    return Proc(
        "sim",
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--vad-threshold",
            "40000",
        ],
    )


def gateway(sim_url: str, checkout: Path) -> Proc:
    base = sim_url.split("/v1/")[0] + "/v1"
    return Proc(
        "gateway",
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--provider",
            "openai",
            "--model",
            "sim",
            "--log-level",
            "WARNING",
            "--phone-no-require-token",
        ],
        {
            "GATEWAY_OPENAI_BASE_URL": base,
            "OPENAI_API_KEY": "sim",
            "REDIS_URL": "",
            "GATEWAY_PHONE_TWILIO_AUTH_TOKEN": TOKEN,
            "PYTHONPATH": str(checkout),
        },
        cwd=checkout,
    )


async def paced(send: object, frames: list[bytes] | list[str], start: float, stop: float) -> int:
    """Send ``frames`` round and round at 20 ms a frame from ``start`` until ``stop``."""
    index = 0
    while True:
        at = start + index * FRAME_S
        if at >= stop:
            return index
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(frames[index % len(frames)])  # type: ignore[operator]
        index += 1


async def voice(url: str, sessions: int, seconds: float, rate: int, pid: int) -> tuple[float, int]:
    """(gateway CPU seconds, frames) while ``sessions`` stream ``seconds`` at ``rate``."""
    size = rate // 50 * 2
    audio = tone(1.0, rate, amplitude=300)
    frames = [audio[at : at + size] for at in range(0, len(audio), size)]
    ready = asyncio.Event()
    waiting = [sessions]
    window: list[float] = []

    async def one(k: int) -> int:
        async with connect(url, max_size=None, compression=None) as ws:
            await ws.recv()  # session
            configure = {"type": "configure", "input_audio": {"rate": rate}}
            await ws.send(orjson.dumps(configure).decode())
            while orjson.loads(await ws.recv())["type"] != "configured":
                pass
            waiting[0] -= 1
            if not waiting[0]:
                window[:] = [time.monotonic() + 0.1]
                ready.set()
            await ready.wait()
            start = window[0] + FRAME_S * k / sessions  # independent microphones
            return await paced(ws.send, frames, start, window[0] + seconds)

    task = asyncio.gather(*(one(k) for k in range(sessions)))
    await ready.wait()
    await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
    before = cpu_seconds(pid)
    counts = await task
    return cpu_seconds(pid) - before, sum(counts)


async def phone(url: str, calls: int, seconds: float, pid: int) -> tuple[float, int]:
    """(gateway CPU seconds, frames) while ``calls`` stream ``seconds`` of a caller's silence
    (a media stream always streams: 50 ``media`` frames a second)."""
    phone_url = url.split("/v1/")[0] + "/v1/phone/twilio"
    dialled = [
        SimulatedCall(
            CallSetup(url=phone_url, auth_token=TOKEN, parameters={"from": f"+1555{k:07d}"})
        )
        for k in range(calls)
    ]
    await asyncio.gather(*(call.dial() for call in dialled))
    await asyncio.sleep(0.5)  # every session opened upstream
    chunks = [call._speech.chunk for call in dialled]
    before = cpu_seconds(pid)
    await asyncio.sleep(seconds)
    used = cpu_seconds(pid) - before
    frames = sum(call._speech.chunk - was for call, was in zip(dialled, chunks, strict=True))
    await asyncio.gather(*(call.hang_up() for call in dialled), return_exceptions=True)
    return used, frames


DOOR_MODEL = "gpt-realtime-2.1"
DOOR_SESSION = {
    "type": "realtime",
    "output_modalities": ["audio"],
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "turn_detection": {"type": "server_vad"},
        },
        "output": {"voice": "alloy"},
    },
}
WARM_S = 0.5  # appends before the window: the upstream is open and warm when it starts


async def openai_wire(
    url: str, headers: dict[str, str], sessions: int, seconds: float, cpu_of: Callable[[], float]
) -> tuple[float, int]:
    """(server CPU seconds, frames) while ``sessions`` OpenAI Realtime clients stream
    ``seconds`` of 24 kHz audio as ``input_audio_buffer.append`` (after ``WARM_S`` of it)."""
    audio = tone(1.0, 24000, amplitude=300)
    size = 24000 // 50 * 2
    frames = [
        orjson.dumps(
            {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(audio[at : at + size]).decode(),
            }
        ).decode()
        for at in range(0, len(audio), size)
    ]
    ready = asyncio.Event()
    waiting = [sessions]
    window: list[float] = []
    sent_before: list[int] = [0] * sessions

    async def one(k: int) -> int:
        async with connect(url, additional_headers=headers, max_size=None, compression=None) as ws:
            while orjson.loads(await ws.recv())["type"] != "session.created":
                pass
            update = {"type": "session.update", "session": DOOR_SESSION}
            await ws.send(orjson.dumps(update).decode())
            while orjson.loads(await ws.recv())["type"] != "session.updated":
                pass
            waiting[0] -= 1
            if not waiting[0]:
                window[:] = [time.monotonic() + 0.1 + WARM_S]
                ready.set()
            await ready.wait()
            start = window[0] - WARM_S + FRAME_S * k / sessions
            sent_before[k] = round(WARM_S / FRAME_S)
            return await paced(ws.send, frames, start, window[0] + seconds)

    task = asyncio.gather(*(one(k) for k in range(sessions)))
    await ready.wait()
    await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
    before = cpu_of()
    counts = await task
    return cpu_of() - before, sum(counts) - sum(sent_before)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--rates", default="24000,16000", help="client rates of the voice runs")
    parser.add_argument("--no-phone", action="store_true")
    parser.add_argument("--no-door", action="store_true", help="no OpenAI-door scenario")
    parser.add_argument(
        "--litellm-venv",
        type=Path,
        default=None,
        help="LiteLLM's venv (made on first use): adds its relay of the door's audio",
    )
    parser.add_argument("--py-spy", type=Path, default=None, help="a profile of each, here")
    parser.add_argument(
        "--shared",
        action="store_true",
        help="no pinning: the measured server shares both cores with the load and simulator",
    )
    ns = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, harness = cpus[-1:], cpus[:-1]
    pinned = not ns.shared and bool(harness)

    def place(pid: int) -> None:
        """A measured server (and what it forked) alone on the last CPU (see ``--shared``)."""
        if pinned:
            pin_tasks([pid, *descendants(pid)], server_cpu)

    checkouts = {"this": ROOT}
    if ns.against is not None:
        checkouts["other"] = ns.against.resolve()
    scenarios = [f"voice {int(rate) // 1000}k" for rate in ns.rates.split(",") if rate]
    if not ns.no_door:
        scenarios.append("door 24k")
    if not ns.no_phone:
        scenarios.append("phone")
    results: dict[tuple[str, str], list[float]] = {}
    with sim() as simulator, ExitStack() as stack:
        if pinned:
            pin_tasks([os.getpid(), simulator.pid], harness)
        # The door-shaped appends through each proxy: (name, proc, its key, its CPU).
        proxies: list[tuple[str, Proc, str, Callable[[int], float]]] = []
        relay = stack.enter_context(relay_proc(simulator.url, passthrough=True))
        place(relay.pid)
        proxies.append(("relay", relay, "sim", cpu_seconds))
        if ns.litellm_venv is not None:
            exe = ensure_litellm(ns.litellm_venv)
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            litellm = litellm_proc(exe, simulator.url, tmp).start(timeout=180)  # slow imports
            stack.callback(litellm.stop)
            place(litellm.pid)
            proxies.append(("litellm", litellm, LITELLM_KEY, tree_cpu_seconds))
        for repeat in range(ns.repeats):
            for name, proxy, key, cpu_of in proxies:
                used, frames = await openai_wire(
                    f"{proxy.url}?model=sim",
                    {"Authorization": f"Bearer {key}"},
                    ns.sessions,
                    ns.seconds,
                    partial(cpu_of, proxy.pid),
                )
                per = used / frames * 1e6 if frames else float("nan")
                results.setdefault((name, "door 24k"), []).append(per)
                print(
                    f"  repeat {repeat + 1} {name:7} door 24k {per:6.1f} µs/frame "
                    f"({frames} frames, {used:.2f} CPU-s)",
                    flush=True,
                )
            for name, checkout in checkouts.items():
                with gateway(simulator.url, checkout) as gw:
                    place(gw.pid)
                    for scenario in scenarios:
                        spy = None
                        if ns.py_spy is not None and repeat == 0 and name == "this":
                            ns.py_spy.mkdir(parents=True, exist_ok=True)
                            out = ns.py_spy / f"{scenario.replace(' ', '-')}.txt"
                            spy = await start_py_spy(gw.pid, ns.seconds, out)
                        if scenario == "phone":
                            used, frames = await phone(gw.url, ns.sessions, ns.seconds, gw.pid)
                        elif scenario == "door 24k":
                            door = gw.url.split("/v1/")[0] + "/openai/v1/realtime"
                            pid = gw.pid
                            used, frames = await openai_wire(
                                f"{door}?model={DOOR_MODEL}",
                                {},
                                ns.sessions,
                                ns.seconds,
                                partial(cpu_seconds, pid),
                            )
                        else:
                            rate = int(scenario.split()[1][:-1]) * 1000
                            used, frames = await voice(
                                gw.url, ns.sessions, ns.seconds, rate, gw.pid
                            )
                        if spy is not None:
                            await spy.wait()
                        per = used / frames * 1e6 if frames else float("nan")
                        results.setdefault((name, scenario), []).append(per)
                        print(
                            f"  repeat {repeat + 1} {name:5} {scenario:9} {per:6.1f} µs/frame "
                            f"({frames} frames, {used:.2f} CPU-s)",
                            flush=True,
                        )
    placement = (
        f"each server alone on CPU {server_cpu[0]}, the load and simulator on {harness}"
        if pinned
        else "servers, load and simulator sharing every CPU (--shared)"
    )
    print(
        f"\nnode CPU per 20 ms audio frame, {ns.sessions} sessions x {ns.seconds:g} s, "
        f"median of {ns.repeats} interleaved repeats (µs); {placement}"
    )
    header = f"  {'':10}{'this':>8}"
    if len(checkouts) > 1:
        header += f"{'other':>8}{'this/other':>12}"
    print(header + f"   ({checkouts.get('other', '')})")
    for scenario in scenarios:
        mine = median(results[("this", scenario)])
        line = f"  {scenario:10}{mine:>8.1f}"
        if len(checkouts) > 1:
            theirs = median(results[("other", scenario)])
            line += f"{theirs:>8.1f}{mine / theirs:>12.2f}"
        print(line)
    floor = median(results[("relay", "door 24k")])
    print(
        f"  a TCP proxy of the same 24 kHz appends {floor:.1f} µs/frame (the floor); "
        + ", ".join(
            f"{scenario} ÷ it {median(results[('this', scenario)]) / floor:.2f}"
            if floor
            else f"{scenario} ÷ it: not measurable (run longer)"
            for scenario in scenarios
            if scenario in ("voice 24k", "door 24k")
        )
    )
    if ("litellm", "door 24k") in results and ("this", "door 24k") in results:
        theirs = median(results[("litellm", "door 24k")])
        mine = median(results[("this", "door 24k")])
        print(
            f"  LiteLLM's relay of the door's audio {theirs:.1f} µs/frame; "
            f"door ÷ LiteLLM {mine / theirs:.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
