"""A configuration file re-read when it changes: the API keys, the key policies, the guardrails.

``poll()`` is called on the event loop, on use and by the node's rights watch, so it
only ever costs one ``stat`` (at most every ``check_interval`` seconds). When the
file's stamp (mtime, size, inode) changed:

- a file over ``max_bytes`` is refused before a byte of it is read: a tenant's edit
  must not make the node parse (and hold) more than real deployments need;
- a small file (``inline_bytes``, about a millisecond of parsing) is loaded at once,
  so a ``SIGHUP`` or a poll acts before it returns;
- a larger one is read and parsed in a worker thread, at most one at a time, and the
  new version is swapped in on the loop when it is ready: a legal 5 MB keys file took
  250 ms of the loop, a 1.6 MB key policy file 1.2 s.

A file that does not load keeps what was loaded and is logged once: the stamp of what
was tried is remembered, so the same broken file is not parsed again at every check
(it was, ~1 s of every second) until it changes or a ``reload()`` asks for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from gateway.common.settings import ConfigError

__all__ = ["MiB", "ReloadedFile", "Stamp", "toml_tables"]

MiB = 1024 * 1024

Stamp = tuple[int, int, int]
"""What tells a changed file: mtime (ns), size and inode (an atomic replace is a new one)."""

T = TypeVar("T")


def toml_tables(text: str, path: Path) -> dict[str, Any]:
    """``text`` (read from ``path``) as TOML, or a ``ValueError`` naming the file and
    what to do: the key policies' and the guardrails' one reading."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nested table or array
        raise ValueError(f"{path}: its tables or arrays nest too deeply") from None


def _stamp(stat: os.stat_result) -> Stamp:
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n // 1024} KiB"


@dataclass(frozen=True, slots=True)
class _Outcome(Generic[T]):
    """One read of the file: what it held, or why it does not load (``problem``)."""

    stamp: Stamp | None
    value: T | None = None
    problem: str = ""


class ReloadedFile(Generic[T]):
    """``path`` parsed into a ``T`` by ``_parse`` (pure: it runs in a worker thread) and
    swapped in by ``_apply`` (on the loop); ``version`` counts the loads that changed it.

    Subclasses set their own state, then call ``__init__``, which loads the file and
    raises ``ConfigError`` (``setting: problem``) when it does not load: at start a
    broken file is the operator's to fix before serving.
    """

    what: ClassVar[str] = "file"  # how the log names it: "key policy file"
    setting: ClassVar[str] = "file"  # the setting that names it: "key_policy_file"
    max_bytes: ClassVar[int] = 1 * MiB
    inline_bytes: ClassVar[int] = 2 * 1024
    too_large_hint: ClassVar[str] = "make it smaller"
    keep_when_empty: ClassVar[bool] = True
    _log: ClassVar[logging.Logger] = logging.getLogger("gateway")

    def __init__(self, path: str | Path | None, *, check_interval: float) -> None:
        self.path = Path(path) if path else None
        self.check_interval = check_interval
        self.version = 0
        self._stamp: Stamp | None = None  # of the version last tried, loaded or not
        self._checked = 0.0
        self._unreadable = ""  # the last "cannot stat it" logged, said once
        self._loading: asyncio.Future[_Outcome[T]] | None = None
        self._again = False  # a reload() came while a load was in flight
        self._started = 0  # loads started; an older one landing late is dropped
        self._landed = 0
        if self.path is not None:
            outcome = self._read()
            if outcome.value is None:
                raise ConfigError(f"{self.setting}: {outcome.problem}")
            self._finish(self._next(), outcome, quiet=True)

    # ------------------------------------------------------------------ for subclasses

    def _parse(self, text: str) -> T:
        """The file's ``text`` parsed; ``ValueError`` names the place and the fix."""
        raise NotImplementedError

    def _apply(self, value: T) -> bool:
        """Serve ``value`` from now on; whether it differs from what was served."""
        raise NotImplementedError

    def _loaded(self) -> str:
        """What the log says after a load ("3 tables")."""
        raise NotImplementedError

    def _kept(self) -> str:
        """What a failed reload keeps, for the log ("the 3 keys loaded")."""
        return "what it had loaded"

    def _missing(self) -> str:
        """What to do about a file that does not exist."""
        return f"create it, or unset {self.setting}"

    # ------------------------------------------------------------------ the checks

    def poll(self) -> int:
        """Start a load if the file changed since it was last tried (one ``stat``, at
        most every ``check_interval`` s); ``version`` as loaded now."""
        now = time.monotonic()
        if self.path is None or now - self._checked < self.check_interval:
            return self.version
        self._checked = now
        if self._loading is not None:  # it landing tells; the next poll looks again
            return self.version
        try:
            stat = self.path.stat()
        except OSError as exc:
            self._stamp = None  # whatever appears there next is read
            problem = self._os_problem(exc)
            if problem != self._unreadable:
                self._unreadable = problem
                self._log.error("%s not reloaded, keeping %s: %s", self.what, self._kept(), problem)
            return self.version
        self._unreadable = ""
        stamp = _stamp(stat)
        if stamp == self._stamp:
            return self.version
        self._stamp = stamp
        if stat.st_size == 0 and self.keep_when_empty:
            # An editor that truncates, then writes, shows an empty file in between:
            # loaded, every rule went away until the next write.
            self._log.warning(
                "%s %s is empty: keeping %s (to have none, write a file holding only a comment)",
                self.what,
                self.path,
                self._kept(),
            )
            return self.version
        self._begin(stat.st_size)
        return self.version

    def reload(self) -> bool | None:
        """Read the file now, changed or not (``SIGHUP``): True when it loaded, False when
        it did not (logged; what was loaded stays), None when it is being read off the
        loop (large, or a load was in flight): the log says how it went."""
        if self.path is None:
            return True
        if self._loading is not None:
            self._again = True
            return None
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0  # the read says what is wrong
        return self._begin(size)

    async def settled(self) -> int:
        """``version`` once no load is in flight (tests, and whoever must see a change)."""
        while self._loading is not None:
            await asyncio.shield(self._loading)
            await asyncio.sleep(0)  # the done callback runs after the awaiters' wake-up
        return self.version

    # ------------------------------------------------------------------ the loads

    def _next(self) -> int:
        self._started += 1
        return self._started

    def _begin(self, size: int) -> bool | None:
        """Refuse an oversized file; load a small one now; a larger one in a thread."""
        n = self._next()
        if size > self.max_bytes:
            self._finish(n, _Outcome(self._stamp, problem=self._too_large(size)))
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (the CLI, a sync caller): nothing to stall
            loop = None
        if loop is None or size <= self.inline_bytes:
            return self._finish(n, self._read())
        self._loading = loading = loop.run_in_executor(None, self._read)
        loading.add_done_callback(lambda done: self._land(n, done))
        return None

    def _land(self, n: int, done: asyncio.Future[_Outcome[T]]) -> None:
        """On the loop, once the worker thread read the file: swap it in."""
        self._loading = None
        if done.cancelled():  # the loop is closing
            self._stamp = None
            return
        error = done.exception()
        if error is not None:  # a bug in _parse: say so, keep serving what was loaded
            self._log.error(
                "%s not reloaded, keeping %s: reading it failed unexpectedly",
                self.what,
                self._kept(),
                exc_info=error,
            )
        else:
            self._finish(n, done.result())
        if self._again:
            self._again = False
            self.reload()

    def _read(self) -> _Outcome[T]:
        """Read and parse the file (in a worker thread for a large one): what it holds,
        or why not. The size is checked again on the open file, in case it grew."""
        assert self.path is not None
        try:
            with self.path.open("rb") as file:
                stat = os.fstat(file.fileno())
                if stat.st_size > self.max_bytes:
                    return _Outcome(_stamp(stat), problem=self._too_large(stat.st_size))
                data = file.read(self.max_bytes + 1)
        except OSError as exc:
            return _Outcome(None, problem=self._os_problem(exc))
        stamp = _stamp(stat)
        if len(data) > self.max_bytes:
            return _Outcome(stamp, problem=self._too_large(len(data)))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _Outcome(
                stamp,
                problem=f"{self.path} is not UTF-8 text (byte {exc.start} is not): save it as UTF-8",
            )
        try:
            return _Outcome(stamp, self._parse(text))
        except ValueError as exc:
            return _Outcome(stamp, problem=str(exc))
        except RecursionError:
            return _Outcome(stamp, problem=f"{self.path}: its values nest too deeply")

    def _finish(self, n: int, outcome: _Outcome[T], *, quiet: bool = False) -> bool:
        """On the loop: serve what a load read, or log once why it did not load."""
        if n < self._landed:  # a later load (a SIGHUP's) was applied already
            return False
        self._landed = n
        if outcome.stamp is not None:
            self._stamp = outcome.stamp  # not read again until it changes
        if outcome.value is None:
            self._log.error(
                "%s not reloaded, keeping %s: %s (it is read again when it changes)",
                self.what,
                self._kept(),
                outcome.problem,
            )
            return False
        if self._apply(outcome.value):
            self.version += 1
        self._checked = time.monotonic()
        if not quiet:
            self._log.info("%s %s loaded: %s", self.what, self.path, self._loaded())
        return True

    def _too_large(self, size: int) -> str:
        flag = "--" + self.setting.replace("_", "-")
        return (
            f"{self.path} is {size} bytes, over the {_size(self.max_bytes)} limit of the "
            f"{self.what} ({flag}): {self.too_large_hint}"
        )

    def _os_problem(self, exc: OSError) -> str:
        if isinstance(exc, FileNotFoundError):
            return f"{self.path} does not exist: {self._missing()}"
        if isinstance(exc, PermissionError):
            return f"{self.path} cannot be read by this process: give it read access"
        return f"{self.path} cannot be read: {exc}"
