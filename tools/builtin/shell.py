"""``shell``: run a command line in the workspace (off unless the operator enables it).

A shell is not confined by ``tools.sandbox``: it runs with the gateway's user
and can reach anything that user can, which is why ``builtin_tools`` leaves
it out by default. What it does guarantee: the working directory is the
workspace; the environment is minimal (the gateway's own variables, API keys
included, are not passed on); the command runs in its own process group, and
on timeout or cancel the whole group is killed, so ``sleep 999 &`` or a
forked server does not outlive the call; output is capped per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from tools.base import Tool, ToolContext, ToolFailure
from tools.output import truncation_note
from tools.sandbox import workspace_root

__all__ = ["ShellArgs", "ShellTool"]

_CHUNK: Final = 65_536
_DRAIN_AFTER_KILL: Final = 2.0
"""Seconds to wait for the pipes to close after the group is killed (a process that
left the group with setsid could keep them open forever)."""


class ShellArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    command: Annotated[
        str,
        msgspec.Meta(
            min_length=1, description="command line for /bin/sh, run in the workspace root"
        ),
    ]


class ShellTool(Tool[ShellArgs]):
    name = "shell"
    args_type = ShellArgs

    def __init__(self, *, timeout: float = 20.0, max_output: int = 32_000) -> None:
        """``timeout`` in seconds for the whole command; ``max_output`` bytes kept per stream.

        Keep ``timeout`` below the executor's timeout for ``shell`` so the model
        gets the command's partial output rather than a bare executor timeout.
        """
        self.timeout = timeout
        self.max_output = max_output
        self.description = (
            "Run a command with /bin/sh in the workspace root (stdin is empty). Returns "
            f"exit_code, stdout and stderr. Commands are killed after {timeout:g}s."
        )

    async def run(self, args: ShellArgs, ctx: ToolContext) -> Any:
        root = workspace_root(ctx.workspace)
        proc = await asyncio.create_subprocess_shell(
            args.command,
            cwd=root,
            env=_environment(root),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, so we can kill all of it
        )
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Capture(self.max_output), _Capture(self.max_output)
        readers = [
            asyncio.create_task(out.drain(proc.stdout)),
            asyncio.create_task(err.drain(proc.stderr)),
        ]
        try:
            async with asyncio.timeout(self.timeout):
                # asyncio.wait, not gather: a timeout must not cancel the readers,
                # which then see EOF only once every process holding the pipes is dead.
                await asyncio.wait(readers)
                code = await proc.wait()
        except TimeoutError:
            await _kill(proc, readers)
            raise ToolFailure(
                f"the command timed out after {self.timeout:g}s and was killed, with every "
                "process it started; run something shorter or limit its work.\n"
                f"stdout so far:\n{out.text()}\nstderr so far:\n{err.text()}"
            ) from None
        except BaseException:  # cancelled by the executor (timeout) or the user
            await _kill(proc, readers)
            raise
        return {"exit_code": code, "stdout": out.text(), "stderr": err.text()}


class _Capture:
    """Reads a pipe to EOF, keeping the first ``cap`` bytes and counting the rest.

    Draining everything (rather than stopping at the cap) keeps a chatty
    command from blocking on a full pipe until the timeout.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.total = 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_CHUNK):
            self.total += len(chunk)
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            text += truncation_note(self.total, len(self.kept))
        return text


async def _kill(proc: asyncio.subprocess.Process, readers: list[asyncio.Task[None]]) -> None:
    """SIGKILL the command's process group, reap it, and wait briefly for its pipes to close."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        await proc.wait()
        await asyncio.wait(readers, timeout=_DRAIN_AFTER_KILL)
    finally:
        for reader in readers:
            reader.cancel()


def _environment(root: Path) -> dict[str, str]:
    """A minimal environment: nothing of the gateway's (API keys, tokens) leaks to the command."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(root),
        "PWD": str(root),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }
