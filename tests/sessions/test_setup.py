"""``SessionSetups``: what a session's configuration, its key's policy and allow-list make of a node."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest

from gateway.config import load_config
from gateway.sessions.policy import KeyPolicies
from gateway.sessions.setup import ConfigProblem, SessionSetup, SessionSetups
from protocol.configuration import ClientToolSpec, SessionConfig, encode_config
from tests.sessions.fakes import ScriptedFactory
from tools.allowlist import parse_allow_list
from tools.builtin import default_registry

POLICIES = """
[alice]
providers = ["other"]
server_tools = ["read", "list"]
instructions = "Answer in French."

[bob]
server_tools = []
"""


@pytest.fixture
def policies(tmp_path: Path) -> KeyPolicies:
    path = tmp_path / "policies.toml"
    path.write_text(POLICIES)
    return KeyPolicies(str(path))


def setups(policies: KeyPolicies, *, factories: bool = True) -> tuple[SessionSetups, list[str]]:
    """The node's own provider ``node``; ``other`` is served, ``broken`` has no key."""
    asked: list[str] = []

    def make(provider: str, model: str) -> ScriptedFactory:
        asked.append(f"{provider}/{model}")
        if provider == "broken":
            raise ValueError("'broken' has no API key configured on this gateway")
        return ScriptedFactory(provider=provider, model=model)

    config = load_config({"instructions": "Be kind."}, env={})
    made = SessionSetups(
        config,
        default_registry(),
        ScriptedFactory(provider="node", model="node-model"),
        policies,
        make if factories else None,
    )
    return made, asked


def ok(setup: SessionSetup | str) -> SessionSetup:
    assert not isinstance(setup, str), setup
    return setup


def test_a_session_that_sets_nothing_gets_the_nodes_own_setup(policies: KeyPolicies) -> None:
    made, asked = setups(policies)
    setup = ok(made.setup("carol", SessionConfig()))
    assert setup.system_prompt is made.system_prompt
    assert setup.upstream_factory is made.upstream_factory
    assert setup.server_tools is None and setup.instructions == "Be kind."
    assert asked == []


def test_instructions_add_up_in_order_and_the_prompt_lists_only_allowed_tools(
    policies: KeyPolicies,
) -> None:
    made, _ = setups(policies)
    config = SessionConfig(instructions="Use short words.", server_tools=("read", "list"))
    setup = ok(made.setup("alice", config, parse_allow_list("read,write,find")))
    # The session's tools, the policy's and the key's allow-list all allow read only.
    assert setup.server_tools == frozenset({"read"})
    assert setup.instructions == "Be kind.\n\nAnswer in French.\n\nUse short words."
    prompt = setup.system_prompt
    assert prompt.index("Be kind.") < prompt.index("Answer in French.")
    assert prompt.index("Answer in French.") < prompt.index("Use short words.")
    assert "\n- read:" in prompt
    assert all(f"\n- {name}:" not in prompt for name in ("list", "write", "find"))


def test_what_a_setup_cannot_be_is_said_naming_the_field(policies: KeyPolicies) -> None:
    made, _ = setups(policies)
    unknown = made.setup("carol", SessionConfig(server_tools=("teleport",)))
    assert isinstance(unknown, str) and unknown.startswith("server_tools: this gateway has no")
    assert "'teleport'" in unknown and "read" in unknown
    beyond = made.setup("alice", SessionConfig(server_tools=("write",)))
    assert isinstance(beyond, str) and "'write' is not allowed for this API key" in beyond
    provider = made.setup("alice", SessionConfig(provider="node"))
    assert isinstance(provider, str) and provider.startswith("provider: 'node' is not allowed")
    broken = made.setup("carol", SessionConfig(provider="broken"))
    assert broken == "provider: 'broken' has no API key configured on this gateway"


def test_a_bad_client_tool_is_the_clients_mistake(policies: KeyPolicies) -> None:
    made, _ = setups(policies)
    tool = ClientToolSpec(name="read", parameters={"type": "object"})  # a server tool's name
    problem = made.setup("carol", SessionConfig(tools=(tool,)))
    assert isinstance(problem, ConfigProblem) and "read" in problem


def test_client_tools_join_the_prompt_within_the_keys_allow_list(policies: KeyPolicies) -> None:
    made, _ = setups(policies)
    tools = (ClientToolSpec(name="get_time"), ClientToolSpec(name="open_door"))
    setup = ok(made.setup("carol", SessionConfig(tools=tools), parse_allow_list("get_*,read")))
    assert [s.name for s in setup.client_tools.specs()] == ["get_time"]
    assert "\n- get_time:" in setup.system_prompt and "open_door" not in setup.system_prompt
    assert setup.server_tools == frozenset({"read"})


def test_other_providers_are_made_once_and_only_where_the_node_serves_them(
    policies: KeyPolicies,
) -> None:
    made, asked = setups(policies)
    first = ok(made.setup("carol", SessionConfig(provider="other", model="m1")))
    again = ok(made.setup("carol", SessionConfig(provider="other", model="m1")))
    assert first.upstream_factory is again.upstream_factory and asked == ["other/m1"]
    assert first.upstream_factory.model == "m1"
    only_default, _ = setups(policies, factories=False)
    refused = only_default.setup("carol", SessionConfig(model="m2"))
    assert isinstance(refused, str) and "serves only its default upstream (node)" in refused


def test_a_new_sessions_meta_holds_its_owner_configuration_and_allow_list(
    policies: KeyPolicies,
) -> None:
    made, _ = setups(policies)
    setup = ok(made.setup("carol", SessionConfig(instructions="x"), parse_allow_list("read")))
    meta = made.session_meta("carol", setup)
    assert meta["owner"] == "carol" and meta["provider"] == "node"
    assert meta["config"] == encode_config(SessionConfig(instructions="x")).decode()
    assert meta["tools_allowed"] == "read"
    assert "tools_allowed" not in made.session_meta("carol", made.default)


def test_a_stored_session_is_set_up_from_its_meta_as_far_as_it_can_be_served(
    policies: KeyPolicies, caplog: pytest.LogCaptureFixture
) -> None:
    made, _ = setups(policies)
    stored = SessionConfig(instructions="Stay.", provider="broken", server_tools=("read", "list"))
    meta = {"owner": "bob", "config": encode_config(stored).decode(), "tools_allowed": "read"}
    with caplog.at_level(logging.WARNING, "gateway.sessions.node"):
        setup = made.stored_setup("sid-1", meta)
    # Its provider is gone: the gateway's, the rest kept; bob's policy now allows no
    # server tool (cut, not refused); the allow-list stored with it still holds.
    assert setup.upstream_factory is made.upstream_factory
    assert setup.config == msgspec.structs.replace(stored, provider="", server_tools=())
    assert setup.server_tools == frozenset() and setup.key_tools == parse_allow_list("read")
    assert "cannot be served here" in caplog.text


def test_a_stored_session_with_unreadable_parts_fails_closed(
    policies: KeyPolicies, caplog: pytest.LogCaptureFixture
) -> None:
    made, _ = setups(policies)
    with caplog.at_level(logging.WARNING, "gateway.sessions.node"):
        setup = made.stored_setup(
            "sid-2", {"owner": "carol", "config": "{not json", "tools_allowed": "!!"}
        )
    assert setup.config == SessionConfig()
    assert setup.server_tools == frozenset()  # a broken allow-list allows no tool
    assert "unreadable stored configuration" in caplog.text
    # A session not stored yet takes the allow-list its key had at the handshake.
    fresh = made.stored_setup("sid-3", {"owner": "carol"}, parse_allow_list("list"))
    assert fresh.server_tools == frozenset({"list"})


def test_route_of_says_what_a_session_runs_with_its_unset_fields_the_nodes(
    policies: KeyPolicies,
) -> None:
    """What the OpenAI door compares a resume's ``?model=`` with: a session that sets no
    provider or model runs the node's own (not ``""``), so naming it is no switch."""
    made, _ = setups(policies)
    assert made.route_of(SessionConfig()) == ("node", "node-model")
    assert made.route_of(SessionConfig(provider="other", model="m2")) == ("other", "m2")
    assert made.route_of(SessionConfig(provider="broken", model="m")) is None
