"""Where a turn's first content spends its time inside the node, stage by stage.

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/first_word_trace.py [--sessions 10]
[--turns 6] [--pin-server 1] [--redis-rtt MS]`` (``--redis-rtt``: Redis behind the
bench's simulated link, ``tests.support.netem``, that many ms away)

``side_by_side_bench.py`` measures the first content's delay added against a
bare relay from outside. This says what it is made of. A real ``redis-server``,
the simulator (``gateway sim``) and a ``gateway serve`` run as subprocesses; the
gateway is started with trace hooks (this module's ``_install``, wrapping a few
methods before the server starts: nothing in the product carries them). Every
clock is ``CLOCK_MONOTONIC`` (``time.perf_counter_ns``), which Linux shares
between processes, so the client's receive time and the node's stage times
compare directly.

For each turn's first content event (the one ``SessionLog._emit`` marks
``hurry``), the stages, in µs:

- ``read→emit``: the upstream frame read by the provider socket's callback
  (``Inbox._intercept``) → the event numbered (parse, turn machine);
- ``emit→round``: numbered → its batch taken by a log round (a lingering round
  or the rounds in flight would show here);
- ``round→redis``: taken → the round's bytes written to Redis (packing);
- ``redis→reply``: written → Redis's reply read (``AppendPipe.data_received``):
  Redis woken, the command, the node woken;
- ``reply→client``: read → written to the client's socket;
- ``client``: written → read by the client process (loopback, its wake-up).

A bare relay pays only the first and the last kind of hop; "log, then send"
is the rest. Medians and p90 over every traced turn are printed, and before
them ``request``: the client's send of its turn → that first content's frame
read from the provider (the request's way through the node, the provider's
answer), which a relay pays too, and ``user→reply``: the same send → the turn's
``user`` event stored (a first content whose session still waits for that append
goes in the round after it: ``emit→round``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

STAGES = ("read→emit", "emit→round", "round→redis", "redis→reply", "reply→client", "client")


def _install(out: str) -> None:
    """Inside the gateway process: wrap the hops of a first content event."""
    import atexit

    from gateway.edge import connection
    from gateway.sessions import asking, session_log
    from gateway.store import redis_pipe
    from gateway.upstream import provider_socket

    now = time.perf_counter_ns
    last = {"read": 0, "sent": 0, "reply": 0}
    traces: dict[tuple[str, int], dict[str, int]] = {}
    waiting: dict[str, int] = {}  # sid → seq of its traced event not yet written to Redis
    users: dict[tuple[str, int], int] = {}  # a turn's user event → its append's reply read
    # sid → per request to the provider: when the node took the client's last frame,
    # ran its command (from, to), began the request and had written it (``asked``)
    asks: dict[str, list[tuple[int, int, int, int, int]]] = {}
    taken: dict[str, int] = {}

    intercept = provider_socket.Inbox._intercept

    def _intercept(self: Any, data: bytes, text: bool) -> bool:
        last["read"] = now()
        return intercept(self, data, text)

    emit = session_log.SessionLog._emit

    def _emit(self: Any, event: Any) -> None:
        hurried = self._hurry
        emit(self, event)
        if hurried:
            traces[(self.sid, event.seq)] = {"read": last["read"], "emit": now()}

    take = session_log.SessionLog.take_batch

    def take_batch(self: Any) -> Any:
        batch = take(self)
        if batch is not None:
            for entry in batch[0]:
                trace = traces.get((self.sid, entry.seq))
                if trace is not None:
                    trace["round"] = now()
                    waiting[self.sid] = entry.seq
        return batch

    send = redis_pipe.AppendPipe.send

    def pipe_send(self: Any, data: bytes, count: int, done: Any) -> None:
        before = now()
        send(self, data, count, done)
        stamp = now()
        for sid, seq in waiting.items():
            traces[(sid, seq)]["redis"] = stamp
            traces[(sid, seq)]["write"] = stamp - before
            traces[(sid, seq)]["count"] = count
        waiting.clear()

    received = redis_pipe.AppendPipe.data_received

    def data_received(self: Any, data: bytes) -> None:
        last["reply"] = now()
        received(self, data)

    appended = session_log.SessionLog.appended

    def session_appended(self: Any, batch: Any, result: Any) -> None:
        for entry in batch[0]:
            trace = traces.get((self.sid, entry.seq))
            if trace is not None:
                trace["reply"] = last["reply"]
            elif entry.data.startswith(b'{"type":"user"'):
                users[(self.sid, entry.seq)] = last["reply"]
        appended(self, batch, result)

    deliver = connection.ClientConnection.deliver

    def client_deliver(self: Any, entries: Any) -> None:
        deliver(self, entries)
        stamp = now()
        for entry in entries:
            trace = traces.get((self.sid, entry.seq))
            if trace is not None and "client" not in trace:
                trace["client"] = stamp

    handle = connection.ClientConnection._handle

    async def client_handle(self: Any, frame: str | bytes) -> None:
        taken[self.sid] = now()
        await handle(self, frame)

    request = asking.UpstreamAsker.request

    async def asker_request(self: Any, *args: Any, **kwargs: Any) -> None:
        start = now()
        await request(self, *args, **kwargs)
        sid = self.log.sid
        begun, done = dispatched.get(sid, (0, 0))
        asks.setdefault(sid, []).append((taken.get(sid, 0), begun, done, start, now()))

    dispatch = connection.dispatch
    dispatched: dict[str, tuple[int, int]] = {}

    async def timed_dispatch(message: Any, runtime: Any) -> Any:
        begun = now()
        try:
            return await dispatch(message, runtime)
        finally:
            dispatched[runtime.sid] = (begun, now())

    connection.dispatch = timed_dispatch
    connection.ClientConnection._handle = client_handle  # type: ignore[method-assign]
    asking.UpstreamAsker.request = asker_request  # type: ignore[method-assign]
    provider_socket.Inbox._intercept = _intercept  # type: ignore[method-assign]
    session_log.SessionLog._emit = _emit  # type: ignore[method-assign]
    session_log.SessionLog.take_batch = take_batch  # type: ignore[method-assign]
    redis_pipe.AppendPipe.send = pipe_send  # type: ignore[method-assign]
    redis_pipe.AppendPipe.data_received = data_received  # type: ignore[method-assign]
    session_log.SessionLog.appended = session_appended  # type: ignore[method-assign]
    connection.ClientConnection.deliver = client_deliver  # type: ignore[method-assign]

    def dump() -> None:
        rows = [{"sid": sid, "seq": seq, **t} for (sid, seq), t in traces.items()]
        stored = [{"sid": sid, "seq": seq, "stored": t} for (sid, seq), t in users.items()]
        Path(out).write_text(json.dumps({"traces": rows, "users": stored, "asks": asks}))

    atexit.register(dump)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


async def _client(port: int, turns: int, message: str, seen: list[dict[str, Any]]) -> None:
    import orjson
    from websockets.asyncio.client import connect

    # Sessions start apart and pause between turns, as the side-by-side bench's do:
    # turns in step would put every first word in one round.
    await asyncio.sleep(random.uniform(0, 1))
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime", max_size=None) as ws:
        first = orjson.loads(await ws.recv())
        sid = first.get("session_id") or first.get("sid") or ""
        for _ in range(turns + 1):  # the first turn warms up
            sent = time.perf_counter_ns()
            await ws.send(orjson.dumps({"type": "user", "content": message}).decode())
            got_first = False
            user_seq = 0
            while True:
                event = orjson.loads(await ws.recv())
                kind = event.get("type")
                if kind == "user":
                    user_seq = event["seq"]
                if not got_first and kind in ("think", "respond") and event.get("content"):
                    got_first = True
                    seen.append(
                        {
                            "sid": sid,
                            "seq": event["seq"],
                            "received": time.perf_counter_ns(),
                            "sent": sent,
                            "user": user_seq,
                        }
                    )
                if kind == "metric":
                    break
            await asyncio.sleep(random.uniform(0, 0.3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rate", type=float, default=20.0, help="deltas/s per session")
    parser.add_argument("--pin-server", type=int, default=None, metavar="CPU")
    parser.add_argument(
        "--redis-rtt", type=float, default=None, metavar="MS", help="Redis this many ms away"
    )
    parser.add_argument("--hooks-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=argparse.REMAINDER, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:  # the gateway's own process
        _install(args.hooks_out)
        from gateway.cli import main as gateway_main

        raise SystemExit(gateway_main(args.serve))

    from tests.support.netem import Link, NetemProcess
    from tests.support.redis_server import free_port

    work = Path(tempfile.mkdtemp(prefix="first-word-"))
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATEWAY_API_KEYS_FILE": "", "REDIS_URL": ""}
    procs: list[subprocess.Popen[bytes]] = []
    netem: NetemProcess | None = None
    try:
        redis_port = free_port()
        procs.append(
            subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(redis_port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(work),
                ],
                stdout=subprocess.DEVNULL,
            )
        )
        redis_via = redis_port
        if args.redis_rtt is not None:
            netem = NetemProcess()
            rtt = args.redis_rtt / 1000
            redis_via = netem.add("redis", ("127.0.0.1", redis_port), Link(rtt, rtt / 20))
        sim_port, gw_port = free_port(), free_port()
        procs.append(
            subprocess.Popen(
                [
                    py,
                    "-m",
                    "gateway.cli",
                    "sim",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(sim_port),
                    "--tokens-per-second",
                    str(args.rate),
                    "--chunk-size",
                    "4",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        trace_out = work / "trace.json"
        serve = [
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(gw_port),
            "--provider",
            "openai",
            "--model",
            "sim",
            "--log-level",
            "WARNING",
            "--redis",
            f"redis://127.0.0.1:{redis_via}/0",
            "--workspace-root",
            str(work / "ws"),
        ]
        cmd = [py, __file__, "--hooks-out", str(trace_out), "--serve", *serve]
        if args.pin_server is not None:
            cmd = ["taskset", "-c", str(args.pin_server), *cmd]
        gw_log = work / "gateway.log"
        with gw_log.open("wb") as log:
            gateway = subprocess.Popen(
                cmd,
                env={
                    **env,
                    "GATEWAY_OPENAI_BASE_URL": f"ws://127.0.0.1:{sim_port}/v1",
                    "OPENAI_API_KEY": "sim",
                },
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append(gateway)
        asyncio.run(_run(args, gw_port, gateway, trace_out, gw_log))
    finally:
        if netem is not None:
            netem.stop()
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


async def _run(
    args: argparse.Namespace, port: int, gateway: subprocess.Popen[bytes], out: Path, log: Path
) -> None:
    import websockets

    deadline = time.monotonic() + 30
    while True:
        try:
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime"):
                break
        except OSError:
            if gateway.poll() is not None or time.monotonic() > deadline:
                said = await asyncio.to_thread(log.read_text)
                raise SystemExit(f"the gateway did not start: {said[-2000:]}") from None
            await asyncio.sleep(0.1)
    seen: list[dict[str, Any]] = []
    message = "hello " * 20
    clients = [_client(port, args.turns, message, seen) for _ in range(args.sessions)]
    await asyncio.wait_for(asyncio.gather(*clients), 60 + args.turns * args.sessions * 5)
    gateway.send_signal(signal.SIGTERM)
    await asyncio.to_thread(gateway.wait, 30)
    dumped = await asyncio.to_thread(out.read_text)
    dump = json.loads(dumped)
    traces = {(t["sid"], t["seq"]): t for t in dump["traces"]}
    users = {(u["sid"], u["seq"]): u["stored"] for u in dump["users"]}
    _report(traces, users, seen, args)
    _report_request(dump["asks"], traces, seen)


def _report(
    traces: dict[tuple[str, int], dict[str, int]],
    users: dict[tuple[str, int], int],
    seen: list[dict[str, Any]],
    args: argparse.Namespace,
) -> None:
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    totals: list[float] = []
    writes: list[float] = []
    counts: list[int] = []
    request: list[float] = []  # the client's send → the first content's frame read
    user_stored: list[float] = []  # the client's send → its user event stored
    for got in seen:
        found = traces.get((got["sid"], got["seq"]))
        if found is None:
            continue
        trace = found
        points = [trace.get(k, 0) for k in ("read", "emit", "round", "redis", "reply", "client")]
        points.append(got["received"])
        if not all(points):
            continue
        steps = [(b - a) / 1000 for a, b in itertools.pairwise(points)]
        if steps[0] < 0 or steps[0] > 20_000:
            continue  # the frame came through the reader task, not the read callback
        for name, step in zip(STAGES, steps, strict=True):
            stages[name].append(step)
        totals.append(sum(steps))
        request.append((trace["read"] - got["sent"]) / 1000)
        stored = users.get((got["sid"], got["user"]))
        if stored:
            user_stored.append((stored - got["sent"]) / 1000)
        writes.append(trace["write"] / 1000)
        counts.append(trace["count"])
    print(
        f"{args.sessions} sessions × {args.turns} turns at {args.rate:g} deltas/s: "
        f"{len(totals)} first contents traced of {len(seen)}"
    )
    print(f"{'stage':<14} {'p50 µs':>9} {'p90 µs':>9}")
    for name, values in {"request": request, "user→reply": user_stored, **stages}.items():
        if values:
            q = statistics.quantiles(values, n=10)
            print(f"{name:<14} {statistics.median(values):9.0f} {q[8]:9.0f}")
    if writes:
        print(
            f"  of round→redis, the write to Redis: p50 {statistics.median(writes):.0f} µs; "
            f"commands in the round p50 {statistics.median(counts):.0f}"
        )
    if totals:
        q = statistics.quantiles(totals, n=10)
        print(f"{'read→client':<14} {statistics.median(totals):9.0f} {q[8]:9.0f}")


def _report_request(
    asks: dict[str, list[list[int]]],
    traces: dict[tuple[str, int], dict[str, int]],
    seen: list[dict[str, Any]],
) -> None:
    """``request`` split at the node, each session's first (warm-up) turn left out: it
    opens the provider's connection. The client's send → the node takes its frame
    (``send→node``), → its command runs (``node→command``: admission, the session
    found), the command itself (``command``: the turn machine fed), → the driver
    asks (``command→asking``: its wake-up, the actions before), → the provider's
    request written (``asking→asked``), → the first content's frame read
    (``asked→read``: the provider's pace, 50 ms here, and its lateness). A relay
    pays the first and the last too."""
    split: dict[str, list[float]] = {
        "send→node": [],
        "node→command": [],
        "command": [],
        "command→asking": [],
        "asking→asked": [],
        "asked→read": [],
    }
    warmups = {got["sid"]: min(g["sent"] for g in seen if g["sid"] == got["sid"]) for got in seen}
    for got in seen:
        trace = traces.get((got["sid"], got["seq"]))
        if got["sent"] == warmups[got["sid"]]:
            continue
        after = [a for a in asks.get(got["sid"], []) if a[0] >= got["sent"]]
        if trace is None or not after or not trace.get("read"):
            continue
        taken, begun, done, asking, written = after[0]
        split["send→node"].append((taken - got["sent"]) / 1000)
        split["node→command"].append((begun - taken) / 1000)
        split["command"].append((done - begun) / 1000)
        split["command→asking"].append((asking - done) / 1000)
        split["asking→asked"].append((written - asking) / 1000)
        split["asked→read"].append((trace["read"] - written) / 1000)
    for name, values in split.items():
        if len(values) > 1:
            q = statistics.quantiles(values, n=10)
            print(f"{name:<14} {statistics.median(values):9.0f} {q[8]:9.0f}")


if __name__ == "__main__":
    main()
