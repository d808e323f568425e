"""Settings are declared once: flags, variables and the docs' table all follow the declaration.

Each test derives what it expects from ``gateway.common.settings.declared`` and checks
it against what a user meets: the ``gateway`` command line, the environment,
docs/configuration.md, the other docs and the deploy files.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.cli import build_parser
from gateway.client.dial import TOKEN_ENV
from gateway.common.settings import (
    Declared,
    declared,
    flag_values,
    load,
    markdown_table,
    table_in,
)
from gateway.config import Config, ConfigError, load_config
from gateway.sim.model import SimConfig
from gateway.upstream.gemini import DEFAULT_MODEL as GEMINI_DEFAULT_MODEL
from gateway.upstream.openai import DEFAULT_MODEL as OPENAI_DEFAULT_MODEL

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = declared(Config)
SIM_SETTINGS = declared(SimConfig)


def _value_at(config: msgspec.Struct, d: Declared) -> Any:
    value: Any = config
    for part in d.path:
        value = getattr(value, part)
    return value


def _other_value(d: Declared) -> str:
    """A valid value of ``d``, as text, that is not its default."""
    if d.choices:
        return next(c for c in d.choices if c != d.default)
    if d.base is bool:
        return "false" if d.default else "true"
    if d.base is str:
        return d.setting.example or "/some/value"
    low = d.bounds.ge if d.bounds is not None and d.bounds.ge is not None else 0
    start = d.default if isinstance(d.default, int | float) else low
    value = max(start, low) + (2 if d.base is int else 1.5)
    if d.bounds is not None and d.bounds.le is not None:
        value = min(value, d.bounds.le - 1)
    return str(value)


def test_the_configuration_doc_table_is_the_declaration() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert table_in(doc) == markdown_table(Config), (
        "docs/configuration.md's settings table differs from gateway/config.py: run "
        "`gateway settings --markdown --write docs/configuration.md`"
    )


def test_computed_defaults_are_told_as_the_code_computes_them() -> None:
    model = next(d for d in SETTINGS if d.name == "model")
    assert OPENAI_DEFAULT_MODEL in model.setting.shown_default
    assert GEMINI_DEFAULT_MODEL in model.setting.shown_default


@pytest.mark.parametrize("d", [d for d in SETTINGS if d.flag], ids=lambda d: d.name)
def test_every_setting_but_secrets_is_a_serve_flag(d: Declared) -> None:
    text = _other_value(d)
    argv = ["serve", d.flag] if d.base is bool else ["serve", d.flag, text]
    config = load_config(flag_values(build_parser().parse_args(argv), Config), env={})
    assert _value_at(config, d) == msgspec.convert(text, d.type, strict=False)


@pytest.mark.parametrize("d", SETTINGS, ids=lambda d: d.name)
def test_every_setting_is_a_variable(d: Declared) -> None:
    text = _other_value(d)
    for var in d.env:
        config = load_config(env={var: text})
        assert _value_at(config, d) == msgspec.convert(text, d.type, strict=False), var


def test_gateway_variables_win_over_conventional_ones_and_flags_over_both() -> None:
    env = {"REDIS_URL": "redis://a", "GATEWAY_REDIS_URL": "redis://b"}
    assert load_config(env=env).redis_url == "redis://b"
    args = build_parser().parse_args(["serve", "--redis", "redis://c"])
    assert load_config(flag_values(args, Config), env=env).redis_url == "redis://c"


def test_secrets_are_variables_only() -> None:
    secrets = [d for d in SETTINGS if d.setting.secret]
    assert {d.name for d in secrets} >= {"openai_api_key", "gemini_api_key"}
    for d in secrets:
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--" + d.name.replace("_", "-"), "k"])


@pytest.mark.parametrize("d", SIM_SETTINGS, ids=lambda d: d.name)
def test_every_simulator_knob_is_a_sim_flag_and_a_serve_flag(d: Declared) -> None:
    text = _other_value(d)
    expected = msgspec.convert(text, d.type, strict=False)
    value = [] if d.base is bool else [text]
    sim_args = build_parser().parse_args(["sim", d.flag, *value])
    assert getattr(load(SimConfig, flag_values(sim_args, SimConfig)), d.name) == expected
    serve_args = build_parser().parse_args(["serve", "--sim-" + d.flag[2:], *value])
    config = load_config(flag_values(serve_args, Config), env={})
    assert getattr(config.sim, d.name) == expected


def test_a_bad_variable_names_it_and_says_what_to_write() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"GATEWAY_PORT": "abc"})
    assert str(info.value) == (
        "GATEWAY_PORT='abc' is not valid: use a whole number from 0 to 65535; "
        "set GATEWAY_PORT to that, or unset it to use the default (8765)"
    )
    with pytest.raises(ConfigError, match=r"GATEWAY_SIM_FLAVOR='claude'.*one of openai, gemini"):
        load_config(env={"GATEWAY_SIM_FLAVOR": "claude"})
    with pytest.raises(ConfigError, match=r"GATEWAY_LEASE_TTL='0.1'.*> 0.5"):
        load_config(env={"GATEWAY_LEASE_TTL": "0.1"})


def test_values_are_checked_however_a_config_is_built() -> None:
    with pytest.raises(ConfigError, match="max_connections"):
        load_config({"max_connections": -1}, env={})
    with pytest.raises(ConfigError, match="max_connections -1 is out of range"):
        Config(max_connections=-1)
    with pytest.raises(ConfigError, match="chunk_size"):
        SimConfig(chunk_size=0)
    with pytest.raises(ConfigError, match="unknown setting 'no_such_thing'"):
        load_config({"no_such_thing": 1}, env={})


def test_names_choices_are_matched_without_regard_to_case() -> None:
    assert load_config(env={"GATEWAY_LOG_LEVEL": "debug"}).log_level == "DEBUG"


def _all_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The flags of ``parser`` and of its subcommands, at any depth."""
    flags = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _all_flags(sub)
    return flags


def test_the_docs_name_only_flags_and_variables_that_exist() -> None:
    flags = _all_flags(build_parser())
    variables = {var for d in SETTINGS for var in d.env} | {"GATEWAY_<NAME>"}
    variables.add(TOKEN_ENV)  # not a node's setting: the key the client tools read
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    # These also quote other programs' flags: pip's, docker compose's, the benchmarks'.
    others = {"build.md", "deploy.md", "capacity.md", "performance.md"}
    for path in (p for p in docs if p.name not in others):
        # A flag in a code span of a gateway command, or standing alone (`--workers N`).
        for code in re.findall(r"`((?:gateway |--)[^`\n]+)`", path.read_text()):
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", code):
                assert flag in flags, f"{path.name} names {flag}, which no gateway command has"
    for path in [*docs, *(p for p in (ROOT / "deploy").rglob("*") if p.is_file())]:
        for var in re.findall(r"\bGATEWAY_[A-Z_]+\b", path.read_text()):
            assert var in variables, f"{path.name} names {var}, which is no setting"
