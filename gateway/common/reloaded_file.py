"""A configuration file re-read when it changes: the key policies and the guardrails.

One ``stat`` at most every ``check_interval`` seconds (on use, and by the node's
rights watch); a file that no longer reads, or is empty, keeps what was loaded, and
says why.
"""

from __future__ import annotations

import logging
import time
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["ReloadedFile", "toml_tables"]


def toml_tables(path: Path) -> dict[str, Any]:
    """``path``'s TOML, or a ``ValueError`` naming the file and what to do: the key
    policies' and the guardrails' one reading (each said it apart, and one said only
    "'utf-8' codec can't decode" for a byte that was not UTF-8)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {exc.start} is not): save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nested table or array
        raise ValueError(f"{path}: its tables or arrays nest too deeply") from None


class ReloadedFile:
    """``poll()`` re-reads ``path`` through ``_load`` when its mtime or size changed and
    returns ``version`` (which ``_load`` raises when what it loaded differs)."""

    what = "file"  # how the log names it: "key policy file", "guardrails file"
    path: Path | None
    check_interval: float
    version: int
    _checked: float
    _stamp: tuple[float, int] | None
    _log: logging.Logger

    def _load(self) -> None:
        raise NotImplementedError

    def _loaded(self) -> str:
        """What the log says after a load ("3 tables")."""
        raise NotImplementedError

    def poll(self) -> int:
        now = time.monotonic()
        if self.path is None or now - self._checked < self.check_interval:
            return self.version
        self._checked = now
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime, stat.st_size)
            if stamp != self._stamp and stat.st_size == 0 and self._stamp is not None:
                # An editor that truncates, then writes, shows an empty file in between:
                # loaded, every rule went away until the next write.
                self._stamp = stamp
                self._log.warning(
                    "%s %s is empty: keeping what it had loaded (to have no rules, write "
                    "a file holding only a comment)",
                    self.what,
                    self.path,
                )
            elif stamp != self._stamp:
                self._load()
                self._log.info("%s %s loaded: %s", self.what, self.path, self._loaded())
        except (OSError, ValueError) as exc:
            self._log.error("%s not reloaded, keeping what it had loaded: %s", self.what, exc)
        return self.version
