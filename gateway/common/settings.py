"""Settings declared once: a Struct field's annotation says how it is set.

Each setting of ``gateway.config.Config`` (and of the simulator's ``SimConfig``)
is one field whose annotation carries a ``Setting``:

    port: Annotated[Port, Setting("port to listen on (0 picks a free one)")] = 8765

where ``Port`` is ``Annotated[int, msgspec.Meta(ge=0, le=65535)]``. From that one
field come its flag (``--port``), its environment variable (``GATEWAY_PORT``),
its row in the configuration table of docs/configuration.md (``gateway settings --markdown``),
the parsing of flag, environment and Python values by one function with one
wording of what to do when a value is wrong, and its range check
(``check_ranges``, called by the Struct's ``__post_init__``, so a Struct built
in code is checked like one built from the environment).

A field whose type is itself such a Struct and that carries ``Nested(prefix)``
(``Config.sim``) lends it all its settings under ``PREFIX_<name>``: flags
``--PREFIX-<flag>``, variables ``GATEWAY_PREFIX_<NAME>``. So ``gateway sim
--chunk-size`` and ``gateway serve --sim-chunk-size`` are one declaration.

This module knows no setting; it imports nothing of ours, so any room may
declare settings with it (``gateway.config`` and ``gateway.sim`` do).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union

import msgspec

__all__ = [
    "ConfigError",
    "Declared",
    "Nested",
    "Setting",
    "add_flags",
    "check_ranges",
    "declared",
    "flag_values",
    "load",
    "markdown_table",
    "table_in",
    "with_table",
]

ENV_PREFIX = "GATEWAY_"

S = TypeVar("S", bound=msgspec.Struct)


class ConfigError(ValueError):
    """A setting has a value the gateway cannot use; the message names it and the fix."""


@dataclass(frozen=True, slots=True)
class Setting:
    """How one field is set and documented (the field's type and default say the rest).

    - ``help``: one line for ``--help`` and the docs; say the unit.
    - ``group``: the heading it is listed under.
    - ``flag``: the flag's name without dashes when it is not the field's
      (``redis`` for ``redis_url``). A flag of a bool setting sets the
      opposite of its default (``--enable-shell``, ``--no-overrun``).
    - ``env``: a conventional variable also read (``REDIS_URL``);
      ``GATEWAY_<NAME>`` is always read and wins over it.
    - ``secret``: environment only — a flag would show in ``ps`` and in shell
      history — and never printed.
    - ``shown_default``: the docs' words for a default worked out at start.
    - ``example``: a valid value other than the default, for a text setting
      whose form is constrained (a pattern); shown in the help.
    - ``choices``: the values a text setting takes when they come from data
      (a table) rather than a ``Literal``.
    - ``aliases``: names the setting had before, still understood, each
      written as it is used: a flag (``--redis``), a variable in capitals
      (``GATEWAY_REDIS_URL``, read after ``GATEWAY_<NAME>`` and before ``env``),
      or a former field name (``redis_url``, a key of ``load``'s overrides).
    """

    help: str
    group: str = ""
    flag: str = ""
    env: str = ""
    secret: bool = False
    shown_default: str = ""
    example: str = ""
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Nested:
    """Marks a field holding another settings Struct; its settings are named ``PREFIX_<name>``.

    ``prefix`` "" adds none (a group of Structs each with its own prefix);
    ``struct`` names the Struct when the field's annotation cannot (one made
    at run time, from a table: ``gateway.upstream.providers.UpstreamSettings``).
    """

    prefix: str
    struct: type[msgspec.Struct] | None = None


@dataclass(frozen=True, slots=True)
class Declared:
    """One setting as the declaration resolves it: what every derived form reads."""

    name: str  # the key of load() overrides and of messages: sim_chunk_size
    path: tuple[str, ...]  # where it lives: ("sim", "chunk_size")
    type: Any  # what a value is converted to, constraints included
    default: Any  # msgspec.NODEFAULT: required (``gateway loadtest``'s url)
    setting: Setting
    flag: str  # "--sim-chunk-size"; "" for a secret
    env: tuple[str, ...]  # the variables read, the winner first
    choices: tuple[str, ...]  # a Literal's values
    bounds: msgspec.Meta | None  # ge/gt/le/lt
    optional: bool  # None is a value (never, none)

    @property
    def alias_flags(self) -> tuple[str, ...]:
        """Former flags that still set it (``--redis``); none for a secret."""
        if not self.flag:
            return ()
        return tuple(a for a in self.setting.aliases if a.startswith("--"))

    @property
    def former_names(self) -> tuple[str, ...]:
        """Former field names, still keys of ``load``'s overrides (``redis_url``)."""
        return tuple(a for a in self.setting.aliases if _is_name(a))

    @property
    def required(self) -> bool:
        """No default: a value must be given (as a positional argument on a command line)."""
        return self.default is msgspec.NODEFAULT

    @property
    def base(self) -> type:
        """``int``, ``float``, ``bool`` or ``str``."""
        return _base(self.type)


# ------------------------------------------------------------------ reading the declaration


def _is_name(alias: str) -> bool:
    return not alias.startswith("--") and not alias.isupper()


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """``Annotated[T, m…]`` → ``(T, [m…])`` (nested Annotated flattened)."""
    meta: list[Any] = []
    while typing.get_origin(tp) is Annotated:
        meta.extend(tp.__metadata__)
        tp = tp.__origin__
    return tp, meta


def _non_none(tp: Any) -> tuple[Any, bool]:
    """``T | None`` → ``(T, True)``; anything else → ``(tp, False)``."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _base(tp: Any) -> type:
    inner, _ = _unwrap(_non_none(_unwrap(tp)[0])[0])
    if typing.get_origin(inner) is Literal:
        return str
    return inner if isinstance(inner, type) else str


@functools.cache
def declared(struct: type[msgspec.Struct], prefix: str = "") -> tuple[Declared, ...]:
    """Every setting of ``struct`` (nested Structs flattened), in declaration order."""
    hints = typing.get_type_hints(struct, include_extras=True)
    out: list[Declared] = []
    for field in msgspec.structs.fields(struct):
        tp, meta = _unwrap(hints[field.name])
        name = f"{prefix}_{field.name}" if prefix else field.name
        nested = next((m for m in meta if isinstance(m, Nested)), None)
        if nested is not None:
            inner_prefix = "_".join(p for p in (prefix, nested.prefix) if p)
            for inner in declared(nested.struct or tp, inner_prefix):
                out.append(dataclasses.replace(inner, path=(field.name, *inner.path)))
            continue
        setting = next((m for m in meta if isinstance(m, Setting)), None)
        if setting is None:
            raise TypeError(f"{struct.__name__}.{field.name} has no Setting(...) in its annotation")
        arm, optional = _non_none(tp)
        arm, arm_meta = _unwrap(arm)
        bounds = next((m for m in [*meta, *arm_meta] if isinstance(m, msgspec.Meta)), None)
        choices = setting.choices or (
            tuple(typing.get_args(arm)) if typing.get_origin(arm) is Literal else ()
        )
        flag_name = setting.flag or field.name.replace("_", "-")
        if prefix:
            flag_name = f"{prefix.replace('_', '-')}-{flag_name}"
        env = (
            f"{ENV_PREFIX}{name.upper()}",
            *(a for a in setting.aliases if a.isupper() and not a.startswith("--")),
            *((setting.env,) if setting.env else ()),
        )
        if field.default is not msgspec.NODEFAULT:
            default = field.default
        elif field.default_factory is not msgspec.NODEFAULT:
            default = field.default_factory()
        else:
            default = msgspec.NODEFAULT
        out.append(
            Declared(
                name=name,
                path=(field.name,),
                type=hints[field.name],
                default=default,
                setting=setting,
                flag="" if setting.secret else f"--{flag_name}",
                env=env,
                choices=tuple(str(c) for c in choices),
                bounds=bounds,
                optional=optional,
            )
        )
    return tuple(out)


# ------------------------------------------------------------------ values


def _number(value: float) -> str:
    return f"{value:g}"


def describe(d: Declared) -> str:
    """What a valid value looks like: ``a whole number from 0 to 65535``."""
    if d.choices:
        return "one of " + ", ".join(d.choices)
    base = d.base
    if base is bool:
        return "true or false"
    if base is str:  # a pattern's Meta may say what it takes (--provider: the choices)
        return d.bounds.description if d.bounds is not None and d.bounds.description else "text"
    text = "a whole number" if base is int else "a number"
    b = d.bounds
    if b is not None:
        if b.ge is not None and b.le is not None:
            text += f" from {_number(b.ge)} to {_number(b.le)}"
        else:
            limits = [
                f"{op} {_number(bound)}"
                for op, bound in ((">=", b.ge), (">", b.gt), ("<=", b.le), ("<", b.lt))
                if bound is not None
            ]
            text += " " + " and ".join(limits)
    return text


def shown_default(d: Declared) -> str:
    """The default as the docs and messages write it."""
    if d.setting.shown_default:
        return d.setting.shown_default
    if d.required:
        return "required"
    if d.default is None or d.default == "":
        return "none"
    if isinstance(d.default, bool):
        return "on" if d.default else "off"
    if isinstance(d.default, float):
        return _number(d.default)
    return str(d.default)


def parse(d: Declared, value: object, source: str, fix: str) -> Any:
    """``value`` (text from a flag or variable, or a Python value) as ``d``'s type.

    Raises ``ConfigError``: ``{source}: use {what is valid}{fix}``.
    """
    if d.choices and isinstance(value, str) and value not in d.choices:
        # Case does not matter to a person typing INFO or Gemini.
        value = next((c for c in d.choices if c.lower() == value.lower()), value)
    try:
        converted = msgspec.convert(value, d.type, strict=False)
    except msgspec.ValidationError:
        pass
    else:
        if not d.choices or str(converted) in d.choices or (converted is None and d.optional):
            return converted
    none = " (or none)" if d.optional else ""
    raise ConfigError(f"{source} is not valid: use {describe(d)}{none}{fix}")


def check_ranges(obj: msgspec.Struct) -> None:
    """Raise ``ConfigError`` naming the first field of ``obj`` outside its declared range.

    For ``__post_init__``: msgspec checks constraints when it converts, not when
    code constructs a Struct; this makes both the same.
    """
    for d in declared(type(obj)):
        if len(d.path) > 1:
            continue  # a nested Struct checked itself
        value = getattr(obj, d.name)
        if value is None and d.optional:
            continue
        if d.choices:
            if value not in d.choices:
                raise ConfigError(f"{d.name} {value!r} is not valid: use {describe(d)}")
            continue
        b = d.bounds
        if b is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if (  # written so that NaN is out of every range
            (b.ge is not None and not value >= b.ge)
            or (b.gt is not None and not value > b.gt)
            or (b.le is not None and not value <= b.le)
            or (b.lt is not None and not value < b.lt)
        ):
            raise ConfigError(f"{d.name} {value!r} is out of range: use {describe(d)}")


def load(
    struct: type[S],
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> S:
    """``struct`` from its defaults, then ``env``, then ``overrides`` (keyed by setting name).

    Unset or empty variables and ``None`` overrides leave a setting alone.
    """
    decls = {d.name: d for d in declared(struct)}
    former = {old: d for d in decls.values() for old in d.former_names}
    values: dict[str, Any] = {}
    for d in decls.values():
        for var in reversed(d.env):  # the conventional name first, so GATEWAY_… wins
            text = (env or {}).get(var)
            if text:
                shown = "…" if d.setting.secret else repr(text)
                values[d.name] = parse(
                    d,
                    text,
                    f"{var}={shown}",
                    f"; set {var} to that, or unset it to use the default ({shown_default(d)})",
                )
    for name, value in (overrides or {}).items():
        given = decls.get(name) or former.get(name)
        if given is None:
            raise ConfigError(f"unknown setting {name!r}: see `gateway settings --markdown`")
        if value is not None:
            values[given.name] = parse(
                given, value, f"{name}={value!r}", f" (default {shown_default(given)})"
            )
    return _build(struct, values, decls)


def _build(struct: type[S], values: Mapping[str, Any], decls: Mapping[str, Declared]) -> S:
    return _build_at(struct, [(decls[name].path, value) for name, value in values.items()])


def _build_at(struct: type[S], values: list[tuple[tuple[str, ...], Any]]) -> S:
    """``struct`` from ``(path, value)`` pairs; a longer path fills a nested Struct."""
    top: dict[str, Any] = {}
    nested: dict[str, list[tuple[tuple[str, ...], Any]]] = {}
    for path, value in values:
        if len(path) == 1:
            top[path[0]] = value
        else:
            nested.setdefault(path[0], []).append((path[1:], value))
    hints = typing.get_type_hints(struct, include_extras=True)
    for field_name, inner in nested.items():
        tp, meta = _unwrap(hints[field_name])
        marker = next((m for m in meta if isinstance(m, Nested)), None)
        top[field_name] = _build_at((marker.struct if marker else None) or tp, inner)
    return struct(**top)


# ------------------------------------------------------------------ flags


def add_flags(
    parser: argparse.ArgumentParser,
    struct: type[msgspec.Struct],
    *,
    prefix: str = "",
    skip: Iterable[str] = (),
) -> None:
    """Add a flag per setting of ``struct`` (secrets excepted), ``dest`` = the setting name.

    Flags default to ``None`` (unset), so a flag left out never hides a
    variable; ``flag_values`` gives the ones given. A bad value is refused by
    argparse with the same words as a bad variable. A required setting (no
    default) is a positional argument instead.
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    skipped = set(skip)
    for d in declared(struct, prefix):
        if not d.flag or d.name in skipped:
            continue
        if d.required:
            help_text = d.setting.help.replace("%", "%%")
            parser.add_argument(d.name, type=functools.partial(_flag_value, d), help=help_text)
            continue
        group = groups.get(d.setting.group)
        if group is None:
            group = groups[d.setting.group] = parser.add_argument_group(d.setting.group or None)
        help_text = f"{d.setting.help}; default {shown_default(d)}".replace("%", "%%")
        if d.base is bool and not d.optional:
            group.add_argument(
                d.flag,
                *d.alias_flags,
                dest=d.name,
                action="store_const",
                const=not d.default,
                help=help_text,
            )
            continue
        if d.choices:
            metavar = "{" + ",".join(d.choices) + "}"
        else:
            metavar = "N" if d.base in (int, float) else d.name.upper()
        group.add_argument(
            d.flag,
            *d.alias_flags,
            dest=d.name,
            type=functools.partial(_flag_value, d),
            metavar=metavar,
            help=f"{help_text} ({describe(d)})" if d.bounds else help_text,
        )


def _flag_value(d: Declared, text: str) -> Any:
    try:
        return parse(d, text, repr(text), f" (default {shown_default(d)})")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def flag_values(
    ns: argparse.Namespace, struct: type[msgspec.Struct], prefix: str = ""
) -> dict[str, Any]:
    """The settings of ``struct`` given as flags in ``ns``, keyed by the field's own name."""
    values = vars(ns)
    out: dict[str, Any] = {}
    for d in declared(struct, prefix):
        value = values.get(d.name)
        if value is not None:
            out[d.name.removeprefix(f"{prefix}_") if prefix else d.name] = value
    return out


# ------------------------------------------------------------------ docs


def markdown_table(struct: type[msgspec.Struct]) -> str:
    """The configuration table of docs/configuration.md: one row per setting, grouped."""
    lines = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    group = None
    for d in declared(struct):
        if d.setting.group != group:
            group = d.setting.group
            lines.append(f"| **{group}** | | | |")
        flag = (
            " or ".join(f"`{f}`" for f in (d.flag, *d.alias_flags))
            if d.flag
            else "(secret: environment only)"
        )
        env = " or ".join(f"`{v}`" for v in d.env)
        values = f"; {describe(d)}" if d.choices or d.bounds else ""
        meaning = f"{d.setting.help}{values}".replace("|", "\\|")
        lines.append(f"| {flag} | {env} | {shown_default(d)} | {meaning} |")
    return "\n".join(lines) + "\n"


TABLE_BEGIN = "<!-- settings table: generated by `gateway settings --markdown`; do not edit -->"
TABLE_END = "<!-- end of settings table -->"


def table_in(text: str) -> str:
    """The settings table a document holds between ``TABLE_BEGIN`` and ``TABLE_END``."""
    start, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ConfigError(f"no settings table: put {TABLE_BEGIN!r} and {TABLE_END!r} around it")
    return text[start + len(TABLE_BEGIN) : end].strip("\n") + "\n"


def with_table(text: str, table: str) -> str:
    """``text`` with the table between the markers replaced by ``table``."""
    table_in(text)  # the markers are there, in order
    start = text.index(TABLE_BEGIN) + len(TABLE_BEGIN)
    end = text.index(TABLE_END)
    return f"{text[:start]}\n{table}{text[end:]}"
