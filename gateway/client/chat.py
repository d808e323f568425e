"""``gateway chat URL``: a terminal client for the gateway.

Shows think text dimmed, tool calls and results, and the response as it
streams. When the connection drops it reconnects with ``session_id`` and
``after`` (the last seq it printed), so nothing is missed or printed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TextIO
from urllib.parse import urlencode, urlsplit, urlunsplit

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from protocol.events import (
    Call,
    Cancelled,
    End,
    Error,
    Event,
    Interrupt,
    Metric,
    Respond,
    Result,
    Session,
    Think,
    User,
    decode_event,
)

__all__ = ["ChatView", "run_chat"]

DIM = "\x1b[2m"
BOLD = "\x1b[1m"
CYAN = "\x1b[36m"
RED = "\x1b[31m"
RESET = "\x1b[0m"


class ChatView:
    """Renders events to a terminal stream."""

    def __init__(self, out: TextIO, *, color: bool = True) -> None:
        self.out = out
        self.color = color
        self._mode = ""

    def _c(self, code: str) -> str:
        return code if self.color else ""

    def _switch(self, mode: str) -> None:
        if mode != self._mode:
            if self._mode:
                self.out.write(self._c(RESET))
                if self._mode in ("think", "respond"):
                    self.out.write("\n")
            self._mode = mode

    def show(self, event: Event) -> None:
        w = self.out.write
        if isinstance(event, Think):
            if self._mode != "think":
                self._switch("think")
                w(self._c(DIM) + "thinking: ")
            w(event.content)
        elif isinstance(event, Respond):
            self._switch("respond")
            w(event.content)
        elif isinstance(event, Call):
            self._switch("")
            call = orjson.loads(event.content)
            args = orjson.dumps(call.get("args", {})).decode()
            w(f"{self._c(CYAN)}→ {call.get('name')}({args}){self._c(RESET)}\n")
        elif isinstance(event, Result):
            self._switch("")
            for item in orjson.loads(event.content):
                text = item.get("content")
                text = text if isinstance(text, str) else orjson.dumps(text).decode()
                if len(text) > 300:
                    text = text[:300] + "…"
                w(
                    f"{self._c(CYAN)}← {item.get('tool')} [{item.get('status')}] {text}{self._c(RESET)}\n"
                )
        elif isinstance(event, End):
            self._switch("")
        elif isinstance(event, Metric):
            self._switch("")
            w(
                f"{self._c(DIM)}[tokens: step {event.step.input} in / {event.step.output} out; "
                f"session {event.total.input} / {event.total.output}]{self._c(RESET)}\n"
            )
        elif isinstance(event, Error):
            self._switch("")
            w(f"{self._c(RED)}error ({event.code}): {event.content}{self._c(RESET)}\n")
        elif isinstance(event, Interrupt):
            self._switch("")
            w(f"{self._c(RED)}interrupted: {event.content}{self._c(RESET)}\n")
        elif isinstance(event, Cancelled):
            self._switch("")
            w(f"{self._c(RED)}cancelled{self._c(RESET)}\n")
        elif isinstance(event, User):
            self._switch("")
            w(f"{self._c(BOLD)}you: {event.content}{self._c(RESET)}\n")
        elif isinstance(event, Session):
            self._switch("")
            state = "resumed" if event.resumed else "new"
            w(
                f"{self._c(DIM)}[session {event.session_id} ({state}) at seq {event.seq}]{self._c(RESET)}\n"
            )
        self.out.flush()


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = "&".join(p for p in (parts.query, urlencode(params)) if p)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


async def _read_lines(queue: asyncio.Queue[str | None]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            await queue.put(None)
            return
        await queue.put(line.rstrip("\n"))


async def run_chat(url: str, *, token: str | None = None, color: bool = True) -> int:
    """Chat until stdin ends. ``/cancel`` cancels the running turn."""
    view = ChatView(sys.stdout, color=color)
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    reader = asyncio.create_task(_read_lines(lines))
    sid: str | None = None
    last = 0
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        while True:
            target = url if sid is None else _with_query(url, session_id=sid, after=str(last))
            try:
                async with connect(target, additional_headers=headers, max_size=None) as ws:
                    sid, last, finished = await _session(ws, view, lines, last)
                    if finished:
                        return 0
            except InvalidStatus as exc:
                body = (
                    exc.response.body.decode(errors="replace").strip() if exc.response.body else ""
                )
                print(f"refused: HTTP {exc.response.status_code} {body}", file=sys.stderr)
                return 1
            except (OSError, ConnectionClosed) as exc:
                print(
                    f"{RED if color else ''}connection lost ({exc}); reconnecting…{RESET if color else ''}",
                    file=sys.stderr,
                )
                await asyncio.sleep(1.0)
    finally:
        reader.cancel()


async def _session(
    ws: ClientConnection, view: ChatView, lines: asyncio.Queue[str | None], last: int
) -> tuple[str, int, bool]:
    """Serve one connection; returns (session id, last seq, stdin finished)."""
    first = decode_event(await ws.recv())
    assert isinstance(first, Session), f"expected a session frame, got {first!r}"
    view.show(first)
    sid = first.session_id
    idle = asyncio.Event()
    idle.set()

    async def pump() -> None:
        nonlocal last
        async for frame in ws:
            event = decode_event(frame)
            if event.seq > last:
                last = event.seq
            view.show(event)
            if isinstance(event, End | Cancelled):
                idle.set()

    receiver = asyncio.create_task(pump())
    try:
        while True:
            get = asyncio.create_task(lines.get())
            done, _ = await asyncio.wait({get, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if receiver in done:
                get.cancel()
                receiver.result()  # ConnectionClosed → the caller reconnects
                raise ConnectionClosed(None, None)
            line = get.result()
            if line is not None and line.strip() == "/cancel":
                await ws.send(orjson.dumps({"type": "cancel"}).decode())
                continue
            if line is not None and not line.strip():
                continue
            # One turn at a time: lines typed (or piped) during a turn wait for its end.
            waiter = asyncio.create_task(idle.wait())
            await asyncio.wait({waiter, receiver}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if receiver.done():
                receiver.result()
                raise ConnectionClosed(None, None)
            if line is None:
                return sid, last, True
            idle.clear()
            await ws.send(orjson.dumps({"type": "user", "content": line}).decode())
    finally:
        receiver.cancel()
        with contextlib.suppress(BaseException):
            await receiver
