"""The rules a session runs under: ``--guardrails FILE`` and a key's, compiled.

``GuardrailsFile`` reads a node's ``[[rule]]`` tables (re-read when the file
changes, as the key policy is); a key policy adds its ``guardrails = [...]``;
``guardrails_of`` compiles them together into the ``Guardrails`` pair (input
rules, output rules) a session's setup carries, cached so sessions share it.
``gateway.sessions.guard`` applies them to a session's events.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from gateway.common.reloaded_file import ReloadedFile, toml_tables
from protocol.guardrails import EMPTY, RuleSet, RuleSpec, compile_rules

__all__ = [
    "MAX_FILE_BYTES",
    "NO_GUARDRAILS",
    "Guardrails",
    "GuardrailsFile",
    "checker_headers",
    "guardrails_of",
    "parse_rules",
    "unset_variables",
]

log = logging.getLogger("gateway.sessions.guard")

MAX_FILE_BYTES: Final = 256 * 1024
"""A guardrails file larger than this is refused before it is parsed."""


@dataclass(frozen=True, slots=True)
class Guardrails:
    """A session's compiled rules: those on its input, those on the model's output."""

    specs: tuple[RuleSpec, ...] = ()
    input: RuleSet = EMPTY
    output: RuleSet = EMPTY

    def __bool__(self) -> bool:
        return bool(self.specs)


NO_GUARDRAILS: Final = Guardrails()


@functools.lru_cache(maxsize=256)
def _compiled(specs: tuple[RuleSpec, ...]) -> Guardrails | str:
    if not specs:
        return NO_GUARDRAILS
    compiled = compile_rules(specs)
    if isinstance(compiled, str):
        return compiled
    return Guardrails(specs, *compiled)


def guardrails_of(*groups: Sequence[RuleSpec]) -> Guardrails | str:
    """The node's rules and a key's, compiled (cached: sessions share them), or the problem."""
    return _compiled(tuple(spec for group in groups for spec in group))


_ENV_VAR: Final = re.compile(r"\$\{([^}]*)\}")


def unset_variables(specs: Sequence[RuleSpec]) -> str | None:
    """A ``${VAR}`` in a checker rule's headers that the environment lacks (an empty
    token would fail every check, far from its cause), naming the rule and the field."""
    for spec in specs:
        for header, value in spec.check_headers.items():
            for var in _ENV_VAR.findall(value):
                if var not in os.environ:
                    return (
                        f"guardrail {spec.name!r}: check_headers.{header}: the environment "
                        f"variable {var} is not set; set it before starting the gateway"
                    )
    return None


def checker_headers(spec: RuleSpec) -> dict[str, str]:
    """A checker rule's headers, ``${VAR}`` taken from the environment (checked at start)."""
    return {
        k: _ENV_VAR.sub(lambda m: os.environ.get(m[1], ""), v)
        for k, v in spec.check_headers.items()
    }


def parse_rules(tables: object, where: str) -> tuple[RuleSpec, ...]:
    """``[[rule]]`` tables (or a key policy's ``guardrails``) → specs; ValueError names
    the rule and the field."""
    if not isinstance(tables, list):
        raise ValueError(f"{where}: rules must be a list of tables ([[rule]] in TOML)")
    specs: list[RuleSpec] = []
    for i, table in enumerate(tables):
        name = table.get("name", f"#{i + 1}") if isinstance(table, dict) else f"#{i + 1}"
        try:
            specs.append(msgspec.convert(table, RuleSpec))
        except msgspec.ValidationError as exc:
            raise ValueError(
                f"{where}: guardrail {name!r}: {exc}; a rule has name, on (input or "
                "output), action (block, redact or end_turn) and one of pattern, detect "
                "(email, phone, card), max_chars or check_url (an HTTP checker)"
            ) from None
    problem = compile_rules(specs)
    if isinstance(problem, str):
        raise ValueError(f"{where}: {problem}")
    unset = unset_variables(specs)
    if unset is not None:
        raise ValueError(f"{where}: {unset}")
    return tuple(specs)


class GuardrailsFile(ReloadedFile[tuple[RuleSpec, ...]]):
    """The rules of ``--guardrails FILE`` (``[[rule]]`` tables), re-read when it changes.

    Raises ``ConfigError`` naming the rule and field when the file is bad at
    start; a file broken later keeps the rules loaded before (logged once).
    """

    what = "guardrails file"
    setting = "guardrails"
    max_bytes = MAX_FILE_BYTES
    inline_bytes = 2 * 1024  # a few rules: their patterns compile in about a millisecond
    too_large_hint = (
        "a node's rules are a few dozen [[rule]] tables: remove rules, or shorten patterns"
    )
    _log = log

    def __init__(self, path: str | Path | None, *, check_interval: float = 0.25) -> None:
        self.specs: tuple[RuleSpec, ...] = ()
        super().__init__(path, check_interval=check_interval)

    def _parse(self, text: str) -> tuple[RuleSpec, ...]:
        assert self.path is not None
        tables = toml_tables(text, self.path)
        extra = [k for k in tables if k != "rule"]
        if extra:
            raise ValueError(f"{self.path}: {extra[0]!r}: write each rule as a [[rule]] table")
        return parse_rules(tables.get("rule", []), str(self.path))

    def _apply(self, value: tuple[RuleSpec, ...]) -> bool:
        changed = value != self.specs
        self.specs = value
        return changed

    def _loaded(self) -> str:
        return f"{len(self.specs)} rules"
