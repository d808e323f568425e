"""A simulated network between two parts of a test: latency, jitter, bandwidth, cuts.

This machine has no kernel network emulation (``tc netem``), and every part of
the gateway's world (clients, gateway, Redis, its replica, the provider) runs
on loopback, where a round trip costs microseconds. ``LatencyProxy`` is a TCP
proxy in user space placed between two of them: point one side at the
proxy's port and the proxy at the other side. Each direction of each
connection is a FIFO whose chunks are released ``rtt / 2`` (plus jitter)
after they were read, and no faster than the link's bandwidth:

    tx_start = max(read_at, link_free);  link_free = tx_start + len / bandwidth
    due      = link_free + rtt / 2 + jitter_sample

A chunk never overtakes the one before it (TCP delivers in order), so a
jittered link's mean delay is a little above ``rtt / 2 + jitter / 2``. A new
connection's first bytes to the server are not delivered before ``rtt`` after
the accept (the client's SYN / SYN-ACK round trip that the local kernel
skipped).

**Timing.** An event loop's timers have millisecond resolution (``epoll_wait``
takes milliseconds; uvloop rounds ``call_later`` to whole ms), too coarse for
a 0.25 ms one-way delay. The loop does all the I/O; one ``_Waker`` thread
sleeps with the kernel's fine timer (``threading.Condition.wait``) until the
earliest due chunk and wakes the loop with ``call_soon_threadsafe``; the loop
then releases every chunk due within ``EARLY`` and asks for the next wake-up.
``lateness()`` reports how late chunks really went (write time − due time):
the figure that says how faithful the simulated network was during a run.

**Bounded.** A direction holding more than ``max_buffer`` bytes stops reading
its source (``pause_reading``) until it drains below half of that; a
destination whose transport buffer is full (``pause_writing``) gets nothing
more until it drains. So a proxy holds at most ``max_buffer`` + one read +
the transport's high-water mark per direction, whatever the two ends do.

**Cuts.** ``cut()`` resets every open connection (both ends see ECONNRESET,
queued bytes are dropped), as a broken route or a killed middlebox would;
``refusing = True`` resets new connections at once; ``held = True`` delivers
nothing (a partition that TCP rides out: bytes wait, bounded as above, and
go when it heals).

For benches the proxies run in a process of their own (``NetemProcess``, the
``python -m tests.support.netem`` command), so their CPU is not the
measured process's and their loop is not the load generator's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import math
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final, cast

__all__ = ["EARLY", "LatencyProxy", "Link", "NetemProcess", "ProxyStats"]

# Chunks due within this many seconds are released in the same wake-up: one
# loop wake-up per burst, at the cost of sending some chunks that early.
EARLY: Final = 20e-6
# A wake-up is asked for this much before the due time: the mean time one
# takes to run (the waker thread, then the loop), learnt as it goes.
LEAD_WEIGHT: Final = 0.05
LEAD_MAX: Final = 500e-6
# Lateness samples kept (a ring): enough for a bench run, bounded for a long one.
LATENESS_SAMPLES: Final = 200_000
DEFAULT_MAX_BUFFER: Final = 4 << 20

_clock = time.perf_counter


@dataclass(frozen=True)
class Link:
    """One simulated link, the same both ways.

    ``rtt``: round-trip time in seconds (``rtt / 2`` each way). ``jitter``:
    each chunk's one-way delay varies uniformly by up to ± this many seconds
    (never below zero, never reordering). ``bandwidth``: bytes per second each
    way (0: unlimited).
    """

    rtt: float = 0.0
    jitter: float = 0.0
    bandwidth: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rtt", "jitter", "bandwidth"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"Link.{name} must be a finite number >= 0, not {value!r}")

    @classmethod
    def parse(cls, text: str) -> Link:
        """``"1ms"``, ``"rtt=1ms,jitter=0.1ms,bandwidth=10MB"``: the command line's form."""
        fields: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, eq, value = part.partition("=")
            if not eq:
                name, value = "rtt", part
            if name not in ("rtt", "jitter", "bandwidth"):
                raise ValueError(f"unknown link field {name!r}: use rtt, jitter, bandwidth")
            fields[name] = _bytes(value) if name == "bandwidth" else _seconds(value)
        return cls(**fields)


def _seconds(text: str) -> float:
    text = text.strip().lower()
    for suffix, scale in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text) * 1e-3  # a bare number is milliseconds, as the benches' flags


def _bytes(text: str) -> float:
    text = text.strip().upper().removesuffix("/S")
    for suffix, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


@dataclass
class ProxyStats:
    """What a proxy carried (both directions summed) and how close to due it went."""

    connections: int = 0
    open: int = 0
    cuts: int = 0
    bytes: int = 0
    chunks: int = 0
    writes: int = 0
    max_queued: int = 0
    """The most bytes one direction held at once (the ``max_buffer`` bound's witness)."""
    pauses: int = 0
    """Times a direction stopped reading its source (its buffer was full)."""
    lateness_p50_us: float = 0.0
    lateness_p99_us: float = 0.0
    lateness_max_us: float = 0.0


class _Waker(threading.Thread):
    """Wakes the loop at the earliest time asked for, with a sub-millisecond timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: object) -> None:
        super().__init__(name="netem-waker", daemon=True)
        self._loop = loop
        self._callback = callback
        self._cond = threading.Condition()
        self._at = math.inf
        self._stopping = False
        self.fired_for = math.inf  # the time the last wake-up was asked for

    def wake_at(self, at: float) -> None:
        if at < self._at:  # unlocked peek: a stale read only costs a notify
            with self._cond:
                if at < self._at:
                    self._at = at
                    self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def run(self) -> None:
        cond = self._cond
        with cond:
            while not self._stopping:
                wait = self._at - _clock()
                if wait <= 0:
                    self.fired_for = self._at
                    self._at = math.inf
                    try:
                        self._loop.call_soon_threadsafe(self._callback)  # type: ignore[arg-type]
                    except RuntimeError:  # the loop closed under us
                        return
                    continue
                cond.wait(None if wait == math.inf else wait)


class _Direction:
    """One way of one connection: chunks in order, each with the time it may go."""

    __slots__ = (
        "blocked",
        "dead",
        "dst",
        "ended",
        "finished",
        "link_free",
        "pair",
        "proxy",
        "queue",
        "queued",
        "scheduled",
        "src",
        "src_paused",
    )

    def __init__(self, pair: _Pair, not_before: float) -> None:
        self.pair = pair
        self.proxy = pair.proxy
        self.queue: deque[tuple[float, bytes | None]] = deque()  # None: end of stream
        self.queued = 0
        self.src: asyncio.Transport | None = None
        self.dst: asyncio.Transport | None = None  # None until the target answers
        self.src_paused = False
        self.blocked = False  # the destination's buffer is full
        self.scheduled = False  # in the proxy's heap
        self.ended = False  # the source sent its end (queued as None)
        self.finished = False  # that end reached the destination
        self.dead = False  # reset: nothing more is carried
        self.link_free = not_before

    def push(self, data: bytes | None, now: float) -> None:
        if self.dead or self.ended:
            return
        proxy = self.proxy
        link = proxy.link
        start = max(now, self.link_free)
        if data is not None and link.bandwidth:
            start += len(data) / link.bandwidth
        self.link_free = start
        due = start + link.rtt / 2
        if link.jitter:
            due = max(start, due + proxy.rng.uniform(-link.jitter, link.jitter))
        if self.queue:
            due = max(due, self.queue[-1][0])  # never overtake the chunk before
        self.queue.append((due, data))
        if data is None:
            self.ended = True
        else:
            self.queued += len(data)
            if self.queued > proxy.stats.max_queued:
                proxy.stats.max_queued = self.queued
            if self.queued > proxy.max_buffer and not self.src_paused and self.src is not None:
                self.src_paused = True
                proxy.stats.pauses += 1
                self.src.pause_reading()
        if not self.scheduled:
            proxy.schedule(self, self.queue[0][0])

    def release(self, until: float, now: float) -> None:
        """Write every chunk due by ``until`` (one write), unless held or blocked."""
        self.scheduled = False
        proxy = self.proxy
        dst = self.dst
        if proxy.held or self.blocked or dst is None or self.dead:
            return  # rescheduled by whatever lifts the obstacle
        queue = self.queue
        out: list[bytes] = []
        end = False
        ring = proxy.lateness_ring
        while queue and queue[0][0] <= until:
            due, data = queue.popleft()
            ring.record(now - due)
            if data is None:
                end = True
                break
            out.append(data)
        if out:
            payload = out[0] if len(out) == 1 else b"".join(out)
            self.queued -= len(payload)
            stats = proxy.stats
            stats.bytes += len(payload)
            stats.chunks += len(out)
            stats.writes += 1
            if not dst.is_closing():
                dst.write(payload)
        if self.src_paused and self.queued <= proxy.max_buffer // 2 and self.src is not None:
            self.src_paused = False
            if not self.src.is_closing():
                self.src.resume_reading()
        if end:
            self.finished = True
            self.pair.delivered_end(self)
        elif queue:
            proxy.schedule(self, queue[0][0])

    def wake(self) -> None:
        """Whatever held this direction back is gone: schedule its next chunk."""
        if self.queue and not self.scheduled and not self.dead:
            self.proxy.schedule(self, self.queue[0][0])

    def kill(self) -> None:
        self.dead = True
        self.queue.clear()
        self.queued = 0


class _Ring:
    """The last ``LATENESS_SAMPLES`` lateness figures, in seconds."""

    def __init__(self) -> None:
        self.values = array("d")
        self.next = 0

    def record(self, value: float) -> None:
        if len(self.values) < LATENESS_SAMPLES:
            self.values.append(value)
        else:
            self.values[self.next] = value
            self.next = (self.next + 1) % LATENESS_SAMPLES

    def percentiles(self) -> tuple[float, float, float]:
        if not self.values:
            return 0.0, 0.0, 0.0
        ordered = sorted(self.values)
        n = len(ordered)
        return ordered[n // 2], ordered[min(n - 1, int(n * 0.99))], ordered[-1]

    def clear(self) -> None:
        self.values = array("d")
        self.next = 0


class _End(asyncio.Protocol):
    """One socket of a proxied connection: what it reads goes into ``incoming``."""

    def __init__(self, pair: _Pair, incoming: _Direction, outgoing: _Direction) -> None:
        self.pair = pair
        self.incoming = incoming  # filled from this socket
        self.outgoing = outgoing  # drained into this socket
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.incoming.src = transport
        if self.incoming.src_paused:
            transport.pause_reading()
        self.outgoing.dst = transport
        self.outgoing.wake()

    def data_received(self, data: bytes) -> None:
        self.incoming.push(data, _clock())

    def eof_received(self) -> bool:
        self.incoming.push(None, _clock())
        return True  # keep writing the other way until it ends too

    def pause_writing(self) -> None:
        self.outgoing.blocked = True

    def resume_writing(self) -> None:
        self.outgoing.blocked = False
        self.outgoing.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.pair.lost(self, exc)


class _Pair:
    """A client connection and the proxy's connection to the target."""

    def __init__(self, proxy: LatencyProxy, accepted_at: float) -> None:
        self.proxy = proxy
        # Client → server: not before the handshake's round trip the kernel skipped.
        self.up = _Direction(self, accepted_at + proxy.link.rtt)
        self.down = _Direction(self, accepted_at)
        self.client = _End(self, self.up, self.down)
        self.server = _End(self, self.down, self.up)
        self.closed = False

    async def connect(self) -> None:
        """Dial the target; what the client sends meanwhile waits in ``up`` (bounded)."""
        loop = asyncio.get_running_loop()
        try:
            host, port = self.proxy.target
            await loop.create_connection(lambda: self.server, host, port)
        except OSError:
            self.reset()
            return
        if self.closed:
            self.reset()

    def delivered_end(self, direction: _Direction) -> None:
        """``direction``'s source ended and that end reached its destination."""
        dst = direction.dst
        other = self.down if direction is self.up else self.up
        if other.finished or other.dead:
            self._close_both()
        elif dst is not None and not dst.is_closing():
            if dst.can_write_eof():
                dst.write_eof()
            else:
                self._close_both()

    def lost(self, end: _End, exc: Exception | None) -> None:
        """One socket closed. Reset: the other is reset too. Closed: like an end of stream."""
        if self.closed:
            return
        if exc is not None:
            self.reset()
            return
        end.outgoing.kill()  # nothing can be written to it any more
        if end.incoming.finished:
            self._close_both()
        else:
            end.incoming.push(None, _clock())

    def _close_both(self) -> None:
        for end in (self.client, self.server):
            if end.transport is not None and not end.transport.is_closing():
                end.transport.close()
        self._forget()

    def reset(self) -> None:
        """Both sockets closed with RST (SO_LINGER 0), queued bytes dropped."""
        self.up.kill()
        self.down.kill()
        for end in (self.client, self.server):
            transport = end.transport
            if transport is None or transport.is_closing():
                continue
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        self._forget()

    def _forget(self) -> None:
        if not self.closed:
            self.closed = True
            self.proxy._pairs.discard(self)
            self.proxy.stats.open = len(self.proxy._pairs)


class _Refused(asyncio.Protocol):
    """A connection made while the proxy refuses: reset at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()  # type: ignore[attr-defined]


class LatencyProxy:
    """A TCP proxy from ``listen`` to ``target`` over a simulated ``link`` (module docstring)."""

    def __init__(
        self,
        target: tuple[str, int],
        link: Link = Link(),
        *,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        max_buffer: int = DEFAULT_MAX_BUFFER,
        seed: int | None = None,
        name: str = "",
    ) -> None:
        self.target = target
        self.link = link
        self.name = name or f"{target[0]}:{target[1]}"
        self.max_buffer = max_buffer
        self.rng = random.Random(seed)
        self.refusing = False
        self.accepted = asyncio.Event()  # a connection came (what a test may await)
        self.stats = ProxyStats()
        self.lateness_ring = _Ring()
        self._listen = listen
        self._held = False
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._heap: list[tuple[float, int, _Direction]] = []
        self._ticket = 0
        self._waker: _Waker | None = None
        self._lead = 0.0  # seconds a wake-up is asked for before the due time

    # --- life ---------------------------------------------------------------------

    async def start(self) -> LatencyProxy:
        loop = asyncio.get_running_loop()
        self._waker = _Waker(loop, self._fire)
        self._waker.start()
        self._server = await loop.create_server(
            self._accept, self._listen[0], self._listen[1], backlog=4096
        )
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for pair in list(self._pairs):
            pair.reset()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._waker is not None:
            self._waker.stop()
            self._waker.join(5)
            self._waker = None

    async def __aenter__(self) -> LatencyProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the proxy first"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> tuple[str, int]:
        return self._listen[0], self.port

    def _accept(self) -> asyncio.Protocol:
        self.stats.connections += 1
        self.accepted.set()
        if self.refusing:
            return _Refused()
        pair = _Pair(self, _clock())
        self._pairs.add(pair)
        self.stats.open = len(self._pairs)
        task = asyncio.get_running_loop().create_task(pair.connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pair.client

    # --- the network's state --------------------------------------------------------

    def set_link(self, link: Link) -> None:
        """A new link for chunks read from now on (queued ones keep their due times)."""
        self.link = link

    @property
    def held(self) -> bool:
        return self._held

    @held.setter
    def held(self, value: bool) -> None:
        """A partition: nothing is delivered while held; everything queued goes after."""
        self._held = value
        if not value:
            for pair in list(self._pairs):
                pair.up.wake()
                pair.down.wake()

    def cut(self) -> int:
        """Reset every open connection (both ends see a reset); how many there were."""
        pairs = list(self._pairs)
        for pair in pairs:
            pair.reset()
        self.stats.cuts += len(pairs)
        return len(pairs)

    def lateness(self) -> tuple[float, float, float]:
        """p50, p99 and max of (write time − due time), seconds, over the recent chunks."""
        return self.lateness_ring.percentiles()

    def snapshot(self, *, reset: bool = False) -> ProxyStats:
        """The stats with lateness filled in; ``reset`` starts a new measurement window."""
        p50, p99, worst = self.lateness()
        stats = replace(
            self.stats,
            lateness_p50_us=p50 * 1e6,
            lateness_p99_us=p99 * 1e6,
            lateness_max_us=worst * 1e6,
        )
        if reset:
            self.lateness_ring.clear()
            self.stats = ProxyStats(open=self.stats.open)
        return stats

    # --- scheduling (loop thread) ---------------------------------------------------

    def schedule(self, direction: _Direction, due: float) -> None:
        direction.scheduled = True
        self._ticket += 1
        heap = self._heap
        if heap and heap[0][0] <= due:
            heapq.heappush(heap, (due, self._ticket, direction))
            return  # an earlier wake-up is already asked for
        heapq.heappush(heap, (due, self._ticket, direction))
        if self._waker is not None:
            self._waker.wake_at(due - self._lead)

    def _fire(self) -> None:
        heap = self._heap
        now = _clock()
        waker = self._waker
        if waker is not None and waker.fired_for != math.inf:
            # How long a wake-up takes to run here (thread, then loop): asked
            # for that much sooner, chunks go close to their due time.
            lag = min(max(now - waker.fired_for, 0.0), LEAD_MAX)
            self._lead += (lag - self._lead) * LEAD_WEIGHT
            waker.fired_for = math.inf
        until = now + EARLY
        while heap and heap[0][0] <= until:
            _due, _ticket, direction = heapq.heappop(heap)
            direction.release(until, now)
        if heap and waker is not None:
            waker.wake_at(heap[0][0] - self._lead)


# ------------------------------------------------------------------ the proxy process


class NetemProcess:
    """Proxies in a process of their own, driven over its stdin (for benches).

    ``add(name, target, link)`` starts a route and returns its port;
    ``set_link``, ``cut``, ``stats`` act on one; ``stop()`` ends the process.
    Each call waits for the process's one-line JSON answer.
    """

    def __init__(self, *, cpu: set[int] | None = None) -> None:
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.netem"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        if cpu is not None:
            os.sched_setaffinity(self.proc.pid, cpu)
        self._lock = threading.Lock()
        self.ports: dict[str, int] = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the netem process exited ({self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"netem: {answer['error']}")
        return answer

    def add(self, name: str, target: tuple[str, int], link: Link, **options: object) -> int:
        answer = self._call(
            {"op": "add", "name": name, "target": list(target), "link": asdict(link), **options}
        )
        port = int(answer["port"])
        self.ports[name] = port
        return port

    def set_link(self, name: str, link: Link) -> None:
        self._call({"op": "set", "name": name, "link": asdict(link)})

    def cut(self, name: str) -> int:
        return int(self._call({"op": "cut", "name": name})["cut"])

    def hold(self, name: str, held: bool) -> None:
        self._call({"op": "hold", "name": name, "held": held})

    def refuse(self, name: str, refusing: bool) -> None:
        self._call({"op": "refuse", "name": name, "refusing": refusing})

    def stats(self, name: str, *, reset: bool = False) -> ProxyStats:
        answer = self._call({"op": "stats", "name": name, "reset": reset})
        return ProxyStats(**answer["stats"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, RuntimeError):
                self._call({"op": "quit"})
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self) -> NetemProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _serve_stdin() -> None:
    """The process side of ``NetemProcess``: one JSON request a line, one answer a line."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    proxies: dict[str, LatencyProxy] = {}

    def answer(value: dict[str, object]) -> None:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()

    try:
        while line := await reader.readline():
            try:
                request = json.loads(line)
                op = request["op"]
                if op == "quit":
                    answer({})
                    break
                if op == "add":
                    proxy = LatencyProxy(
                        (str(request["target"][0]), int(request["target"][1])),
                        Link(**request["link"]),
                        name=request["name"],
                        max_buffer=int(request.get("max_buffer", DEFAULT_MAX_BUFFER)),
                        seed=request.get("seed"),
                    )
                    await proxy.start()
                    proxies[request["name"]] = proxy
                    answer({"port": proxy.port})
                    continue
                proxy = proxies[request["name"]]
                if op == "set":
                    proxy.set_link(Link(**request["link"]))
                    answer({})
                elif op == "cut":
                    answer({"cut": proxy.cut()})
                elif op == "hold":
                    proxy.held = bool(request["held"])
                    answer({})
                elif op == "refuse":
                    proxy.refusing = bool(request["refusing"])
                    answer({})
                elif op == "stats":
                    answer({"stats": asdict(proxy.snapshot(reset=bool(request.get("reset"))))})
                else:
                    answer({"error": f"unknown op {op!r}"})
            except Exception as exc:  # a bad request is answered, the proxies keep going
                answer({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        for proxy in proxies.values():
            await proxy.close()


def _run_routes(routes: Iterable[str]) -> None:
    """``--route LISTEN_PORT=HOST:PORT@LINK``: fixed routes until interrupted."""

    async def main() -> None:
        proxies = []
        for route in routes:
            listen, _, rest = route.partition("=")
            target, _, link = rest.partition("@")
            host, _, port = target.rpartition(":")
            proxy = LatencyProxy(
                (host or "127.0.0.1", int(port)),
                Link.parse(link or "0"),
                listen=("127.0.0.1", int(listen or 0)),
            )
            await proxy.start()
            proxies.append(proxy)
            print(f"netem 127.0.0.1:{proxy.port} -> {target} {proxy.link}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            for proxy in proxies:
                await proxy.close()

    with contextlib.suppress(KeyboardInterrupt):
        _run(main())


def _run(main: object) -> None:
    # A proxy's waker must get the GIL back quickly while the loop thread works.
    sys.setswitchinterval(1e-4)
    try:
        import uvloop

        uvloop.run(main)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(main)  # type: ignore[arg-type]


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    cli.add_argument(
        "--route",
        action="append",
        default=[],
        help="LISTEN_PORT=HOST:PORT@rtt=1ms,jitter=0.1ms,bandwidth=10MB (repeatable); "
        "without routes, requests are read from stdin (NetemProcess)",
    )
    ns = cli.parse_args()
    if ns.route:
        _run_routes(ns.route)
    else:
        _run(_serve_stdin())
