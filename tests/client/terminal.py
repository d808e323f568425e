"""A command in a real pseudo-terminal, driven like a user at a keyboard.

The child gets the pty as its controlling terminal, so writing ``\\x03`` is a
real Ctrl-C: the terminal's line discipline sends SIGINT to the process, as it
would for a person. Output is read without blocking the event loop, so the
gateway under test can run in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import re
import signal
import sys

__all__ = ["Terminal"]


class Terminal:
    """``await Terminal.start("chat", url)``: ``gateway chat`` on a pty."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.output = ""
        self._seen = 0  # where the last match ended: later matches start there
        self._data = asyncio.Event()
        self._eof = False
        asyncio.get_running_loop().add_reader(fd, self._on_readable)

    @classmethod
    async def start(cls, *args: str) -> Terminal:
        argv = [sys.executable, "-m", "gateway.cli", *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TERM": "dumb"}
        pid, fd = pty.fork()
        if pid == 0:  # the child: become the command
            try:
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        return cls(pid, fd)

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            data = b""
        if not data:
            self._eof = True
            asyncio.get_running_loop().remove_reader(self.fd)
        self.output += data.decode(errors="replace").replace("\r\n", "\n")
        self._data.set()

    async def expect(self, text: str, timeout: float = 20.0) -> None:
        """Wait until ``text`` is printed after what the last ``expect`` matched.

        Like pexpect, a match consumes the output up to its end: what was
        printed earlier (a hint that names a command, the echo of a typed
        line already matched) cannot satisfy a later expectation.
        """
        await self.expect_re(re.escape(text), timeout)

    async def expect_re(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """``expect`` for a regular expression; returns its match."""
        regex = re.compile(pattern)
        async with asyncio.timeout(timeout):
            while (match := regex.search(self.output, self._seen)) is None:
                if self._eof:
                    raise AssertionError(
                        f"exited before printing {pattern!r} after:\n{self.output[self._seen :]}"
                    )
                self._data.clear()
                await self._data.wait()
        self._seen = match.end()
        return match

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    async def wait(self, timeout: float = 20.0) -> int:
        """The exit status (waits for it without blocking the loop)."""
        async with asyncio.timeout(timeout):
            _, status = await asyncio.to_thread(os.waitpid, self.pid, 0)
        self.close()
        return os.waitstatus_to_exitcode(status)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._eof:
            loop.remove_reader(self.fd)
            self._eof = True
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        with contextlib.suppress(OSError):
            os.close(self.fd)
