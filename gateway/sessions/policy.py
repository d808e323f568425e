"""What a tenant (an API key) may set in its sessions' configuration.

The operator writes one TOML table per key id (``--key-policy-file``)::

    [alice]
    providers = ["sim", "openai"]           # providers its sessions may pick
    models = ["gpt-realtime"]               # models they may pick
    server_tools = ["read", "list"]         # the most server tools a session gets
    instructions = "Answer in French."      # appended to by sessions, never replaced

    ["*"]                                    # keys without a table of their own
    server_tools = []

A key with no table (and no ``"*"``) may set anything the node serves. The
policy is keyed by key id, so it holds for keys from a file and from Redis
alike, and the keys file keeps its one format. The file is re-read when it
changes (checked at most once a second, on use); a broken file keeps the
policies loaded before (logged).

The checks are pure (``refusal``): they name the field and say what is
allowed, and the HTTP API answers them with 403, ``configure`` with a
``forbidden`` error.
"""

from __future__ import annotations

import logging
import time
import tomllib
from pathlib import Path
from typing import Final

import msgspec

from gateway.settings import ConfigError
from protocol.configuration import SessionConfig

__all__ = ["ANY_KEY", "KeyPolicies", "KeyPolicy", "refusal"]

log = logging.getLogger("gateway.sessions.policy")

ANY_KEY: Final = "*"
"""The table that holds for keys without one of their own."""


class KeyPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One key's limits; ``None`` = no limit (anything the node serves)."""

    providers: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None
    server_tools: tuple[str, ...] | None = None
    instructions: str = ""


OPEN: Final = KeyPolicy()


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(repr(v) for v in values) if values else "none"


def refusal(policy: KeyPolicy, config: SessionConfig) -> str | None:
    """Why ``policy`` does not allow ``config`` (naming the field), or None."""
    if config.provider and policy.providers is not None and config.provider not in policy.providers:
        return (
            f"provider: {config.provider!r} is not allowed for this API key; "
            f"allowed: {_listed(policy.providers)} (or leave it unset for the gateway's default)"
        )
    if config.model and policy.models is not None and config.model not in policy.models:
        return (
            f"model: {config.model!r} is not allowed for this API key; "
            f"allowed: {_listed(policy.models)} (or leave it unset for the gateway's default)"
        )
    if config.server_tools is not None and policy.server_tools is not None:
        extra = [t for t in config.server_tools if t not in policy.server_tools]
        if extra:
            return (
                f"server_tools: {extra[0]!r} is not allowed for this API key; "
                f"allowed: {_listed(policy.server_tools)}"
            )
    return None


class KeyPolicies:
    """The policies of a ``--key-policy-file``, re-read when the file changes.

    Raises ``ConfigError`` (naming the table and field) when the file is
    unreadable at start.
    """

    def __init__(self, path: str | Path | None, *, check_interval: float = 1.0) -> None:
        self.path = Path(path) if path else None
        self.check_interval = check_interval
        self._policies: dict[str, KeyPolicy] = {}
        self._stamp: tuple[float, int] | None = None
        self._checked = 0.0
        if self.path is not None:
            try:
                self._load()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"key_policy_file: {exc}") from exc

    def _load(self) -> None:
        assert self.path is not None
        stat = self.path.stat()
        try:
            tables = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{self.path} is not valid TOML: {exc}") from None
        policies: dict[str, KeyPolicy] = {}
        for key_id, table in tables.items():
            if not isinstance(table, dict):
                raise ValueError(
                    f"{self.path}: {key_id!r} must be a table ([{key_id}] followed by its fields)"
                )
            try:
                policies[key_id] = msgspec.convert(table, KeyPolicy)
            except msgspec.ValidationError as exc:
                raise ValueError(
                    f"{self.path} [{key_id}]: {exc}; fields are providers, models, "
                    "server_tools (lists of strings) and instructions (a string)"
                ) from None
        self._policies = policies
        self._stamp = (stat.st_mtime, stat.st_size)
        self._checked = time.monotonic()

    def _maybe_reload(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now - self._checked < self.check_interval:
            return
        self._checked = now
        try:
            stat = self.path.stat()
            if (stat.st_mtime, stat.st_size) != self._stamp:
                self._load()
                log.info("key policy file %s loaded: %d tables", self.path, len(self._policies))
        except (OSError, ValueError) as exc:
            log.error("key policy file not reloaded, keeping the loaded policies: %s", exc)

    def get(self, key_id: str) -> KeyPolicy:
        """The policy of ``key_id`` (its table, else ``"*"``, else no limits)."""
        self._maybe_reload()
        policies = self._policies
        return policies.get(key_id) or policies.get(ANY_KEY) or OPEN
