"""What session a call gets, and whose it is: the numbers file (``--phone-numbers-file``).

    [defaults]                      # every call
    key = "my-app"                  # the API key id that owns the calls' sessions
    instructions = "You answer the phone for Example Inc."
    voice = "alloy"

    [numbers."+15550001111"]        # calls to this number (the stream's "to" parameter)
    instructions = "You take orders."
    greeting = "(The caller is on the line: greet them.)"

    [profiles.support]              # streams whose "profile" parameter is "support"
    server_tools = ["end_call", "transfer_call"]
    require_approval = ["transfer_call"]
    keypad_approval = true          # the caller approves with 1, denies with 2
    dtmf = "message"

A table takes the fields of a session's configuration (``POST
/v1/sessions``: instructions, server_tools, require_approval, provider,
model, voice, metadata, truncation, reasoning_effort, dtmf, tools) plus
``key`` (the owner), ``greeting`` (a message to the model as the call
starts, so it speaks first) and ``keypad_approval`` (``gateway.phone.keypad``). Later tables win field by field: defaults, then the
number's, then the profile's. The owner's key policy applies to the result
as to any configuration (``Node.setup``): a field it forbids refuses the
call. The file is read at start (its mistakes stop the node) and again
when it changes (a bad edit is logged and the last good one kept).
"""

from __future__ import annotations

import logging
import os
import tomllib
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec

from gateway.common.settings import ConfigError
from protocol.configuration import ConfigChange

__all__ = ["CallPlan", "CallPlans", "PlanTable"]

log = logging.getLogger("gateway.phone")

MAX_GREETING: Final = 4096


class PlanTable(ConfigChange, frozen=True, forbid_unknown_fields=True):
    """One table of the numbers file: a configuration change, its owner, its greeting."""

    key: str | msgspec.UnsetType = msgspec.UNSET
    greeting: Annotated[str, msgspec.Meta(max_length=MAX_GREETING)] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    keypad_approval: bool | msgspec.UnsetType = msgspec.UNSET


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    defaults: PlanTable = PlanTable()
    numbers: dict[str, PlanTable] = msgspec.field(default_factory=dict)
    profiles: dict[str, PlanTable] = msgspec.field(default_factory=dict)


_CALL_SETS: Final = ("input_audio", "output")  # the call's own: μ-law in, speech out


@dataclass(frozen=True)
class CallPlan:
    """A call's session: its owner's key id, its configuration, its first message."""

    owner: str
    change: ConfigChange
    greeting: str = ""
    keypad_approval: bool = False  # the caller's 1 or 2 decides a call waiting for approval


def _merge(tables: list[PlanTable]) -> PlanTable:
    fields: dict[str, Any] = {}
    for table in tables:
        for name in PlanTable.__struct_fields__:
            value = getattr(table, name)
            if value is not msgspec.UNSET:
                fields[name] = value
    return PlanTable(**fields)


class CallPlans:
    """The numbers file of a node (or none: every call gets the defaults of ``key``)."""

    def __init__(self, path: str, default_key: str) -> None:
        self.path = path
        self.default_key = default_key
        self._stamp: tuple[int, int] | None = None
        self._file = _File()
        if path:
            self._file = self._read()

    def _read(self) -> _File:
        try:
            stat = os.stat(self.path)
            with open(self.path, "rb") as handle:
                raw = tomllib.load(handle)
            parsed = msgspec.convert(raw, _File)
        except OSError as exc:
            raise ConfigError(f"phone numbers file {self.path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"phone numbers file {self.path}: not TOML: {exc}") from None
        except msgspec.ValidationError as exc:
            raise ConfigError(
                f"phone numbers file {self.path}: {exc} (tables: [defaults], "
                '[numbers."+1555…"], [profiles.NAME]; fields: a session\'s configuration, '
                "key, greeting, keypad_approval)"
            ) from None
        for where, table in [
            ("defaults", parsed.defaults),
            *((f'numbers."{n}"', t) for n, t in parsed.numbers.items()),
            *((f"profiles.{n}", t) for n, t in parsed.profiles.items()),
        ]:
            for name in _CALL_SETS:
                if getattr(table, name) is not msgspec.UNSET:
                    raise ConfigError(
                        f"phone numbers file {self.path}: [{where}] sets {name}, which a call "
                        "sets itself (μ-law in, speech out): remove it"
                    )
        self._stamp = (stat.st_mtime_ns, stat.st_size)
        return parsed

    def _fresh(self) -> _File:
        """The file as it is now: read again when it changed (a bad edit keeps the last)."""
        if not self.path:
            return self._file
        try:
            stat = os.stat(self.path)
        except OSError:
            return self._file
        if (stat.st_mtime_ns, stat.st_size) != self._stamp:
            try:
                self._file = self._read()
                log.info("phone numbers file %s reloaded", self.path)
            except ConfigError as exc:
                self._stamp = (stat.st_mtime_ns, stat.st_size)
                log.warning("%s; the last good version is kept", exc)
        return self._file

    def plan(self, called: str, profile: str) -> CallPlan:
        """The plan of a call to ``called`` (a number, "" if unknown) with ``profile``."""
        file = self._fresh()
        tables = [file.defaults]
        if called in file.numbers:
            tables.append(file.numbers[called])
        if profile in file.profiles:
            tables.append(file.profiles[profile])
        merged = _merge(tables)
        owner = merged.key if isinstance(merged.key, str) and merged.key else self.default_key
        greeting = merged.greeting if isinstance(merged.greeting, str) else ""
        change = ConfigChange(
            **{
                name: getattr(merged, name)
                for name in ConfigChange.__struct_fields__
                if getattr(merged, name) is not msgspec.UNSET
            }
        )
        keypad = merged.keypad_approval is True
        return CallPlan(owner=owner, change=change, greeting=greeting, keypad_approval=keypad)
