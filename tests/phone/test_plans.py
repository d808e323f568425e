"""The numbers file: which session a call gets, whose it is."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from gateway.common.settings import ConfigError
from gateway.phone.plans import CallPlans

FILE = """
[defaults]
key = "app"
instructions = "You answer the phone."
voice = "alloy"

[numbers."+15550001111"]
instructions = "You take orders."
greeting = "(greet the caller)"

[profiles.support]
dtmf = "message"
key = "support-team"
"""


def test_tables_apply_in_order_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "numbers.toml"
    path.write_text(FILE)
    plans = CallPlans(str(path), default_key="phone")
    other = plans.plan("+15559999999", "")
    assert other.owner == "app"
    assert other.change.instructions == "You answer the phone."
    assert other.greeting == ""
    orders = plans.plan("+15550001111", "")
    assert (orders.change.instructions, orders.change.voice) == ("You take orders.", "alloy")
    assert orders.greeting == "(greet the caller)"
    support = plans.plan("+15550001111", "support")
    assert support.owner == "support-team"
    assert support.change.dtmf == "message"
    assert support.change.instructions == "You take orders."


def test_no_file_means_the_default_key_and_no_change() -> None:
    plan = CallPlans("", default_key="phone").plan("+1555", "x")
    assert plan.owner == "phone"
    assert plan.change.instructions is msgspec.UNSET


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[defaults]\ncolour = 1\n", "colour"),
        ('[defaults]\noutput = "text"\n', "a call sets itself"),
        ("[numbers]\nx = 1\n", "numbers"),
        ("[defaults\n", "not TOML"),
    ],
)
def test_mistakes_are_configuration_errors_that_name_them(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "numbers.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        CallPlans(str(path), default_key="phone")


def test_a_changed_file_is_read_again_and_a_bad_edit_keeps_the_last(tmp_path: Path) -> None:
    path = tmp_path / "numbers.toml"
    path.write_text(FILE)
    plans = CallPlans(str(path), default_key="phone")
    path.write_text('[defaults]\nkey = "other"\n')
    os.utime(path, ns=(1, 1))  # a new stamp, whatever the clock's resolution
    assert plans.plan("", "").owner == "other"
    path.write_text("[defaults\n")
    os.utime(path, ns=(2, 2))
    assert plans.plan("", "").owner == "other"
