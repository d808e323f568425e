"""``gateway loadtest``'s flags follow ``LoadTestConfig``'s declarations.

Each test derives what it expects from ``gateway.common.settings.declared`` and checks
it against the real ``gateway`` command line (the behaviour of a run through
the command line is tested in ``test_loadtest.py``).
"""

from __future__ import annotations

import argparse
import math

import msgspec
import pytest

from gateway.cli import build_parser
from gateway.client.loadtest import LoadTestConfig
from gateway.client.loadtest_cli import NOT_FLAGS, config_from_args
from gateway.common.settings import ConfigError, Declared, declared

SETTINGS = declared(LoadTestConfig)
URL = "ws://127.0.0.1:1/v1/realtime"

# The command's flags as they were before they were derived from the
# declarations: a name here is a promise to scripts that call the command.
FLAGS = {
    "--sessions",
    "--turns",
    "--ramp",
    "--message",
    "--message-chars",
    "--think-time",
    "--hold",
    "--duration",
    "--turn-timeout",
    "--connect-timeout",
    "--audio",
    "--token",
    "--json",
    "--fail-if",
    "--compare",
    "--progress",
    "--quiet",
    "--phone",
    "--phone-barge-in",
    "--phone-webhook",
}


def _loadtest_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices["loadtest"]
            assert isinstance(sub, argparse.ArgumentParser)
            return sub
    raise AssertionError("no loadtest command")


def _other_value(d: Declared) -> str:
    """A valid value of ``d``, as text, that is not its default."""
    if d.base is str:
        return "something else"
    low = d.bounds.ge if d.bounds is not None and d.bounds.ge is not None else 0
    value = max(d.default, low) + (2 if d.base is int else 1.5)
    if d.bounds is not None and d.bounds.le is not None:
        value = min(value, d.bounds.le - 1)
    return str(value)


def test_the_command_keeps_its_flags() -> None:
    flags = {f for f in _loadtest_parser()._option_string_actions if f not in ("-h", "--help")}
    assert flags == FLAGS


def test_the_settings_left_out_are_settings() -> None:
    assert {d.name for d in SETTINGS} >= NOT_FLAGS


@pytest.mark.parametrize(
    "d",
    [d for d in SETTINGS if d.name not in NOT_FLAGS and not d.required and d.base is not bool],
    ids=lambda d: d.name,
)
def test_every_setting_but_those_left_out_is_a_flag(d: Declared) -> None:
    text = _other_value(d)
    args = build_parser().parse_args(["loadtest", URL, d.flag, text])
    config = config_from_args(args)
    assert getattr(config, d.name) == msgspec.convert(text, d.type, strict=False)
    assert getattr(config, d.name) != d.default


def test_the_switches_are_flags_without_a_value() -> None:
    switches = {d.flag for d in SETTINGS if d.base is bool and d.name not in NOT_FLAGS}
    assert switches == {"--phone", "--phone-barge-in"}
    phone = "ws://127.0.0.1:1/v1/phone/twilio"
    config = config_from_args(
        build_parser().parse_args(["loadtest", phone, "--phone", "--phone-barge-in"])
    )
    assert config.phone and config.phone_barge_in


def test_the_url_is_the_positional_argument() -> None:
    assert config_from_args(build_parser().parse_args(["loadtest", URL])).url == URL
    with pytest.raises(SystemExit):
        build_parser().parse_args(["loadtest"])


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--sessions", "0"), ("--turns", "-1"), ("--ramp", "nan"), ("--duration", "86401")],
)
def test_a_value_out_of_its_declared_range_is_a_usage_error(flag: str, value: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["loadtest", URL, flag, value])


def test_a_config_built_in_code_is_checked_as_the_flags_are() -> None:
    with pytest.raises(ConfigError, match="ramp nan is out of range"):
        LoadTestConfig(url=URL, ramp=math.nan)
    with pytest.raises(ConfigError, match="sample_cap"):
        LoadTestConfig(url=URL, sample_cap=0)


def test_the_key_comes_from_gateway_token_unless_given_as_a_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = build_parser()
    monkeypatch.setenv("GATEWAY_TOKEN", "from-the-environment")
    assert config_from_args(parser.parse_args(["loadtest", URL])).token == "from-the-environment"
    flagged = parser.parse_args(["loadtest", URL, "--token", "from-the-flag"])
    assert config_from_args(flagged).token == "from-the-flag"
    monkeypatch.delenv("GATEWAY_TOKEN")
    assert config_from_args(parser.parse_args(["loadtest", URL])).token is None
