"""``shell``: run a command line in the workspace (off unless the operator enables it).

A shell is not confined by ``tools.sandbox``: it runs with the gateway's user
and can reach anything that user can, which is why ``builtin_tools`` leaves
it out by default. What it does guarantee:

- the working directory is the workspace;
- the environment is an allow-list (PATH, HOME=workspace, PWD, LANG, TERM):
  none of the gateway's variables (``*_API_KEY``, ``REDIS_URL``…) reach it;
- the command runs in its own process group, and at the end of every call
  (success, failure, timeout, cancel) the whole group is killed, so
  ``sleep 999 &`` or a forked server does not outlive the call (a process
  that leaves the group with ``setsid`` does: that needs a container);
- no file it writes, anywhere, can grow past what is left of the workspace
  quota (``RLIMIT_FSIZE`` on the child: a process writing past it gets
  SIGXFSZ), and a command that leaves the workspace over its quota gets a
  failure saying to delete files. Several files, each under the limit, can
  still add up past the quota within one call; the check afterwards reports
  it and stops ``write``/``edit`` and further growth until files are deleted;
- output is capped per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from tools.base import Tool, ToolContext, ToolFailure
from tools.output import truncation_note
from tools.quota import over_quota_message, workspace_usage
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
    journaled = True

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
        quota = ctx.limits.max_workspace_bytes
        room = max(quota - await asyncio.to_thread(workspace_usage, root), 0)
        proc = await asyncio.create_subprocess_shell(
            args.command,
            cwd=root,
            env=_environment(root),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, so we can kill all of it
            preexec_fn=_file_size_limit(room),
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
        # Background processes that closed their output (``sleep 999 >/dev/null &``)
        # are still in the group: they must not outlive the call either.
        _kill_group(proc.pid)
        usage = await asyncio.to_thread(workspace_usage, root)
        if usage > quota:
            raise ToolFailure(
                f"the command ran (exit code {code}) but {over_quota_message(usage, ctx.limits)} "
                f"(e.g. with rm).\nstdout:\n{out.text()}\nstderr:\n{err.text()}"
            )
        result: dict[str, Any] = {"exit_code": code, "stdout": out.text(), "stderr": err.text()}
        if code in (128 + signal.SIGXFSZ, -signal.SIGXFSZ) or usage >= quota:
            result["note"] = (
                f"files written here may not grow past the workspace quota of {quota:,} bytes "
                f"(it holds {usage:,}); a process that tried was stopped with SIGXFSZ. Delete "
                "files you no longer need before writing more"
            )
        return result


def _file_size_limit(room: int) -> Callable[[], None]:
    """A ``preexec_fn`` capping the size of any file the command writes to ``room`` bytes.

    It runs in the forked child before exec and only calls ``setrlimit``, which
    takes no lock another thread could hold, so it is safe despite the
    gateway's threads; the limit is inherited by everything the command starts.
    """

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (room, room))

    return apply


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
    _kill_group(proc.pid)
    try:
        await proc.wait()
        await asyncio.wait(readers, timeout=_DRAIN_AFTER_KILL)
    finally:
        for reader in readers:
            reader.cancel()


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in the group (none left is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _environment(root: Path) -> dict[str, str]:
    """A minimal environment: nothing of the gateway's (API keys, tokens) leaks to the command."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(root),
        "PWD": str(root),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }
