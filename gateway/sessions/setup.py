"""A session's setup: what its configuration makes of the node (the node's per-session setup).

``SessionSetups.setup`` turns a session's ``SessionConfig``, its owner's key
policy and its key's allow-list of tools into a ``SessionSetup``: the
system prompt, the server and client tools it may use, the instructions,
and the factory of its provider and model — on every node that drives it,
so a reconnect or a takeover gives the model the same prompt, tools and
provider. A stored session's setup is rebuilt from its meta
(``stored_setup``), cut to its owner's current policy. ``SessionServices``
is what every session on a node shares.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.pricing import PriceTable
from gateway.sessions.guardrail_check import Checkers
from gateway.sessions.guardrail_rules import (
    NO_GUARDRAILS,
    Guardrails,
    GuardrailsFile,
    guardrails_of,
)
from gateway.sessions.limits import Limits
from gateway.sessions.logwriter import LogWriter
from gateway.sessions.policy import KeyPolicies, refusal, within
from gateway.sessions.recorder import Recorders
from gateway.store.base import SessionMeta
from gateway.tracing import Tracing
from gateway.upstream.base import CONTROLS, UpstreamFactory
from protocol.configuration import SERVER_VAD_TUNING, SessionConfig, decode_config, encode_config
from protocol.prompt import system_prompt
from tools.allowlist import AllowList, parse_allow_list
from tools.base import ToolContext
from tools.client import ClientTools
from tools.executor import Executor
from tools.registry import Registry

__all__ = ["ConfigProblem", "SessionServices", "SessionSetup", "SessionSetups", "UpstreamFactories"]

log = logging.getLogger("gateway.sessions.node")

UpstreamFactories = Callable[[str, str], UpstreamFactory]
"""``(provider, model)`` → a factory for them; raises ``ValueError`` saying why not
(a provider with no API key configured, an unknown provider)."""


class ConfigProblem(str):
    """A refusal that is the configuring client's mistake (``bad_frame``, HTTP 400),
    not the key's policy (``forbidden``, 403): a bad tool schema, a taken name, a
    control its provider lacks."""

    __slots__ = ()


def controls_asked(config: SessionConfig) -> list[tuple[str, str]]:
    """The session controls (``CONTROLS``) ``config`` asks for: ``(control, what it set)``."""
    asked: list[tuple[str, str]] = []
    audio = config.input_audio
    if audio is not None:
        if audio.turn_detection == "semantic_vad":
            asked.append(("semantic_vad", 'input_audio.turn_detection "semantic_vad"'))
        elif audio.turn_detection == "none":
            asked.append(("manual_turns", 'input_audio.turn_detection "none"'))
        if audio.idle_timeout_ms is not None:
            asked.append(("idle_timeout_ms", "input_audio.idle_timeout_ms"))
        tuned = [name for name in SERVER_VAD_TUNING if getattr(audio, name) is not None]
        if tuned:
            asked.append(("vad_tuning", f"input_audio.{tuned[0]}"))
        if audio.noise_reduction not in (None, "off"):  # "off" is what the others do
            asked.append(("noise_reduction", "input_audio.noise_reduction"))
    if config.speed not in (None, 1.0):  # the normal pace is every provider's
        asked.append(("speed", "speed"))
    if config.truncation is not None:
        asked.append(("truncation", "truncation"))
    if config.reasoning_effort is not None:
        asked.append(("reasoning_effort", "reasoning_effort"))
    assert all(control in CONTROLS for control, _ in asked)
    return asked


def controls_refusal(config: SessionConfig, factory: UpstreamFactory) -> ConfigProblem | None:
    """Why ``factory``'s provider cannot carry out a control ``config`` asks for, or None."""
    for control, what in controls_asked(config):
        if control not in factory.controls:
            return ConfigProblem(
                f"{what}: provider {factory.provider} has no such control; leave it out, "
                'or pick a provider that has it (docs/providers.md, "Session controls")'
            )
    return None


@dataclass(frozen=True, slots=True)
class SessionSetup:
    """What one session's own configuration makes of the node's services.

    Built by the node (``Node.setup``) from the session's ``SessionConfig``,
    its owner's key policy and its key's allow-list of tools, on every node
    that drives it, so a reconnect or a takeover gives the model the same
    prompt, tools and provider.
    """

    config: SessionConfig
    system_prompt: str  # protocol + operator + key policy + session instructions, with tools
    upstream_factory: UpstreamFactory  # the session's provider and model
    server_tools: frozenset[str] | None = None  # the server tools it may run; None: all
    # The client tools it declared (those its key allows): the turn machine's router.
    client_tools: ClientTools = field(default_factory=lambda: ClientTools(()))
    # Its API key's allow-list of tools (``tools=`` in the keys file), stored with the
    # session so every node applies the same one; None: every tool.
    key_tools: AllowList | None = None
    # Operator + key policy + session instructions: all a model that does not write the
    # text protocol (it speaks; its tools are declared natively) is told.
    instructions: str = ""
    # The server tools whose calls wait for a user's approve: the operator's (tools file),
    # the key policy's and the session's own, of the tools it may run.
    approvals: frozenset[str] = frozenset()
    # The tools (server and client) whose calls do not block the turn.
    background: frozenset[str] = frozenset()
    # The flight recorder records it: its key policy's record, else its own or the node's.
    record: bool = False
    # Its guardrails: the node's (--guardrails), then its key policy's.
    guardrails: Guardrails = NO_GUARDRAILS


@dataclass(frozen=True, slots=True)
class SessionServices:
    """What every session on a node shares: settings, metrics and the node's workers."""

    config: Config
    metrics: Metrics
    log_writer: LogWriter
    limits: Limits
    executor: Executor
    upstream_factory: UpstreamFactory
    system_prompt: str
    tool_context: Callable[[str], ToolContext]
    store: SessionMeta
    prices: PriceTable
    tracing: Tracing
    # The setup of a configuration for an owner (key id) and its key's allow-list of
    # tools, or why it is refused.
    session_setup: Callable[[str, SessionConfig, AllowList | None], SessionSetup | str]
    store_retry_delay: float = 0.5
    recorders: Recorders | None = None  # the flight recorder's writer (None: nothing records)
    checkers: Checkers = field(default_factory=Checkers)  # guardrails' HTTP checkers


class SessionSetups:
    """The setups of this node's sessions (see the module docstring).

    ``factories`` makes upstream factories for sessions that pick another
    provider or model; without it they get only ``upstream_factory``'s.
    """

    def __init__(
        self,
        config: Config,
        registry: Registry,
        upstream_factory: UpstreamFactory,
        policies: KeyPolicies,
        factories: UpstreamFactories | None = None,
        guardrails: GuardrailsFile | None = None,
    ) -> None:
        self.config = config
        self.guardrails = guardrails or GuardrailsFile(None)
        self.registry = registry
        self.upstream_factory = upstream_factory
        self.policies = policies
        self._factories = factories
        # Per-session upstream factories, by (provider, model); "" = the node's.
        self._factory_cache: dict[tuple[str, str], UpstreamFactory] = {}
        self.system_prompt = system_prompt(registry.specs(), config.instructions)
        self.default = SessionSetup(
            SessionConfig(),
            self.system_prompt,
            upstream_factory,
            instructions=config.instructions,
            record=config.record,
        )

    def session_meta(self, owner: str, setup: SessionSetup) -> dict[str, str]:
        """The meta a new session is stored with: its owner, configuration and allow-list."""
        meta = {
            "owner": owner,
            "provider": setup.upstream_factory.provider,
            "created": f"{time.time():.3f}",
            "node": self.config.node_id,
            "config": encode_config(setup.config).decode(),
        }
        if setup.key_tools is not None:
            # Stored with the session: any node that drives it enforces the same list.
            meta["tools_allowed"] = str(setup.key_tools)
        return meta

    def setup(
        self, owner: str, config: SessionConfig, key_tools: AllowList | None = None
    ) -> SessionSetup | str:
        """What ``config`` makes of this node for a session of ``owner``, or why it cannot be.

        The system prompt is the protocol's, then the operator's instructions,
        the owner's key-policy instructions and the session's own (appended:
        a session cannot replace what the operator set), over the tools it
        may use: the server tools that the session's ``server_tools``, the key
        policy's and the key's allow-list (``key_tools``) all allow, then the
        client tools the allow-list allows. The upstream is the session's
        provider and model. Refused: a ``ConfigProblem`` (the client's mistake) or
        another string (the key's policy, or a provider this node cannot serve).
        """
        policy = self.policies.get(owner)
        refused = refusal(policy, config)
        if refused is not None:
            return refused
        names = set(self.registry.names())
        allowed: frozenset[str] | None = None
        limits = [t for t in (config.server_tools, policy.server_tools) if t is not None]
        if limits:
            unknown = [n for n in limits[0] if n not in names]
            if unknown:
                return (
                    f"server_tools: this gateway has no tool {unknown[0]!r}; "
                    f"its tools: {', '.join(sorted(names)) or 'none'}"
                )
            allowed = frozenset.intersection(*(frozenset(t) for t in limits))
        if key_tools is not None:
            allowed = frozenset(key_tools.filter(names if allowed is None else allowed))
        has = names if allowed is None else names & allowed
        try:
            client_tools = ClientTools(config.tools, key_tools, has)
        except ValueError as exc:  # the client's mistake (a bad schema, a taken name): 400
            return ConfigProblem(str(exc))
        unknown = [n for n in config.require_approval if n not in names]
        if unknown:
            return ConfigProblem(
                f"require_approval: this gateway has no server tool {unknown[0]!r}; "
                f"its tools: {', '.join(sorted(names)) or 'none'}"
            )
        wanted = {*self.registry.approval_required, *policy.require_approval}
        approvals = frozenset(n for n in (*wanted, *config.require_approval) if n in has)
        background = frozenset(
            [*(n for n in self.registry.background if n in has), *client_tools.background]
        )
        factory = self._factory(config.provider, config.model)
        if isinstance(factory, str):
            return factory
        problem = controls_refusal(config, factory)
        if problem is not None:
            return problem
        parts = [self.config.instructions, policy.instructions, config.instructions]
        instructions = "\n\n".join(p.strip() for p in parts if p.strip())
        if (
            allowed is None
            and not config.tools
            and not config.instructions
            and not (policy.instructions)
        ):
            prompt = self.system_prompt
        else:
            specs = [s for s in self.registry.specs() if allowed is None or s.name in allowed]
            specs += client_tools.specs()
            prompt = system_prompt(specs, instructions)
        record = policy.record if policy.record is not None else config.record or self.config.record
        self.guardrails.poll()
        guardrails = guardrails_of(self.guardrails.specs, policy.guardrails)
        if isinstance(guardrails, str):  # each part was checked when loaded; together: too many
            return guardrails
        return SessionSetup(
            config,
            prompt,
            factory,
            allowed,
            client_tools,
            key_tools,
            instructions,
            approvals,
            background,
            record,
            guardrails,
        )

    def route_of(self, config: SessionConfig) -> tuple[str, str] | None:
        """The provider and model a session of ``config`` runs first (its unset ones are
        the node's: the primary provider of a chain, its model); None: none here."""
        factory = self._factory(config.provider, config.model)
        return None if isinstance(factory, str) else (factory.provider, factory.model)

    def _factory(self, provider: str, model: str) -> UpstreamFactory | str:
        default = self.upstream_factory
        if (not provider or provider == default.provider) and not model:
            return default
        key = (provider or default.provider, model)
        cached = self._factory_cache.get(key)
        if cached is not None:
            return cached
        if self._factories is None:
            return (
                f"provider: this gateway serves only its default upstream ({default.provider}); "
                "leave provider and model unset"
            )
        try:
            factory = self._factories(*key)
        except ValueError as exc:
            return f"provider: {exc}"
        self._factory_cache[key] = factory
        return factory

    def stored_setup(
        self, sid: str, meta: dict[str, str], key_tools: AllowList | None = None
    ) -> SessionSetup:
        """The setup of a stored session; its configuration as far as this node can serve it.

        ``key_tools``: the allow-list of a session not stored yet (a stored one has its own).
        """
        owner = meta.get("owner", "")
        if "tools_allowed" in meta:
            try:
                key_tools = parse_allow_list(meta["tools_allowed"])
            except ValueError as exc:  # the key's list was checked when it was read
                log.warning("session %s: %s; no tool is allowed", sid, exc, extra={"sid": sid})
                key_tools = AllowList(())
        try:
            config = decode_config(meta.get("config", ""))
        except (ValueError, TypeError) as exc:  # msgspec's errors are ValueErrors
            log.error("session %s: unreadable stored configuration: %s", sid, exc)
            config = SessionConfig()
        # Stored before its owner's policy was tightened: cut to it, not refused.
        config = within(self.policies.get(owner), config)
        setup = self.setup(owner, config, key_tools)
        if isinstance(setup, str):
            log.warning(
                "session %s: its configuration cannot be served here (%s); using the "
                "gateway's provider",
                sid,
                setup,
                extra={"sid": sid},
            )
            fallback = self.setup(
                owner, msgspec.structs.replace(config, provider="", model=""), key_tools
            )
            if isinstance(fallback, str):
                # Fails closed: a session with an allow-list keeps it even on the defaults.
                fallback = self.setup(owner, SessionConfig(), key_tools)
            return fallback if not isinstance(fallback, str) else self.default
        return setup
