"""HTTP checker rules through a real gateway: an aiohttp checker on loopback.

A typed message is POSTed to the checker before the model sees it: allowed,
it reaches the model; blocked, it never does (the simulator's ``/context``
counts what its connection holds) and the client gets a ``guardrail`` event
naming the rule, never the checker's reason. A checker that times out or
answers off the contract follows ``on_check_error`` and is counted.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.client import Client
from gateway.common.settings import ConfigError
from gateway.metrics import Metrics
from gateway.sessions.guard import EventGuard
from gateway.sessions.guardrail_check import MAX_TEXT, Checkers, screened
from gateway.sessions.guardrail_rules import guardrails_of, parse_rules
from gateway.sessions.policy import KeyPolicies
from protocol.events import Event, Guardrail, Respond, Result, ToolResultMessage, UserMessage
from protocol.guardrails import RuleSpec
from tests.api.conftest import Keys, NodesFactory
from tests.api.test_guardrails import _context_items
from tests.support.guardrail_checker import REASON, Checker, running_checker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def checker() -> AsyncIterator[Checker]:
    async with running_checker() as seen:
        yield seen


def _rules(url: str, on_error: str = "block", timeout: float = 2.0) -> str:
    return (
        '[[rule]]\nname = "app-check"\non = "input"\naction = "block"\n'
        f'check_url = "{url}"\ncheck_timeout = {timeout}\non_check_error = "{on_error}"\n'
        'check_headers = { Authorization = "Bearer ${CHECK_TOKEN}" }\n'
    )


async def test_allowed_reaches_the_model_and_blocked_never_does(
    nodes: NodesFactory,
    keys: Keys,
    tmp_path: Path,
    checker: Checker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHECK_TOKEN", "tok-123456789")
    rules = tmp_path / "guardrails.toml"
    rules.write_text(_rules(checker.url))
    async with nodes(1, guardrails=str(rules)) as (gw,):
        async with Client(gw.url, token=keys.keys["alice"]) as c:
            turn = [e async for e in c.send("hello there")]
            said = "".join(e.content for e in turn if isinstance(e, Respond))
            assert said == "Echo: hello there"
            before = await _context_items(c)

            blocked = [e async for e in c.send("the launch codes are 0000")]
            assert [(type(e), e.rule, e.action, e.on) for e in blocked] == [  # type: ignore[union-attr]
                (Guardrail, "app-check", "block", "input")
            ]
            assert REASON not in str(blocked)
            # The model never saw it: its connection grew by the last probe only.
            assert await _context_items(c) == before + 2
            sid = c.session_id
        asked = {a["text"]: a for a in checker.asked}
        assert asked["hello there"] == {
            "rule": "app-check",
            "on": "input",
            "kind": "user",
            "text": "hello there",
            "session_id": sid,
            "auth": "Bearer tok-123456789",
        }
        assert "the launch codes are 0000" in asked
        trips = gw.node.metrics.guardrails.trips
        assert trips.labels("app-check", "block", "input")._value.get() == 1


async def test_a_server_tools_result_the_checker_blocks_reaches_the_model_as_a_failure(
    nodes: NodesFactory,
    keys: Keys,
    tmp_path: Path,
    checker: Checker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHECK_TOKEN", "tok-123456789")
    rules = tmp_path / "guardrails.toml"
    rules.write_text(_rules(checker.url))
    tools = tmp_path / "tools.toml"
    tools.write_text(
        "[builtin]\nenable = []\n\n[http.codes]\n"
        f'url = "{checker.url.removesuffix("/check")}/tool"\n'
        'description = "Codes."\nparameters = { type = "object" }\n'
    )
    async with (
        nodes(1, guardrails=str(rules), tools_file=str(tools)) as (gw,),
        Client(gw.url, token=keys.keys["alice"]) as c,
    ):
        turn = [e async for e in c.send("/tool codes {}")]
    assert not any("0000" in text for text in _strings(turn))  # numbers (timestamps) aside
    [result] = [e for e in turn if isinstance(e, Result)]
    [outcome] = msgspec.json.decode(result.content)
    assert outcome["status"] == "failure"
    assert outcome["content"] == "the result was withheld by the guardrail 'app-check'"
    assert [(e.rule, e.on) for e in turn if isinstance(e, Guardrail)] == [("app-check", "input")]
    assert [a["kind"] for a in checker.asked] == ["user", "tool_result"]
    assert gw.node.metrics.guardrails.trips.labels("app-check", "block", "input")._value.get() == 1


@pytest.mark.parametrize("on_error", ["allow", "block"])
async def test_a_checker_that_times_out_or_talks_nonsense_follows_on_check_error(
    nodes: NodesFactory,
    keys: Keys,
    tmp_path: Path,
    checker: Checker,
    monkeypatch: pytest.MonkeyPatch,
    on_error: str,
) -> None:
    monkeypatch.setenv("CHECK_TOKEN", "tok-123456789")
    rules = tmp_path / "guardrails.toml"
    rules.write_text(_rules(checker.url, on_error, timeout=0.3))
    async with nodes(1, guardrails=str(rules)) as (gw,):
        async with Client(gw.url, token=keys.keys["alice"]) as c:
            for text in ("a slow one", "some garbage", "a huge answer"):
                turn = [e async for e in c.send(text)]
                said = "".join(e.content for e in turn if isinstance(e, Respond))
                trips = [(e.rule, e.on) for e in turn if isinstance(e, Guardrail)]
                if on_error == "allow":  # fail-open: it reaches the model
                    assert (said, trips) == (f"Echo: {text}", [])
                else:  # fail-closed: it never does
                    assert (said, trips) == ("", [("app-check", "input")])
        errors = gw.node.metrics.guardrails.check_errors
        for reason in ("timeout", "bad_answer", "too_large"):
            assert errors.labels("app-check", reason)._value.get() == 1


async def test_a_tool_result_the_checker_blocks_becomes_a_failure(checker: Checker) -> None:
    spec = RuleSpec(name="app-check", on="input", action="block", check_url=checker.url)
    compiled = guardrails_of([spec])
    assert not isinstance(compiled, str)
    guard = EventGuard(compiled, Metrics(), lambda: None)
    logged: list[Event] = []
    checkers = Checkers()
    async with asyncio.timeout(10):
        fine = ToolResultMessage(id="c1", status="success", content={"weather": "sunny"})
        assert await screened(fine, guard, checkers, "s1", logged.append) is fine
        bad = ToolResultMessage(id="c2", status="success", content={"x": "the launch codes"})
        judged = await screened(bad, guard, checkers, "s1", logged.append)
        message = UserMessage(content="launch codes?", id="m1")
        assert await screened(message, guard, checkers, "s1", logged.append) is None
        # Past MAX_TEXT: not sent (cut, the rest would go unjudged); fail-closed here.
        long = UserMessage(content="x" * (MAX_TEXT + 1))
        assert await screened(long, guard, checkers, "s1", logged.append) is None
    await checkers.aclose()
    assert guard.metrics.guardrails.check_errors.labels("app-check", "too_long")._value.get() == 1
    assert judged.status == "failure"
    assert judged.content == "the result was withheld by the guardrail 'app-check'"
    assert [(a["kind"], a["text"]) for a in checker.asked] == [
        ("tool_result", '{"weather":"sunny"}'),
        ("tool_result", '{"x":"the launch codes"}'),
        ("user", "launch codes?"),
    ]
    assert [(e.rule, e.reply_to) for e in logged if isinstance(e, Guardrail)] == [
        ("app-check", msgspec.UNSET),
        ("app-check", "m1"),
        ("app-check", msgspec.UNSET),
    ]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (
            'on = "output"\naction = "block"\ncheck_url = "http://x/c"',
            "check_url: .*judges inputs only",
        ),
        ('on = "input"\naction = "block"\ncheck_url = "ftp://x/c"', "check_url: must be"),
        ('on = "input"\naction = "redact"\ncheck_url = "http://x/c"', "action: .*cannot redact"),
        (
            'on = "input"\naction = "block"\ncheck_url = "http://x/c"\ncheck_timeout = 30',
            "check_timeout: 30 seconds",
        ),
        (
            'on = "input"\naction = "block"\ncheck_url = "http://x/c"\npattern = "x"',
            "give exactly one matcher .* \\(it has pattern, check_url\\)",
        ),
        (
            'on = "input"\naction = "block"\ncheck_url = "http://x/c"\n'
            'check_headers = { X-Key = "${NO_SUCH_VAR_SET}" }',
            "check_headers.X-Key: the environment variable NO_SUCH_VAR_SET",
        ),
        (
            'on = "input"\naction = "block"\npattern = "x"\non_check_error = "allow"',
            "check_timeout, on_check_error and check_headers go with check_url",
        ),
    ],
)
def test_a_bad_checker_rule_is_refused_naming_the_rule_and_field(fields: str, problem: str) -> None:
    tables = tomllib.loads(f'[[rule]]\nname = "chk"\n{fields}\n')["rule"]
    with pytest.raises(ValueError, match=rf"guardrail 'chk': {problem}"):
        parse_rules(tables, "rules.toml")


async def test_a_bad_checker_rule_stops_the_start(nodes: NodesFactory, tmp_path: Path) -> None:
    rules = tmp_path / "guardrails.toml"
    rules.write_text(
        '[[rule]]\nname = "out-check"\non = "output"\naction = "block"\n'
        'check_url = "http://127.0.0.1:9/check"\n'
    )
    with pytest.raises(Exception, match=r"guardrail 'out-check': check_url: .*inputs only"):
        async with nodes(1, guardrails=str(rules)):
            pass


def test_a_key_policys_checker_rule_is_checked_as_the_files(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[alice]\nguardrails = [{ name = "k-check", on = "input", action = "block", '
        'check_url = "http://127.0.0.1:9/c", check_headers = { X-Key = "plain" } }]\n'
    )
    [spec] = KeyPolicies(policy).get("alice").guardrails
    assert (spec.check_url, spec.check_headers) == ("http://127.0.0.1:9/c", {"X-Key": "plain"})
    policy.write_text(
        '[alice]\nguardrails = [{ name = "k-check", on = "input", action = "block", '
        'check_url = "http://127.0.0.1:9/c", check_timeout = 0 }]\n'
    )
    with pytest.raises(
        ConfigError, match=r"\[alice\]: guardrails: guardrail 'k-check': check_timeout"
    ):
        KeyPolicies(policy)


@pytest.mark.parametrize("on_error", ["allow", "block"])
async def test_a_checker_that_cannot_be_reached_follows_on_check_error(on_error: str) -> None:
    spec = RuleSpec(
        name="gone",
        on="input",
        action="block",
        check_url="http://127.0.0.1:9/c",  # nothing listens: the connection is refused
        on_check_error=on_error,  # type: ignore[arg-type]
    )
    compiled = guardrails_of([spec])
    assert not isinstance(compiled, str)
    guard = EventGuard(compiled, Metrics(), lambda: None)
    checkers = Checkers()
    message = UserMessage(content="hello")
    async with asyncio.timeout(10):
        judged = await screened(message, guard, checkers, "s1", lambda e: None)
    await checkers.aclose()
    assert judged is (None if on_error == "block" else message)
    assert guard.metrics.guardrails.check_errors.labels("gone", "unreachable")._value.get() == 1


def _strings(value: Any) -> list[str]:
    """Every string in ``value`` (events as builtins): what a client could read."""
    value = msgspec.to_builtins(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _strings(v)]
    if isinstance(value, list):
        return [t for v in value for t in _strings(v)]
    return []
