"""Benchmark of voice through the gateway: latency it adds, and audio relay CPU.

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/voice_session_bench.py [--sessions 100]
[--repeats 5] [--pin] [--spread 2] [--probes 25] [--stages] [--litellm-venv /tmp/litellm-venv]``

1. **Speech end → first chunk**, at N concurrent voice sessions. Each streams
   audio at real-time pace in 20 ms frames: silence, 0.6 s of speech (a
   tone), then silence until every session of the run has its answer, so all
   N stream the whole time. The time runs from the last speech frame sent to
   the first chunk of the answer's content (``think``/``respond``). Both
   include the simulator's VAD silence wait (500 ms), so the difference of
   the two groups below is what the gateway adds.

   - *Gateway*: N sessions through a ``gateway serve`` subprocess, which
     talks to the simulator (a subprocess too) with its OpenAI adapter.
   - *Direct* (``--probes P``, default 25): P sessions that talk to the same
     simulator at the same time, through the same adapter in this process,
     and read the model's markers with ``protocol.parser`` as any client of
     the raw provider must (the first raw delta is ``<thi``, not content).
     Run alongside, they meet the same simulator load and the same CPU: runs
     measured apart (``--probes 0``: N direct sessions, then N through the
     gateway) shifted by ±30 ms from run to run on this 2-vCPU machine, six
     times the 5 ms being measured.
   - *Spread* (``--spread S``, default 2 s): the sessions' speech ends are
     spaced evenly over S seconds, as independent speakers' are. With
     ``--spread 0`` all N stop speaking in the same 20 ms: then the
     simulator answers N turns at once on its shared core, and which session
     lands where in that burst decides its latency more than any hop does
     (a trace of each hop, 100 sessions in step: the gateway held the last
     frame 0.02 ms and the client-to-gateway hop took 0.15 ms, while the
     frame waited 14–22 ms in the busy simulator, direct or not).

   ``--repeats K`` runs K times and pools the samples. ``--pin`` puts the
   gateway alone on CPU 1 and the simulator and this client on CPU 0
   (``sched_setaffinity``): the gateway then has a core of its own, as on
   its own machine, rather than three busy processes queueing for two cores.
   ``--stages`` prints when each kind of event first arrived.
   ``--tokens-per-second`` paces the simulator's answers (default 50 chunks
   a second, a voice model's pace; 0: all at once).
2. **Audio frames relayed per CPU-second** of the gateway process (its
   ``utime + stime`` from ``/proc``) while N sessions stream audio the
   simulator never answers (VAD threshold out of reach), against the adapter
   alone relaying in this process (``tests/bench/voice_bench.py``'s figure:
   the relay floor, no session, edge or log).

3. **LiteLLM relaying the same audio** (``--litellm-venv DIR``: LiteLLM
   installed there, or installed into it first): N OpenAI Realtime clients
   stream the same quiet audio as ``input_audio_buffer.append`` events through
   the gateway's OpenAI door (``/openai/v1/realtime``) and, interleaved, through
   LiteLLM's realtime proxy to the same simulator (LiteLLM speaks only
   OpenAI's wire, so the door is the gateway's like-for-like path). Printed:
   each one's CPU per frame (LiteLLM's process tree) and the door's ÷ LiteLLM's,
   measured in one run rather than assumed. ``voice_cost_bench.py`` has the
   same comparison with a TCP proxy's floor beside it.

**Over a simulated network** (``--client-rtt``, ``--provider-rtt``,
``--redis-rtt`` in ms; ``tests/bench/network.py``): the gateway's clients
cross a client link, the gateway reaches the simulator over a provider link
and Redis over a Redis link (any ``--redis-rtt``, or ``--redis``, gives the
gateway a Redis store; otherwise it keeps the memory store), and the direct
sessions reach the simulator over one link of client + provider RTT: the
path a client of the raw provider has. ``--gateway-env "GATEWAY_X=Y …"``
passes settings to the gateway (to weigh one in the same run as another:
``--compare-env``, whose gateway runs interleaved with the first and is
reported as ``gateway-b``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import orjson
from network import SimulatedNetwork, add_network_flags
from websockets.asyncio.client import connect

from gateway.common.pcm import silence, tone
from gateway.upstream.base import AudioIn, ResponseDone, TextDelta, VoiceConfig
from gateway.upstream.openai import OpenAIRealtime
from gateway.wsfast import FastReadClientConnection
from protocol.events import Respond, Think
from protocol.parser import Parser
from tests.bench.benchlib import descendants, pin_tasks
from tests.support.redis_server import RedisServer

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
        pin_tasks([proc.pid], sorted(pin))  # every thread, the node's start-up ones too
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


async def quiet_until(send: object, done: asyncio.Event, start: float, first: int) -> None:
    """Silence in 20 ms frames at real-time pace from frame ``first`` until ``done``."""
    frame = silence(0.02, RATE)
    index = first
    while not done.is_set():
        delay = start + index * 0.02 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(frame)  # type: ignore[operator]
        index += 1


class Run:
    """One run's sessions: one clock for all, when each stops speaking, and when
    all have their answer."""

    def __init__(self, sessions: int, spread: float) -> None:
        self.sessions = sessions
        self.spread = spread
        self.waiting = sessions
        self.ready = asyncio.Event()
        self.start = 0.0
        self.measuring = sessions
        self.done = asyncio.Event()

    async def go(self, k: int) -> float:
        """Wait until every session is connected and configured; session ``k``'s start.

        One clock for all: a session's place in the simulator's queue then
        follows its speech end alone, not how long its own setup took (a
        gateway session's and a direct one's differ). Each session is offset
        by its share of one 20 ms frame, as independent microphones are: in
        step, all sessions' frames arrived in one burst every 20 ms, and an
        answer's event waited behind a hundred frames.
        """
        self.waiting -= 1
        if not self.waiting:
            self.start = time.monotonic() + 0.05
            self.ready.set()
        await self.ready.wait()
        return self.start + 0.02 * k / self.sessions

    def lead(self, k: int) -> bytes:
        """Session ``k``'s audio up to its speech end: silence (longer for later
        sessions, by ``spread / sessions`` each, in whole 20 ms frames), then
        speech.

        Whole frames: the simulator's VAD cuts the audio into 20 ms frames of
        its own, and speech that ended mid-frame was heard to end up to a
        frame later (up to 20 ms added to some sessions and not others).
        """
        frames = round(self.spread * k / self.sessions / 0.02)
        return silence(0.3 + frames * 0.02, RATE) + SPEECH

    def measured(self) -> None:
        self.measuring -= 1
        if not self.measuring:
            self.done.set()


Stages = dict[str, float]
"""When a session first saw each kind of event, in seconds from its last speech frame
sent; ``FIRST`` is the first think/respond chunk, the figure measured."""

FIRST = "first chunk"


async def direct_session(base: str, run: Run, k: int) -> Stages:
    upstream = OpenAIRealtime(base_url=base, api_key="k")
    await upstream.open("", [], voice=VoiceConfig(audio_in=AudioIn(rate=RATE)))
    try:
        start = await run.go(k)
        index = await paced(upstream.send_audio, run.lead(k), start, 0)
        ended = time.perf_counter()
        tail = asyncio.create_task(quiet_until(upstream.send_audio, run.done, start, index))
        parser = Parser()  # the model's markers, as any client of the raw provider must read them
        seen: Stages = {}
        while True:
            event = await upstream.recv()
            seen.setdefault(type(event).__name__, time.perf_counter() - ended)
            if isinstance(event, TextDelta) and FIRST not in seen:
                if any(isinstance(out, (Think, Respond)) for out in parser.feed(event.text)):
                    seen[FIRST] = time.perf_counter() - ended
            elif isinstance(event, ResponseDone) and FIRST in seen:
                break  # the whole answer read, as the gateway reads it
        run.measured()
        await tail
        return seen
    finally:
        await upstream.close()


async def gateway_session(url: str, run: Run, k: int) -> Stages:
    async with connect(
        url, max_size=None, compression=None, create_connection=FastReadClientConnection
    ) as ws:
        await ws.recv()  # session
        await ws.send(orjson.dumps({"type": "configure", "input_audio": {"rate": RATE}}).decode())
        await ws.recv()  # configured
        start = await run.go(k)
        index = await paced(ws.send, run.lead(k), start, 0)
        ended = time.perf_counter()
        tail = asyncio.create_task(quiet_until(ws.send, run.done, start, index))
        seen: Stages = {}
        while True:
            frame = await ws.recv()
            if not isinstance(frame, str):
                continue
            kind = orjson.loads(frame)["type"]
            seen.setdefault(kind, time.perf_counter() - ended)
            if kind in ("think", "respond"):
                seen.setdefault(FIRST, seen[kind])
            elif kind == "end" and FIRST in seen:
                break  # the whole answer read, as the direct run reads it
        run.measured()
        await tail
        return seen


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


async def door_and_litellm(
    sim_base: str, sessions: int, seconds: float, litellm_venv: Path, repeats: int
) -> tuple[float, float]:
    """CPU µs per frame of the gateway's OpenAI door and of LiteLLM's proxy, each
    relaying the same appends from ``sessions`` clients (medians of ``repeats``,
    interleaved)."""
    from tests.bench.side_by_side_bench import (
        LITELLM_KEY,
        ensure_litellm,
        litellm_proc,
        tree_cpu_seconds,
    )
    from tests.bench.voice_cost_bench import DOOR_MODEL, openai_wire

    exe = ensure_litellm(litellm_venv)
    door_figures: list[float] = []
    litellm_figures: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        litellm = litellm_proc(exe, f"{sim_base}/realtime", Path(tmp)).start(timeout=180)
        try:
            pin = PINS["gateway"]
            if pin is not None:
                pin_tasks([litellm.pid, *descendants(litellm.pid)], sorted(pin))
            async with process(*gateway_args(sim_base), env={"OPENAI_API_KEY": "k"}) as (
                url,
                pid,
            ):
                door = url.split("/v1/")[0] + "/openai/v1/realtime"
                for _ in range(repeats):
                    used, frames = await openai_wire(
                        f"{door}?model={DOOR_MODEL}",
                        {},
                        sessions,
                        seconds,
                        partial(cpu_seconds, pid),
                    )
                    door_figures.append(used / frames * 1e6 if frames else float("nan"))
                    used, frames = await openai_wire(
                        f"{litellm.url}?model=sim",
                        {"Authorization": f"Bearer {LITELLM_KEY}"},
                        sessions,
                        seconds,
                        partial(tree_cpu_seconds, litellm.pid),
                    )
                    litellm_figures.append(used / frames * 1e6 if frames else float("nan"))
        finally:
            litellm.stop()
    return median(door_figures), median(litellm_figures)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def env_pairs(text: str) -> dict[str, str]:
    """``"GATEWAY_X=1 GATEWAY_Y=2"`` as a dict."""
    return dict(pair.partition("=")[::2] for pair in text.split())


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs of each")
    parser.add_argument("--pin", action="store_true", help="gateway on CPU 1, the rest on CPU 0")
    parser.add_argument(
        "--probes",
        type=int,
        default=25,
        help="direct sessions run alongside the gateway's (0: separate direct runs instead)",
    )
    parser.add_argument(
        "--spread",
        type=float,
        default=2.0,
        help="seconds over which the sessions' speech ends are spaced (0: all in step)",
    )
    parser.add_argument("--stages", action="store_true", help="print when each event arrived")
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        default=50.0,
        help="the simulator's text chunks per second per answer (0: unpaced)",
    )
    parser.add_argument(
        "--redis", action="store_true", help="the gateway on a Redis store (implied by --redis-rtt)"
    )
    parser.add_argument("--gateway-env", default="", help="GATEWAY_X=Y … for the gateway")
    parser.add_argument(
        "--compare-env",
        default=None,
        help="a second gateway with these settings (GATEWAY_X=Y …), run interleaved and "
        "reported as gateway-b",
    )
    parser.add_argument("--no-relay-cpu", action="store_true", help="skip the audio CPU figure")
    parser.add_argument(
        "--litellm-venv",
        type=Path,
        default=None,
        help="LiteLLM's proxy relaying the same audio, against the gateway's OpenAI door",
    )
    add_network_flags(parser)
    ns = parser.parse_args()
    n = ns.sessions
    if ns.pin:
        PINS.update(gateway={1}, others={0})
        os.sched_setaffinity(0, {0})
    net = SimulatedNetwork.from_args(ns)
    variants = {"gateway": env_pairs(ns.gateway_env)}
    if ns.compare_env is not None:
        variants["gateway-b"] = env_pairs(ns.compare_env)
    names = ["direct", *variants]
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    stages: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    pooled: dict[str, list[float]] = {name: [] for name in names}
    pace = ("--tokens-per-second", f"{ns.tokens_per_second:g}")
    with contextlib.ExitStack() as stack:
        stack.enter_context(net)
        extra: tuple[str, ...] = ()
        if ns.redis or ns.redis_rtt is not None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            redis = RedisServer(tmp / "redis")
            redis.start()
            stack.callback(redis.stop)
            extra = ("--redis", net.url("redis", redis.url, net.redis))
        async with process("sim", "--port", "0", *pace) as (sim_ws, _):
            sim_base = sim_ws.split("/v1/")[0] + "/v1"
            base = net.url("provider", sim_base, net.provider)
            direct_base = net.url("direct", sim_base, net.client + net.provider)
            routes = 0
            for _ in range(ns.repeats):
                for variant, variant_env in variants.items():
                    env = {"OPENAI_API_KEY": "k", **variant_env}
                    args = (*gateway_args(base), *extra)
                    if ns.probes:
                        # Together: the probes meet the same simulator load and CPU as
                        # the gateway's sessions; their speech ends interleave.
                        total = n + ns.probes
                        run = Run(total, ns.spread)
                        every = total / ns.probes
                        probes = {int(j * every + every / 2) for j in range(ns.probes)}
                        async with process(*args, env=env) as (url, _):
                            routes += 1
                            url = net.url(f"client-{routes}", url, net.client)
                            seen_all = await asyncio.gather(
                                *(
                                    direct_session(direct_base, run, k)
                                    if k in probes
                                    else gateway_session(url, run, k)
                                    for k in range(total)
                                )
                            )
                        direct = [seen for k, seen in enumerate(seen_all) if k in probes]
                        through = [seen for k, seen in enumerate(seen_all) if k not in probes]
                    else:
                        run = Run(n, ns.spread)
                        direct = await asyncio.gather(
                            *(direct_session(direct_base, run, k) for k in range(n))
                        )
                        run = Run(n, ns.spread)
                        async with process(*args, env=env) as (url, _):
                            routes += 1
                            url = net.url(f"client-{routes}", url, net.client)
                            through = await asyncio.gather(
                                *(gateway_session(url, run, k) for k in range(n))
                            )
                    for name, group in (("direct", direct), (variant, through)):
                        firsts = [seen[FIRST] for seen in group]
                        pooled[name] += firsts
                        runs[name].append((pct(firsts, 50), pct(firsts, 99)))
                        for seen in group:
                            for kind, at in seen.items():
                                stages[name].setdefault(kind, []).append(at)
            pinned = ", gateway pinned to CPU 1, the rest to CPU 0" if ns.pin else ""
            how = (
                f"{ns.probes} direct alongside"
                if ns.probes
                else f"{n} direct in separate runs, interleaved"
            )
            how += f", speech ends spread over {ns.spread:g} s, {ns.repeats} run(s) pooled"
            store = "Redis" if extra else "memory"
            print(
                f"speech end -> first chunk, {n} concurrent voice sessions through the gateway "
                f"({store} store), {how}{pinned} (ms); {net.describe()}"
            )
            for variant, variant_env in variants.items():
                print(
                    f"  {variant}: {' '.join(f'{k}={v}' for k, v in variant_env.items()) or 'defaults'}"
                )
            print(f"  {'':10}{'p50':>10}{'p99':>10}   {'samples':>8}   each run (p50/p99)")
            figures = {}
            for name, got in runs.items():
                figures[name] = (pct(pooled[name], 50), pct(pooled[name], 99))
                each = "  ".join(f"{a:.0f}/{b:.0f}" for a, b in got)
                print(
                    f"  {name:10}{figures[name][0]:>10.1f}{figures[name][1]:>10.1f}"
                    f"   {len(pooled[name]):>8}   {each}"
                )
            for variant in variants:
                print(
                    f"  added {variant[7:] or '':4}"
                    f"{figures[variant][0] - figures['direct'][0]:>10.1f}"
                    f"{figures[variant][1] - figures['direct'][1]:>10.1f}"
                )
            if ns.stages:
                print(
                    "when each kind of event first arrived, ms from the last speech frame (all runs)"
                )
                for name, kinds in stages.items():
                    for kind, ats in sorted(kinds.items(), key=lambda item: median(item[1])):
                        print(f"  {name:8} {kind:24}{pct(ats, 50):>10.1f}{pct(ats, 99):>10.1f}")
            if not ns.no_relay_cpu:
                rate = await relay_cpu(base, n, 5.0)
                print(
                    f"gateway: {rate:,.0f} audio frames relayed per CPU-second ({n} sessions, 5 s)"
                )
            if ns.litellm_venv is not None:
                door, theirs = await door_and_litellm(
                    sim_base, n, 5.0, ns.litellm_venv, max(ns.repeats, 3)
                )
                print(
                    f"the same audio as OpenAI appends ({n} sessions, 5 s, medians of "
                    f"{max(ns.repeats, 3)} interleaved repeats): the gateway's door {door:.1f} "
                    f"µs of CPU per frame, LiteLLM's proxy {theirs:.1f}; door ÷ LiteLLM "
                    f"{door / theirs:.2f}"
                )


if __name__ == "__main__":
    asyncio.run(main())
