"""``gateway chat URL``: a terminal client for the gateway, built on ``Client``.

Shows think text dimmed, tool calls and results, and the response as it
streams. ``Client`` reconnects with ``session_id`` and ``after`` when the
connection drops, so nothing is missed or printed twice.

What a first hour needs: Ctrl-C cancels the running turn (a second one, or
one at the prompt, exits); ``/help`` lists the commands; an ``http://`` URL or
one without ``/v1/realtime`` is corrected in one line; a gateway that is not
running, or refuses the key, is one line and an exit — not endless retries.

Input is read by a daemon thread, so exiting never waits for a line that the
user has not typed (a thread blocked in ``readline`` cannot be cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import wave
from pathlib import Path
from typing import Final, TextIO

import orjson

from gateway.client.client import Client
from gateway.client.dial import BadUrl, ClientError, normalize_url
from gateway.common.pcm import read_wav
from protocol.events import (
    Call,
    Cancelled,
    Context,
    End,
    Error,
    Event,
    Interrupt,
    Metric,
    Respond,
    Result,
    Session,
    SpeechStarted,
    SpeechStopped,
    Think,
    User,
)

__all__ = ["COMMANDS", "ChatView", "run_chat"]

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
            why = " (you spoke)" if event.reason == "barge_in" else ""
            w(f"{self._c(RED)}cancelled{why}{self._c(RESET)}\n")
        elif isinstance(event, User):
            self._switch("")
            said = "you (spoken)" if event.source == "audio" else "you"
            w(f"{self._c(BOLD)}{said}: {event.content}{self._c(RESET)}\n")
        elif isinstance(event, Context):  # added without a turn (instructions, history)
            self._switch("")
            w(f"{self._c(DIM)}[{event.role} added: {event.content}]{self._c(RESET)}\n")
        elif isinstance(event, SpeechStarted | SpeechStopped):
            self._switch("")
            what = "speech started" if isinstance(event, SpeechStarted) else "speech stopped"
            w(f"{self._c(DIM)}[{what} at {event.offset_ms} ms]{self._c(RESET)}\n")
        elif isinstance(event, Session):
            self._switch("")
            state = "resumed" if event.resumed else "new"
            w(
                f"{self._c(DIM)}[session {event.session_id} ({state}) at seq {event.seq}]{self._c(RESET)}\n"
            )
        self.out.flush()


COMMANDS: Final[dict[str, str]] = {
    "/help": "list these commands",
    "/cancel": "cancel the running turn (Ctrl-C does the same)",
    "/session": "show the session id and the last seq received",
    "/quit": "leave (Ctrl-D or Ctrl-C at the prompt do the same)",
}
HINT: Final = (
    'type a message and press Enter; try "hello", or /tool list {"path": "."} '
    "to make the simulator call a tool; /help lists commands"
)


class _Interrupt:
    """Ctrl-C, delivered through the same queue as typed lines."""


_INTERRUPT: Final = _Interrupt()
_Input = str | None | _Interrupt  # a line, end of input, or Ctrl-C


def _read_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Input]) -> None:
    """Thread body: forward stdin lines to the loop; None at end of input."""
    try:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line.rstrip("\n"))
    except (OSError, ValueError):
        pass
    with contextlib.suppress(RuntimeError):  # the loop may be gone already
        loop.call_soon_threadsafe(queue.put_nowait, None)


async def run_chat(
    url: str,
    *,
    token: str | None = None,
    color: bool = True,
    audio: Path | None = None,
    session_id: str | None = None,
) -> int:
    """Chat until input ends, ``/quit`` or Ctrl-C at the prompt. Exit status 0, or 1/2 on errors.

    ``session_id``: go on in that session (what it logged before is not shown again).

    ``audio``: a 16-bit PCM WAV file spoken first (streamed at real-time pace,
    the gateway's voice activity detection ends the turn), then the chat goes on.
    """
    err = sys.stderr
    try:
        url, note = normalize_url(url)
    except BadUrl as exc:
        print(f"gateway chat: {exc}", file=err)
        return 2
    if note:
        print(f"gateway chat: {note}", file=err)
    speech: tuple[bytes, int] | None = None
    if audio is not None:  # checked before a session is made for it
        try:
            speech = read_wav(audio)
        except FileNotFoundError:
            print(f"gateway chat: --audio {audio}: no such file", file=err)
            return 2
        except (OSError, EOFError, ValueError, wave.Error) as exc:
            why = str(exc) if isinstance(exc, ValueError) else "not a WAV file"
            if not isinstance(exc, ValueError) and str(exc):
                why += f" ({exc})"
            print(
                f"gateway chat: --audio {audio}: {why}; give a 16-bit PCM WAV file "
                "(e.g. sox in.mp3 -b 16 -r 24000 -c 1 out.wav)",
                file=err,
            )
            return 2
        if not 8000 <= speech[1] <= 48000:
            print(
                f"gateway chat: --audio {audio}: {speech[1]} Hz is outside 8000-48000 Hz; "
                "resample it (e.g. sox in.wav -r 24000 out.wav)",
                file=err,
            )
            return 2
    view = ChatView(sys.stdout, color=color)
    red, reset = (RED, RESET) if color else ("", "")

    def connected(session: Session) -> None:
        view.show(session)

    def disconnected(reason: str) -> None:
        print(f"{red}{reason}; reconnecting…{reset}", file=err, flush=True)

    told: set[str] = set()

    def retrying(problem: ClientError) -> None:
        # A node answering 503 (draining, full, store down) is said at once, not after
        # the minute of retries: each different reason once.
        if str(problem) not in told:
            told.add(str(problem))
            print(f"{red}{problem}; retrying (Ctrl-C stops){reset}", file=err, flush=True)

    client = Client(
        url,
        token=token,
        session_id=session_id,
        on_connect=connected,
        on_disconnect=disconnected,
        on_retry=retrying,
        on_event=view.show,  # between turns: a background call's late result, its answer
    )
    try:
        await client.connect()
    except ClientError as exc:
        print(f"gateway chat: {exc}", file=err)
        return 1
    loop = asyncio.get_running_loop()
    inputs: asyncio.Queue[_Input] = asyncio.Queue()
    threading.Thread(target=_read_lines, args=(loop, inputs), daemon=True).start()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, inputs.put_nowait, _INTERRUPT)
    if sys.stdin.isatty():
        print(f"{DIM if color else ''}{HINT}{reset}", flush=True)
    try:
        if speech is not None:
            await _speak(client, view, *speech)
        return await _converse(client, view, inputs)
    except ClientError as exc:
        print(f"gateway chat: {exc}", file=err)
        return 1
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        await client.close()


async def _speak(client: Client, view: ChatView, pcm: bytes, rate: int) -> None:
    """Stream a WAV file's audio as the user's speech and show its turn."""
    await client.configure(input_audio={"format": "pcm16", "rate": rate})
    async for event in client.speak(pcm, rate):
        view.show(event)


async def _converse(client: Client, view: ChatView, inputs: asyncio.Queue[_Input]) -> int:
    """The prompt loop: commands, and one turn at a time."""
    waiting: list[_Input] = []  # typed during a turn: handled after it
    while True:
        item = waiting.pop(0) if waiting else await inputs.get()
        if item is None or isinstance(item, _Interrupt):
            return 0
        line = item.strip()
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return 0
        if line == "/help":
            for name, meaning in COMMANDS.items():
                view.out.write(f"  {name:<9} {meaning}\n")
            view.out.write("  anything else is sent to the model\n")
            view.out.flush()
            if client.session is not None and client.session.provider == "sim":
                view.out.write("the simulator's scripts:\n")  # it answers /help itself
                if await _turn(client, view, "/help", inputs, waiting):
                    return 0
            continue
        if line == "/session":
            view.out.write(f"session {client.session_id}, last seq {client.last_seq}\n")
            view.out.flush()
            continue
        if line == "/cancel":
            view.out.write("no turn is running\n")
            view.out.flush()
            continue
        if await _turn(client, view, item, inputs, waiting):
            return 0


async def _turn(
    client: Client,
    view: ChatView,
    text: str,
    inputs: asyncio.Queue[_Input],
    waiting: list[_Input],
) -> bool:
    """Run one turn, handling input meanwhile; True if the user asked to leave."""

    async def show() -> None:
        async for event in client.send(text):
            view.show(event)

    turn = asyncio.create_task(show())
    cancelling = leave = False
    try:
        while not turn.done():
            get = asyncio.ensure_future(inputs.get())
            await asyncio.wait({turn, get}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                break
            item = get.result()
            if isinstance(item, _Interrupt) or item in ("/cancel", "/quit", "/exit"):
                if cancelling and isinstance(item, _Interrupt):
                    return True  # a second Ctrl-C: leave now
                leave = leave or item in ("/quit", "/exit")
                if not cancelling:
                    cancelling = True
                    view.out.write("\ncancelling…\n")
                    view.out.flush()
                    await client.cancel()
            elif item is None:
                waiting.append(None)  # input ended: leave once the turn is over
            else:
                waiting.append(item)
        turn.result()
        return leave
    finally:
        if not turn.done():
            turn.cancel()
            with contextlib.suppress(BaseException):
                await turn
