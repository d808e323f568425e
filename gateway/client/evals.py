"""Scenario files and their expectations: what ``gateway eval`` checks, without sockets.

A scenario file (TOML) names conversations, each a list of turns with what
the user says and what must hold of the turn (``Expect``): a tool called
(name, and arguments that match: equal values, or ``"re:PATTERN"`` for a
string), no tool called, text that contains or matches, latency to the end
under N ms, cost under $X, the turn ending with ``end`` (or ``cancelled``, or
``blocked`` by an input guardrail), a guardrail rule that tripped (or none).
``check`` judges one ``transcript.Turn`` against one ``Expect`` and says
each failure in a line a person can act on. The runner is
``gateway.client.eval_cli``.

A scenario file is untrusted input (in CI it comes from pull requests):
``read_scenarios`` refuses one over ``MAX_SCENARIO_BYTES`` before parsing
it, TOML nested deeper than ``MAX_DEPTH`` (``tomllib`` recurses per level),
more than ``MAX_SCENARIOS`` scenarios or ``MAX_TURNS`` turns in one; and
patterns run on RE2, in time linear in the answer's length (``re``
backtracks: ``(a+)+$`` against 30 ``a``s and a ``!`` runs for a minute),
so no pattern can hang an eval. RE2 has no backreferences or lookaround.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Callable
from typing import Annotated, Any, Final, Literal

import msgspec
import re2

from gateway.client.transcript import Turn

__all__ = [
    "MAX_SCENARIO_BYTES",
    "Expect",
    "Scenario",
    "ScenarioError",
    "ScenarioFile",
    "ScenarioTurn",
    "ToolExpect",
    "check",
    "read_scenarios",
]

MAX_SCENARIO_BYTES: Final = 1 << 20
MAX_SCENARIOS: Final = 1000
MAX_TURNS: Final = 1000
MAX_DEPTH: Final = 32
"""Tables and arrays within each other: a scenario file needs about eight."""

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message says where and what to fix."""


class ToolExpect(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tool the model must call in the turn: its name, and the arguments it must be
    given (only those named; ``"re:PATTERN"`` matches a string argument)."""

    name: Name
    args: dict[str, Any] = msgspec.field(default_factory=dict)


class Expect(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What must hold of one turn (every field set is checked)."""

    tool: ToolExpect | None = None
    no_tool: bool = False
    contains: str | None = None
    matches: str | None = None
    latency_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None
    cost_usd: Annotated[float, msgspec.Meta(ge=0)] | None = None
    ends: Literal["end", "cancelled", "blocked"] | None = None
    guardrail: Name | None = None
    """A guardrail rule (by name) that must trip on the turn: its message or its answer."""
    no_guardrail: bool = False


class ScenarioTurn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One thing the user says — typed (``user``) or spoken (``say``: synthesized by
    espeak-ng in ``voice``, streamed at real-time pace) — and what must hold of the turn."""

    user: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    say: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)] | None = None
    voice: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_+\-]{1,40}$")] = "en-us"
    expect: Expect = msgspec.field(default_factory=Expect)

    @property
    def text(self) -> str:
        """What the user says, for reports (a spoken turn's text in quotes)."""
        return self.user if self.user is not None else f"(says) {self.say}"


class Scenario(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A conversation: its configuration, where it starts, its turns.

    ``from_`` (``from`` in the file): a recording whose user side is replayed
    first, up to ``fork_at`` (its seq) when given, then the turns go on in
    that session.
    """

    name: Name
    instructions: str | None = None
    provider: str | None = None
    model: str | None = None
    from_: str | None = msgspec.field(default=None, name="from")
    fork_at: Annotated[int, msgspec.Meta(ge=1)] | None = None
    turn: Annotated[list[ScenarioTurn], msgspec.Meta(max_length=MAX_TURNS)] = msgspec.field(
        default_factory=list
    )


class ScenarioFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str | None = None
    scenario: Annotated[list[Scenario], msgspec.Meta(max_length=MAX_SCENARIOS)] = msgspec.field(
        default_factory=list
    )


def read_scenarios(text: str, source: str = "scenarios.toml") -> ScenarioFile:
    """A scenario file's text, checked (``ScenarioError`` says what to fix)."""
    if len(text) > MAX_SCENARIO_BYTES:
        raise ScenarioError(
            f"{source}: {len(text):,} characters, more than a scenario file may hold "
            f"({MAX_SCENARIO_BYTES:,}): split it"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not TOML ({exc})") from None
    except RecursionError:
        raise ScenarioError(_too_deep(source)) from None
    if not _depth_at_most(data, MAX_DEPTH):
        raise ScenarioError(_too_deep(source))
    try:
        found = msgspec.convert(data, ScenarioFile)
    except msgspec.ValidationError as exc:
        raise ScenarioError(
            f"{source}: {exc}; see docs/recording.md, 'Testing your agent in CI'"
        ) from None
    if not found.scenario:
        raise ScenarioError(f"{source}: no [[scenario]] in it; see docs/examples/scenarios.toml")
    for scenario in found.scenario:
        if not scenario.turn and scenario.from_ is None:
            raise ScenarioError(f"{source}: scenario {scenario.name!r} has no [[scenario.turn]]")
        for turn in scenario.turn:
            where = f"{source}: scenario {scenario.name!r}"
            if (turn.user is None) == (turn.say is None):
                raise ScenarioError(
                    f"{where}: each turn has either user = TEXT (typed) or say = TEXT (spoken)"
                )
            _check_patterns(turn.expect, where)
    return found


def _too_deep(source: str) -> str:
    return (
        f"{source}: tables or arrays nested more than {MAX_DEPTH} deep; no scenario file needs it"
    )


def _depth_at_most(value: object, limit: int) -> bool:
    """Whether ``value``'s dicts and lists nest no deeper than ``limit`` (no recursion)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


def _check_patterns(expect: Expect, where: str) -> None:
    patterns = [expect.matches] if expect.matches is not None else []
    if expect.tool is not None:
        patterns += [str(v)[3:] for v in expect.tool.args.values() if _is_pattern(v)]
    for pattern in patterns:
        try:
            _compiled(pattern)
        except re2.error as exc:
            reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
            raise ScenarioError(
                f"{where}: {pattern!r} is not a regular expression ({reason}; RE2 syntax: no "
                "backreferences or lookaround)"
            ) from None


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Callable[[str], object]:
    """A pattern's search, on RE2: linear in the text, whatever the pattern."""
    options = re2.Options()
    options.log_errors = False  # the error is in the ScenarioError; stderr needs no copy
    search: Callable[[str], object] = re2.compile(pattern, options).search
    return search


def _search(pattern: str, text: str) -> bool:
    return _compiled(pattern)(text) is not None


def _is_pattern(value: object) -> bool:
    return isinstance(value, str) and value.startswith("re:")


def check(turn: Turn | None, expect: Expect) -> list[str]:
    """Each way ``turn`` falls short of ``expect`` (empty: it passed)."""
    if turn is None:
        return ["the turn never started (the gateway refused it or the connection ended)"]
    failures: list[str] = []
    called = ", ".join(t.name for t in turn.tools) or "none"
    if expect.tool is not None:
        want = expect.tool
        named = [t for t in turn.tools if t.name == want.name]
        if not named:
            failures.append(f"expected a call of {want.name}; the model called {called}")
        elif not any(_args_match(t.args, want.args) for t in named):
            got = msgspec.json.encode(named[0].args).decode()
            failures.append(f"{want.name} was called with {got}, not with {want.args}")
    if expect.no_tool and turn.tools:
        failures.append(f"expected no tool call; the model called {called}")
    answer = turn.answer
    if expect.contains is not None and expect.contains not in answer:
        failures.append(f"the answer does not contain {expect.contains!r}: {_short(answer)}")
    if expect.matches is not None and not _search(expect.matches, answer):
        failures.append(f"the answer does not match {expect.matches!r}: {_short(answer)}")
    if expect.ends is not None and turn.outcome != expect.ends:
        failures.append(f"the turn ended {turn.outcome}, not {expect.ends}")
    tripped = ", ".join(turn.guardrails) or "none"
    if expect.guardrail is not None and expect.guardrail not in turn.guardrails:
        failures.append(f"expected the guardrail {expect.guardrail!r} to trip; tripped: {tripped}")
    if expect.no_guardrail and turn.guardrails:
        failures.append(f"expected no guardrail to trip; tripped: {tripped}")
    if expect.latency_ms is not None:
        if turn.end_ms is None:
            failures.append("the turn never ended, so its latency is unknown")
        elif turn.end_ms > expect.latency_ms:
            failures.append(f"the turn took {turn.end_ms:.0f} ms (over {expect.latency_ms:g} ms)")
    if expect.cost_usd is not None and turn.cost > expect.cost_usd:
        failures.append(f"the turn cost ${turn.cost:.6f} (over ${expect.cost_usd:g})")
    return failures


def _args_match(got: object, want: dict[str, Any]) -> bool:
    if not isinstance(got, dict):
        return not want
    for key, value in want.items():
        if key not in got:
            return False
        if _is_pattern(value):
            if not isinstance(got[key], str) or not _search(value[3:], got[key]):
                return False
        elif got[key] != value:
            return False
    return True


def _short(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= width else text[: width - 1] + "…")
