"""Checking a value against a compiled tenant schema, within a work budget.

The turn machine checks a client tool call's args on the event loop, before
the ``call`` event goes out (``protocol.turn``), so the check must end quickly
whatever the tenant's schema and the model's args are. Python ``jsonschema``
does not: ``re`` backtracks (``pattern``), ``uniqueItems`` over objects is
quadratic, and local ``$ref``s can make a schema exponential (30 nested
``anyOf``s of two references). Here:

- every application of a schema spends steps from a ``Run`` (one per keyword,
  plus the size of what a keyword walks: a string's length for ``pattern``,
  the values hashed for ``enum``, ``const`` and ``uniqueItems``); when the
  budget is spent the check stops with ``Unchecked``, a message telling the
  tenant what to do;
- regexes are RE2 (linear time), compiled once by ``tools.tenant_schema``;
- ``uniqueItems``, ``enum`` and ``const`` compare canonical keys in a set, so
  they cost the size of the values, never their count squared;
- nesting of applications is bounded too, so no schema can make the check
  recurse into a ``RecursionError``.

``tools.tenant_schema`` builds the ``Node`` graph; this module is what runs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Final, Protocol

import msgspec

__all__ = [
    "BUDGET",
    "MAX_ERRORS",
    "Builder",
    "Check",
    "Node",
    "Path",
    "Regex",
    "Run",
    "SchemaProblem",
    "Unchecked",
    "Walker",
    "canonical",
    "canonical_items",
    "depth_within",
    "described",
    "escape",
    "failed",
    "where",
]

BUDGET: Final = 50_000
"""Steps one args check may spend (measured: the costliest schema we could
build spends them in ~25 ms; docs/decisions/tenant-tool-schemas.md)."""
MAX_NESTING: Final = 160
"""Schema applications inside each other (args depth, ``$ref`` chains, ``allOf``...)."""
MAX_ERRORS: Final = 3

Path = tuple[Any, ...] | None
"""Where in the args a value is: ``(parent path, key or index)``, None for the args."""


class Unchecked(Exception):
    """The args could not be checked within the budget: the message says what to change."""


class Run:
    """One check's budget: steps left, and how deeply applications nest now."""

    __slots__ = ("depth", "steps")

    def __init__(self, steps: int = BUDGET) -> None:
        self.steps = steps
        self.depth = 0

    def spend(self, steps: int) -> None:
        self.steps -= steps
        if self.steps < 0:
            raise Unchecked(
                f"the args could not be checked within {BUDGET:,} steps: simplify the tool's "
                "schema (fewer nested anyOf/oneOf, $ref chains or patterns) or send smaller args"
            )


Check = Callable[[Any, Path, Run, "list[str] | None"], bool]
"""One keyword's test: ``(value, path, run, out)``; appends messages to ``out`` if given."""


class Node:
    """One compiled schema: its keywords' checks, applied in order.

    ``inplace``: the schemas it applies to the same value (``allOf``,
    ``$ref``...), which the compiler follows to refuse loops at declaration.
    """

    __slots__ = ("checks", "cost", "inplace", "pointer")

    def __init__(self, pointer: str) -> None:
        self.pointer = pointer
        self.checks: list[Check] = []
        self.inplace: list[Callable[[], Node]] = []
        self.cost = 1

    def ok(self, value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        """Whether ``value`` fits; with ``out``, collect up to ``MAX_ERRORS`` messages."""
        run.steps -= self.cost
        if run.steps < 0:
            run.spend(0)
        if run.depth >= MAX_NESTING:
            raise Unchecked(
                f"the args could not be checked: the tool's schema applies schemas inside "
                f"each other more than {MAX_NESTING} levels deep here; flatten it"
            )
        run.depth += 1
        valid = True
        for check in self.checks:
            if not check(value, path, run, out):
                valid = False
                if out is None or len(out) >= MAX_ERRORS:
                    break
        run.depth -= 1  # not in a finally: an Unchecked abandons the whole run
        return valid


def failed(out: list[str] | None, path: Path, message: str) -> bool:
    """Record ``message`` about the value at ``path`` (if messages are wanted); False."""
    if out is not None and len(out) < MAX_ERRORS:
        out.append(f"{where(path)}: {message}")
    return False


def where(path: Path) -> str:
    """``args.items[2].name``: where a value is, as the model wrote it."""
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "args" + "".join(reversed(parts))


_encoder: Final = msgspec.json.Encoder()


def described(value: Any, limit: int = 60) -> str:
    """``value`` as JSON for a message, cut to ``limit`` characters."""
    try:
        text = _encoder.encode(value).decode()
    except (TypeError, ValueError, RecursionError, OverflowError):
        text = repr(type(value).__name__)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def canonical(value: Any, run: Run) -> Hashable:
    """A hashable key equal for equal JSON values (``1 == 1.0``, ``true != 1``, key order ignored).

    Paid for before it is built: a container one step per two bytes of its
    JSON (msgspec measures it in C; building the key costs ~0.17 µs a byte, a
    step ~0.4 µs), a string by its length (hashing it).
    """
    kind = type(value)
    if kind is list or kind is dict:
        run.spend(_json_size(value) >> 1)
    elif kind is str:
        run.spend(1 + (len(value) >> 10))
    else:
        run.spend(1)
    return _key(value)


def canonical_items(values: list[Any], run: Run) -> set[Hashable]:
    """The canonical keys of ``values`` (``uniqueItems``), paid for as one container."""
    run.spend(1 + (_json_size(values) >> 1))
    return {_key(item) for item in values}


def depth_within(value: Any, limit: int, run: Run) -> bool:
    """Whether ``value`` nests at most ``limit`` levels; the walk pays a step per 4 values.

    Walked before anything recurses into the args, iteratively, so neither
    deep nor wide args can make it long: wide ones run out of budget.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict:
            children: Any = item.values()
        elif kind is list:
            children = item
        else:
            continue
        if depth > limit:
            return False
        run.spend(1 + (len(item) >> 2))
        below = depth + 1
        stack += [(c, below) for c in children if type(c) is dict or type(c) is list]
    return True


def _json_size(value: Any) -> int:
    try:
        return len(_encoder.encode(value))
    except (TypeError, RecursionError):  # not decoded JSON (args depth is limited first)
        return BUDGET << 1


def _key(value: Any) -> Hashable:
    """Numbers become strings (``hex``) so that their hashes are randomized like
    every string's: Python hashes an int modulo 2**61 - 1, and args of
    colliding integers would make a set quadratic again."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        key: Hashable = value  # str, None, True, False: distinct from every key below
        return key
    if kind is int:
        return ("n", hex(value))
    if kind is float:
        if value.is_integer():
            return ("n", hex(int(value)))
        return ("n", value.hex())
    if kind is list:
        return ("l", tuple([_key(item) for item in value]))
    if kind is dict:
        return ("o", frozenset([(k, _key(v)) for k, v in value.items()]))
    return ("?", repr(value))  # not decoded JSON: never equal to a JSON value


# ---------------------------------------------------------------------- compiling


class SchemaProblem(ValueError):
    """Why a schema is refused, at a JSON pointer into it."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(f"at {pointer}: {message}")


class Walker(Protocol):
    """What a keyword's builder may ask of the compiler (``tools.tenant_schema``)."""

    draft: int  # 2020 (2020-12) or 7 (draft-07)

    def node(self, schema: Any, pointer: str) -> Node:
        """The compiled node of ``schema`` (a subschema at ``pointer``)."""

    def sub(self, schema: dict[str, Any], key: str, pointer: str) -> Node:
        """The node of ``schema[key]``, a schema."""

    def subs(self, schema: dict[str, Any], key: str, pointer: str) -> list[Node]:
        """The nodes of ``schema[key]``, a non-empty array of schemas."""

    def named(self, schema: dict[str, Any], key: str, pointer: str) -> dict[str, Node]:
        """The nodes of ``schema[key]``, an object of schemas."""

    def count(self, schema: dict[str, Any], key: str, pointer: str) -> int:
        """``schema[key]``, a non-negative integer."""

    def number(self, schema: dict[str, Any], key: str, pointer: str) -> int | float:
        """``schema[key]``, a number."""

    def names(self, value: Any, pointer: str) -> list[str]:
        """``value``, an array of distinct property names."""

    def regex(self, pattern: Any, pointer: str) -> Regex:
        """``pattern`` compiled (RE2)."""


class Regex(Protocol):
    def __call__(self, text: str, run: Run) -> bool:
        """Whether ``text`` matches, the search paid for from ``run``."""


Builder = Callable[[Walker, dict[str, Any], str], Check | None]
"""Compiles one keyword (or a group read together) of a schema object, at a pointer."""


def escape(key: str) -> str:
    """``key`` as a JSON pointer token."""
    return key.replace("~", "~0").replace("/", "~1")
