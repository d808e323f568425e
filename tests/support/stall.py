"""Is a node still answering everyone while one tenant's input is processed?

``StallProbe`` watches a running node (a real ``gateway serve`` process) from
two threads of the test process while a test feeds the node something
hostile:

- **health**: ``GET /healthz`` on a fresh connection every ``interval``
  seconds; the figure is the slowest answer (a connection that could not be
  made or answered counts as the time until it failed);
- **another tenant**: one WebSocket session of its own that runs ``hello``
  turns back to back; the figure is the longest wait for any event of a turn
  (from the message to its first event, and between two events), so a turn
  that was paused mid-stream is seen, not only a slow start.

Use it as a context manager: the readings are taken until the block ends,
and the final reading includes a stall that is still going on when it ends
(each watcher measures the request it has in flight at exit, instead of
dropping it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http.client
import threading
import time
from types import TracebackType
from urllib.parse import urlsplit

import orjson
from websockets.asyncio.client import connect

__all__ = ["LoopSteps", "LoopWatch", "StallProbe"]


class LoopWatch:
    """In the test's own process: the longest the loop went without running a ticker
    (every ``tick`` seconds), i.e. a stall's wall time; ``ticks`` counts its runs.

    The last reading is taken at exit, so a stall still going on when the watched
    block ends (the loop held until the awaited call returned) counts too. The heap
    is frozen while it watches, as ``gateway serve`` freezes its own after startup
    (``gateway.cli``): a node in a test shares pytest's heap, and a full collection
    of that (200 ms on a loaded machine, started by whichever thread allocates) is
    no stall a node would have."""

    def __init__(self, tick: float = 0.005) -> None:
        self.longest = 0.0
        self.ticks = 0
        self._tick = tick
        self._last = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        self._last = time.monotonic()
        while True:
            await asyncio.sleep(self._tick)
            self._reading()
            self.ticks += 1

    def _reading(self) -> None:
        now = time.monotonic()
        self.longest = max(self.longest, now - self._last)
        self._last = now

    async def __aenter__(self) -> LoopWatch:
        gc.collect()
        gc.freeze()
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._reading()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        gc.unfreeze()


class LoopSteps:
    """In the test's own process: the most CPU time the loop's thread spent between
    two runs of a 2 ms ticker, i.e. the longest step the loop took. CPU, not wall
    time: on a loaded machine the wall gaps grow with every preemption, while a
    step's own work does not, so a bound on it holds with a narrow margin."""

    def __init__(self) -> None:
        self.longest_cpu = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.thread_time()
        while True:
            await asyncio.sleep(0.002)
            now = time.thread_time()
            self.longest_cpu = max(self.longest_cpu, now - last)
            last = now

    async def __aenter__(self) -> LoopSteps:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


class StallProbe:
    """Slowest ``/healthz`` answer and longest wait in another tenant's turn, in seconds."""

    def __init__(
        self,
        http_base: str,
        ws_url: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        interval: float = 0.02,
        timeout: float = 30.0,
    ) -> None:
        self._http = urlsplit(http_base)
        self._ws_url = ws_url
        self._headers = headers or {}
        self._interval = interval
        self._timeout = timeout
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.health_max = 0.0
        self.health_checks = 0
        self.health_failures: list[str] = []
        self.turn_max_wait = 0.0
        self.turns = 0
        self.turn_failures: list[str] = []
        self._health_started: float | None = None
        self._turn_waiting_since: float | None = None

    # ------------------------------------------------------------------ life

    def __enter__(self) -> StallProbe:
        self._threads.append(threading.Thread(target=self._poll_health, daemon=True))
        if self._ws_url is not None:
            self._threads.append(threading.Thread(target=self._run_turns, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """End the watch; what is in flight now counts as far as it got."""
        now = time.monotonic()
        with self._lock:
            if self._health_started is not None:
                self.health_max = max(self.health_max, now - self._health_started)
            if self._turn_waiting_since is not None:
                self.turn_max_wait = max(self.turn_max_wait, now - self._turn_waiting_since)
        self._stop.set()
        for thread in self._threads:
            thread.join(self._timeout + 5)

    def summary(self) -> str:
        return (
            f"healthz max {self.health_max * 1000:.0f} ms over {self.health_checks} checks"
            f" (failures: {self.health_failures[:3]}); other tenant max wait "
            f"{self.turn_max_wait * 1000:.0f} ms over {self.turns} turns"
            f" (failures: {self.turn_failures[:3]})"
        )

    # ------------------------------------------------------------------ health

    def _poll_health(self) -> None:
        host = self._http.hostname or "127.0.0.1"
        port = self._http.port or 80
        while not self._stop.is_set():
            started = time.monotonic()
            with self._lock:
                self._health_started = started
            try:
                conn = http.client.HTTPConnection(host, port, timeout=self._timeout)
                try:
                    conn.request("GET", "/healthz")
                    conn.getresponse().read()
                finally:
                    conn.close()
            except OSError as exc:
                self.health_failures.append(f"{type(exc).__name__}: {exc}")
            elapsed = time.monotonic() - started
            with self._lock:
                self._health_started = None
                self.health_max = max(self.health_max, elapsed)
                self.health_checks += 1
            self._stop.wait(self._interval)

    # ------------------------------------------------------------------ another tenant

    def _run_turns(self) -> None:
        try:
            asyncio.run(self._turns())
        except Exception as exc:  # reported through turn_failures, read by the test
            self.turn_failures.append(f"{type(exc).__name__}: {exc}")

    async def _turns(self) -> None:
        assert self._ws_url is not None
        async with connect(
            self._ws_url, additional_headers=self._headers, open_timeout=self._timeout
        ) as ws:
            await asyncio.wait_for(ws.recv(), self._timeout)  # the session frame
            while not self._stop.is_set():
                await self._one_turn(ws)
                await asyncio.sleep(self._interval)

    async def _one_turn(self, ws: object) -> None:
        send = ws.send  # type: ignore[attr-defined]
        recv = ws.recv  # type: ignore[attr-defined]
        self._mark_waiting()
        await send(orjson.dumps({"type": "user", "content": "hello"}).decode())
        ended = False
        while True:
            frame = await asyncio.wait_for(recv(), self._timeout)
            self._mark_event()
            kind = orjson.loads(frame).get("type")
            if kind == "error" and not ended:
                self.turn_failures.append(frame if isinstance(frame, str) else repr(frame))
            if kind == "end" or kind == "cancelled":
                ended = True
            elif kind == "metric" and ended:
                break
            self._mark_waiting()
        with self._lock:
            self._turn_waiting_since = None
            self.turns += 1

    def _mark_waiting(self) -> None:
        with self._lock:
            self._turn_waiting_since = time.monotonic()

    def _mark_event(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._turn_waiting_since is not None:
                self.turn_max_wait = max(self.turn_max_wait, now - self._turn_waiting_since)
            self._turn_waiting_since = None
