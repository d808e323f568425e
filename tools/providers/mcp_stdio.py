"""The stdio transport for MCP servers, with bounded lines and a captured stderr.

It does what the SDK's ``mcp.client.stdio.stdio_client`` does (spawn the
command in its own session, newline-delimited JSON-RPC over its stdin and
stdout, the same environment, the spec's shutdown: close stdin, wait, SIGTERM
the process group, SIGKILL), with four differences:

- **Lines are bounded.** ``tools.providers.lines.LineFramer`` cuts stdout
  into lines of at most ``max_line`` bytes in linear time; a longer line is
  dropped as it streams past. When its ends name a pending request, that
  request is answered at once with a ``MESSAGE_TOO_LARGE`` error; an overlong
  answer that names none ends the connection, so no call waits out its
  timeout for an answer that was thrown away. (The SDK's reader joins its
  whole buffer again for every chunk: a 100 MB line kept a core busy for the
  whole tool timeout, and would have been held whole.)
- **Lines are taken only when cheap to take** (``_line``): one with an array
  of over 1,024 values, or nested too deeply to parse, fails the request it
  answers at once (``MESSAGE_UNREADABLE``); a large one is validated in a
  worker thread; and what the server sends of its own accord (requests,
  notifications, junk) is read at ``SERVER_RATE`` a second, the rest dropped
  unread and noted in the log once every 10 s.
- **stderr is captured**, line by line (bounded the same way), and logged as
  ``mcp server NAME: …``. Until the first connection is made the lines are
  held back, so a server that fails to start costs the node one line naming
  the reason (``exited with status 1 … ModuleNotFoundError: …``), not a child's
  traceback in the node's output.
- **Why the connection ended** is kept (``fate()``: ``exited with status 3``),
  for the messages calls and startup fail with.

POSIX only, as the gateway is.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from typing import Final

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client import Transport
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage
from mcp_types import (
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError

from protocol.json_outline import LARGE_FRAME
from tools.providers.lines import (
    KEPT,
    DroppedNotes,
    Line,
    LineFramer,
    Overlong,
    OverlongEnd,
    RequestId,
    ServerPace,
    overlong_answer,
    overlong_kind,
    too_wide,
)

__all__ = ["MESSAGE_TOO_LARGE", "MESSAGE_UNREADABLE", "StdioChild", "validation_reason"]

log = logging.getLogger("tools.providers.mcp")

MESSAGE_TOO_LARGE: Final = -32050
"""The error code of a request whose answer was over the limit (an implementation-defined
JSON-RPC server error, outside the codes the MCP SDK uses)."""
MESSAGE_UNREADABLE: Final = -32051
"""The error code of a request whose answer the gateway could not take: not JSON-RPC,
nested too deeply, or an array of over ``json_outline.MAX_VALUES`` values (its message
says which). Without it the call waited out its timeout for an answer dropped."""
SERVER_RATE: Final = 200.0
"""Requests, notifications and unreadable lines a server may send a second of its own
accord (``ServerPace``); a server's log notifications come a few a second."""

_READ: Final = 64 * 1024
_STDERR_LINE: Final = 2_000
_STDERR_HELD: Final = 20
_WRITER_FLUSH: Final = 0.5
_EXIT_GRACE: Final = 2.0
"""Seconds a child has to exit after its stdin closes, and again after SIGTERM (the SDK's)."""
_EXIT_SEEN: Final = 1.0
"""Seconds to wait, once stdout ended, for the child's exit status and last stderr lines."""


class StdioChild:
    """One MCP server child process; ``connect()`` is its ``mcp.client.Transport``.

    Make a new one for every connection: ``fate`` and the held stderr belong
    to one child.
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_line: int,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.env = get_default_environment() | dict(env or {})
        self.cwd = cwd
        self.max_line = max_line
        self.ended = ""
        """How the child's side ended the connection ("exited with status 3"; "" if it did not)."""
        self._pending: set[RequestId] = set()
        self._pace = ServerPace(SERVER_RATE, time.monotonic())
        self._notes = DroppedNotes(log, self.name)
        self._overlong_answered = False
        self._held: collections.deque[str] | None = collections.deque(maxlen=_STDERR_HELD)
        self._last_stderr = ""
        self._stderr_done = anyio.Event()
        self._stdout_ended = False
        self._stdout_done = anyio.Event()
        self._closing = False

    def connect(self) -> Transport:
        """Spawn the child when entered, stop it when left."""
        return self._connected()

    def connected(self) -> None:
        """The first connection is made: log the stderr lines held back, and from now on each as it comes."""
        held, self._held = self._held, None
        for text in held or ():
            log.info("mcp server %s: %s", self.name, text)

    def fate(self, when: str = "", *, stderr: bool = True) -> str:
        """Why the connection ended, with the child's last stderr line ("" if the child did not end it).

        ``fate("before it answered")``: "exited with status 1 before it answered
        (last stderr line: ModuleNotFoundError: No module named 'x')". ``stderr=False``
        for what a client and the model read: a server's last words may hold what its
        operator alone may see (a database URL with its password); they are in the log.
        """
        if not self.ended:
            return ""
        text = f"{self.ended} {when}".rstrip()
        last = self._last_stderr if stderr else ""
        return f"{text} (last stderr line: {last})" if last else text

    # ------------------------------------------------------------------ life

    @contextlib.asynccontextmanager
    async def _connected(
        self,
    ) -> AsyncIterator[
        tuple[
            MemoryObjectReceiveStream[SessionMessage | Exception],
            MemoryObjectSendStream[SessionMessage],
        ]
    ]:
        process = await anyio.open_process(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        # No await between the spawn and the task group: a cancel there would leak the child.
        to_session, from_child = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        to_child, from_session = anyio.create_memory_object_stream[SessionMessage](0)
        writer_done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._read_stdout, process, to_session)
            tg.start_soon(self._write_stdin, process, from_session, to_session, writer_done)
            tg.start_soon(self._read_stderr, process)
            try:
                yield from_child, to_child
            finally:
                with anyio.CancelScope(shield=True):
                    if self._stdout_ended:  # the child's side ended it: let the reader say why
                        with anyio.move_on_after(3 * _EXIT_SEEN):
                            await self._stdout_done.wait()
                    self._closing = True
                    from_child.close()  # the reader drains stdout from now on
                    to_child.close()
                    with anyio.move_on_after(_WRITER_FLUSH):
                        await writer_done.wait()
                    await _stop(process)
                    for stream in (from_child, to_child, to_session, from_session):
                        await stream.aclose()
                tg.cancel_scope.cancel()

    # ------------------------------------------------------------------ stdout

    async def _read_stdout(
        self,
        process: anyio.abc.Process,
        to_session: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        assert process.stdout is not None
        framer = LineFramer(self.max_line)
        delivering = True
        try:
            async with to_session:
                with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, OSError):
                    while True:
                        chunk = await process.stdout.receive(_READ)
                        if not delivering:
                            continue  # given up or closing: drain, so a blocked child can exit
                        try:
                            for frame in framer.feed(chunk):
                                if not await self._deliver(frame, to_session):
                                    delivering = False
                                    break
                        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                            delivering = False
                self._stdout_ended = True
                if not self._closing and not self.ended:
                    self.ended = await self._exit_reason(process)
        finally:
            self._stdout_done.set()

    async def _deliver(
        self,
        frame: Line | Overlong | OverlongEnd,
        to_session: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> bool:
        """Hand one frame to the session; False when the connection must end."""
        if isinstance(frame, Line):
            await self._line(frame.data, to_session)
            return True
        if isinstance(frame, OverlongEnd) and self._overlong_answered:
            self._overlong_answered = False  # answered when it began
            return True
        tail = frame.tail if isinstance(frame, OverlongEnd) else None
        answers = overlong_answer(frame.head, tail, self._pending)
        if answers is not None:
            self._overlong_answered = isinstance(frame, Overlong)
            self._pending.discard(answers)
            log.warning(
                "mcp server %s answered request %r with more than %d bytes; the answer is dropped",
                self.name,
                answers,
                self.max_line,
            )
            error = ErrorData(
                code=MESSAGE_TOO_LARGE,
                message=f"the answer was larger than {self.max_line:,} bytes, the most the "
                "gateway reads of one MCP message",
            )
            await to_session.send(
                SessionMessage(JSONRPCError(jsonrpc="2.0", id=answers, error=error))
            )
            return True
        if not isinstance(frame, OverlongEnd):
            return True  # the end may tell
        if overlong_kind(frame.head) == "answer":
            self.ended = (
                f"sent an answer of {frame.size:,} bytes, more than the {self.max_line:,} the "
                "gateway reads of one MCP message, that names no pending request"
            )
            log.warning("mcp server %s %s; disconnecting", self.name, self.ended)
            await to_session.aclose()
            return False
        log.warning(
            "mcp server %s sent a message of %d bytes (over %d); it is dropped: %.120r",
            self.name,
            frame.size,
            self.max_line,
            frame.head,
        )
        return True

    async def _line(
        self, data: bytes, to_session: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> None:
        """One whole line: its message to the session, or why it could not be taken.

        Answers are paced by the gateway's requests; the rest by ``ServerPace``. A
        large line is checked for arrays too wide first, then validated in a
        worker thread: 20,000 tools listed in one page, or an answer of 35,000
        content blocks, each held the loop 0.2-0.7 s when validated on it.
        """
        if not self._pace.admit_message(data, time.monotonic()):
            self._notes.note(f"sent more than {SERVER_RATE:g} messages a second of its own", data)
            return
        problem = too_wide(data)
        if problem is None:
            try:
                if len(data) < LARGE_FRAME:
                    message = jsonrpc_message_adapter.validate_json(data, by_name=False)
                else:
                    validate = partial(jsonrpc_message_adapter.validate_json, by_name=False)
                    message = await anyio.to_thread.run_sync(validate, data)
            except ValueError as exc:  # pydantic's ValidationError, JSON's errors
                problem = f"a message that is not JSON-RPC ({validation_reason(exc)})"
        if problem is not None:
            await self._unreadable(data, problem, to_session)
            return
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            self._pending.discard(message.id)
        await to_session.send(SessionMessage(message))

    async def _unreadable(
        self,
        data: bytes,
        problem: str,
        to_session: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        """A line not taken: the request it answers fails now, saying why; else it is noted."""
        answers = overlong_answer(data[:KEPT], data[-KEPT:], self._pending)
        if answers is None:
            self._notes.note(f"wrote a line that was dropped: {problem}", data)
            return
        self._pending.discard(answers)
        log.warning(
            "mcp server %s answered request %r with %s; the answer is dropped",
            self.name,
            answers,
            problem,
        )
        error = ErrorData(code=MESSAGE_UNREADABLE, message=problem)
        await to_session.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=answers, error=error)))

    async def _exit_reason(self, process: anyio.abc.Process) -> str:
        with anyio.move_on_after(_EXIT_SEEN):
            await self._stderr_done.wait()
        status = await _exit_status(process, _EXIT_SEEN)
        if status is None:
            return "closed its output"
        if status < 0:
            return f"was killed by signal {-status}"
        return f"exited with status {status}"

    # ------------------------------------------------------------------ stdin

    async def _write_stdin(
        self,
        process: anyio.abc.Process,
        from_session: MemoryObjectReceiveStream[SessionMessage],
        to_session: MemoryObjectSendStream[SessionMessage | Exception],
        done: anyio.Event,
    ) -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for session_message in from_session:
                    message = session_message.message
                    if isinstance(message, JSONRPCRequest):
                        self._pending.add(message.id)
                    elif isinstance(message, JSONRPCNotification) and (
                        message.method == "notifications/cancelled"
                    ):
                        self._pending.discard((message.params or {}).get("requestId", ""))
                    data = message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The child stopped reading. The reader sees its output end and
            # says why; the session is told it ended even if the child lingers.
            with anyio.move_on_after(3 * _EXIT_SEEN):
                await self._stdout_done.wait()
            await to_session.aclose()
        finally:
            done.set()

    # ------------------------------------------------------------------ stderr

    async def _read_stderr(self, process: anyio.abc.Process) -> None:
        assert process.stderr is not None
        framer = LineFramer(_STDERR_LINE)
        try:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, OSError):
                while True:
                    chunk = await process.stderr.receive(_READ)
                    for frame in framer.feed(chunk):
                        if isinstance(frame, Line):
                            self._stderr_line(frame.data)
                        elif isinstance(frame, Overlong):
                            self._stderr_line(frame.head + b"... (line cut)")
        finally:
            self._stderr_done.set()

    def _stderr_line(self, data: bytes) -> None:
        text = data.decode("utf-8", errors="replace").rstrip()
        self._last_stderr = text
        if self._held is not None:
            self._held.append(text)
        else:
            log.info("mcp server %s: %s", self.name, text)


async def _exit_status(process: anyio.abc.Process, timeout: float) -> int | None:
    """The child's exit status, once it exits within ``timeout``; None if it did not.

    Polled, not ``process.wait()``: that also waits for the pipes to close,
    and a grandchild holding them would make an exited server look hung.
    """
    with anyio.move_on_after(timeout):
        while process.returncode is None:  # noqa: ASYNC110 (no event says "exited")
            await anyio.sleep(0.01)
    return process.returncode


async def _stop(process: anyio.abc.Process) -> None:
    """Close stdin, let the child exit, then SIGTERM and SIGKILL its process group."""
    assert process.stdin is not None and process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if await _exit_status(process, _EXIT_GRACE) is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
    else:
        if await _exit_status(process, _EXIT_GRACE) is None:
            log.warning("mcp server process %d survived SIGKILL; abandoning it", process.pid)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.aclose()


def validation_reason(exc: BaseException) -> str:
    """The first thing wrong in a pydantic ``ValidationError``, in one short line
    (its text runs over lines and ends with a link to pydantic's site)."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_input=False)
        if errors:
            first = errors[0]
            where = ".".join(str(p) for p in first["loc"])
            more = f", and {len(errors) - 1} more" if len(errors) > 1 else ""
            return f"{where + ': ' if where else ''}{first['msg']}{more}"[:300]
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
