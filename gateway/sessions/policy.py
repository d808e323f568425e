"""What a tenant (an API key) may set in its sessions' configuration.

The operator writes one TOML table per key id (``--key-policy-file``)::

    [alice]
    providers = ["sim", "openai"]           # providers its sessions may pick
    models = ["gpt-realtime"]               # models they may pick
    server_tools = ["read", "list"]         # the most server tools a session gets
    reasoning_efforts = ["minimal", "low"]  # reasoning efforts its sessions may ask for
    instructions = "Answer in French."      # appended to by sessions, never replaced
    record = true                           # record every session (false: none, whatever
                                            # the session or the node asks)
    aliases = { fast = "gemini-3.8-live" }  # model names of its own (the OpenAI door's
                                            # ?model=, client_secrets' session.model)

    ["*"]                                    # keys without a table of their own
    server_tools = []

A key with no table (and no ``"*"``) may set anything the node serves. The
policy is keyed by key id, so it holds for keys from a file and from Redis
alike, and the keys file keeps its one format. The file is re-read when it
changes (looked at every half second by the node's rights watch, and on use);
a broken file keeps the policies loaded before (logged once), and a file over
``MAX_POLICY_FILE_BYTES`` is refused unread (``gateway.common.reloaded_file``).

A change applies to live sessions too, from their next model step: the node
sets each session it drives up again under the new policy (``within`` cuts
the session's own configuration to it) and logs ``configured`` where that
changed anything (``Node.policies_changed``).

The checks are pure (``refusal``, ``within``): they name the field and say
what is allowed, and the HTTP API answers them with 403, ``configure`` with a
``forbidden`` error.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path
from typing import Final

import msgspec

from gateway.common.reloaded_file import MiB, ReloadedFile, toml_tables
from gateway.sessions.guardrail_rules import unset_variables
from protocol.configuration import SessionConfig
from protocol.guardrails import RuleSpec, compile_rules

__all__ = ["ANY_KEY", "MAX_POLICY_FILE_BYTES", "KeyPolicies", "KeyPolicy", "refusal", "within"]

log = logging.getLogger("gateway.sessions.policy")

ANY_KEY: Final = "*"
"""The table that holds for keys without one of their own."""


class KeyPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One key's limits; ``None`` = no limit (anything the node serves)."""

    providers: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None
    server_tools: tuple[str, ...] | None = None
    reasoning_efforts: tuple[str, ...] | None = None
    instructions: str = ""
    record: bool | None = None  # the flight recorder: always, never, or as asked (None)
    require_approval: tuple[str, ...] = ()
    """Server tools whose calls wait for a user's approve in this key's sessions."""
    guardrails: tuple[RuleSpec, ...] = ()
    """Guardrail rules for this key's sessions, after the node's (docs/guardrails.md)."""
    aliases: dict[str, str] = msgspec.field(default_factory=dict)
    """Model names of this key's own: ``"fast" = "gemini-3.8-live"`` (the OpenAI door)."""


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
    if config.record and policy.record is False:
        return (
            "record: this API key's sessions are not recorded (its key policy says "
            "record = false); leave record unset"
        )
    effort, efforts = config.reasoning_effort, policy.reasoning_efforts
    if effort is not None and efforts is not None and effort not in efforts:
        return (
            f"reasoning_effort: {effort!r} is not allowed for this API key; "
            f"allowed: {_listed(efforts)} (or leave it unset for the model's default)"
        )
    return None


def within(policy: KeyPolicy, config: SessionConfig) -> SessionConfig:
    """``config`` cut to what ``policy`` allows (``config`` itself when it is within).

    For a session whose owner's policy was tightened after it was configured:
    server tools the policy no longer allows are withdrawn, and a provider or
    model it no longer allows gives way to the gateway's default (the
    provider's model goes with it). ``refusal`` of the result is None.
    """
    changes: dict[str, object] = {}
    if config.provider and policy.providers is not None and config.provider not in policy.providers:
        changes["provider"] = ""
        changes["model"] = ""
    elif config.model and policy.models is not None and config.model not in policy.models:
        changes["model"] = ""
    if config.server_tools is not None and policy.server_tools is not None:
        kept = tuple(t for t in config.server_tools if t in policy.server_tools)
        if kept != config.server_tools:
            changes["server_tools"] = kept
    effort, efforts = config.reasoning_effort, policy.reasoning_efforts
    if effort is not None and efforts is not None and effort not in efforts:
        changes["reasoning_effort"] = None
    if config.record and policy.record is False:
        changes["record"] = False
    return msgspec.structs.replace(config, **changes) if changes else config


MAX_POLICY_FILE_BYTES: Final = 2 * MiB
"""A key policy file larger than this is refused before it is read: ~20,000 tables of a
few fields, parsed in ~1.5 s (in a worker thread) into ~70 MB, where real ones hold a
table per tenant and are kilobytes."""


class KeyPolicies(ReloadedFile[dict[str, KeyPolicy]]):
    """The policies of a ``--key-policy-file``, re-read when the file changes.

    Raises ``ConfigError`` (naming the table and field) when the file is
    unreadable at start, or names a provider not in ``known_providers`` (when
    given): a typo would otherwise lock the key out of the provider it meant.
    """

    what = "key policy file"
    setting = "key_policy_file"
    max_bytes = MAX_POLICY_FILE_BYTES
    inline_bytes = 2 * 1024  # ~1 ms of parsing: ~20 tables
    too_large_hint = (
        "remove the tables of keys that no longer exist, and let keys that need nothing "
        'of their own share the "*" table'
    )
    _log = log

    def __init__(
        self,
        path: str | Path | None,
        *,
        check_interval: float = 0.25,
        known_providers: Collection[str] = (),
    ) -> None:
        self.known_providers = tuple(known_providers)
        self._policies: dict[str, KeyPolicy] = {}
        super().__init__(path, check_interval=check_interval)

    def _parse(self, text: str) -> dict[str, KeyPolicy]:
        assert self.path is not None
        policies: dict[str, KeyPolicy] = {}
        for key_id, table in toml_tables(text, self.path).items():
            if not isinstance(table, dict):
                raise ValueError(
                    f"{self.path}: {key_id!r} must be a table ([{key_id}] followed by its fields)"
                )
            try:
                policies[key_id] = policy = msgspec.convert(table, KeyPolicy)
            except msgspec.ValidationError as exc:
                raise ValueError(
                    f"{self.path} [{key_id}]: {exc}; fields are providers, models, "
                    "server_tools, reasoning_efforts (lists of strings), instructions (a "
                    "string), record (true or false) and aliases (a table of model names)"
                ) from None
            compiled = compile_rules(policy.guardrails)
            problem = compiled if isinstance(compiled, str) else unset_variables(policy.guardrails)
            if problem is not None:
                raise ValueError(f"{self.path} [{key_id}]: guardrails: {problem}")
            known = self.known_providers
            unknown = [p for p in policy.providers or () if known and p not in known]
            if unknown:
                raise ValueError(
                    f"{self.path} [{key_id}]: providers: {unknown[0]!r} is not a provider "
                    f"this gateway knows; use one of {', '.join(known)}"
                )
        return policies

    def _apply(self, value: dict[str, KeyPolicy]) -> bool:
        changed = value != self._policies
        self._policies = value
        return changed

    def _loaded(self) -> str:
        return f"{len(self._policies)} tables"

    def get(self, key_id: str) -> KeyPolicy:
        """The policy of ``key_id`` (its table, else ``"*"``, else no limits)."""
        self.poll()
        policies = self._policies
        return policies.get(key_id) or policies.get(ANY_KEY) or OPEN
