"""The tools file: which built-ins, MCP servers and HTTP tools a node offers.

A TOML file (``gateway serve --tools FILE``)::

    [builtin]
    enable = ["read", "list", "find", "search"]      # default: the usual built-ins

    [mcp.calc]                                       # tools appear as calc.<tool>
    command = ["python3", "calc_server.py"]          # stdio child, or: url = "http://…/mcp"
    env = { CALC_MODE = "exact" }
    timeout = 30

    [http.book]
    url = "https://hotel.example/book"
    require_approval = true                          # each call waits for a user's approve
    background = true                                # the turn goes on while it runs
    ...

    [http.weather]
    url = "https://weather.example/tool"
    description = "Current weather for a city."
    parameters = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }
    headers = { Authorization = "Bearer ${WEATHER_TOKEN}" }
    timeout = 10

Everything is checked here, before anything starts: a mistake is a
``ToolsFileError`` whose message names the file, the section and the key, and
says what to write instead, so ``gateway serve`` can print it in one line
rather than a traceback. ``${VAR}`` in ``url``, ``env`` and ``headers`` is
replaced by the environment variable; a missing one is such an error too
(an empty bearer token would fail later, far from its cause).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from protocol.configuration import MAX_SCHEMA_DEPTH

from .providers.specs import HttpToolSpec, McpServerSpec
from .secrets import header_secrets
from .tenant_schema import TenantSchema

__all__ = ["ToolsFile", "ToolsFileError", "load_tools_file", "parse_tools_file"]

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_VAR: Final = re.compile(r"\$\{([^}]*)\}")
_FLAGS: Final = ("require_approval", "background")
_MCP_KEYS: Final = {"command", "url", "env", "timeout", *_FLAGS}
_HTTP_KEYS: Final = {"url", "description", "parameters", "headers", "timeout", *_FLAGS}
_BUILTIN_KEYS: Final = {"enable", *_FLAGS}


class ToolsFileError(ValueError):
    """The tools file cannot be used; the message names file, section, key and the fix."""


@dataclass(frozen=True, slots=True)
class ToolsFile:
    """A checked tools file. ``builtins`` None means the default built-ins."""

    path: str
    builtins: tuple[str, ...] | None = None
    builtin_approval: tuple[str, ...] = ()
    """Built-ins whose calls wait for a user's approve (``[builtin] require_approval``)."""
    builtin_background: tuple[str, ...] = ()
    """Built-ins whose calls do not block the turn (``[builtin] background``)."""
    mcp: tuple[McpServerSpec, ...] = ()
    http: tuple[HttpToolSpec, ...] = ()
    sections: dict[str, str] = field(default_factory=dict)
    """Tool or server name → its section (``[mcp.calc]``), for messages."""


def load_tools_file(
    path: str | Path, *, env: Mapping[str, str] | None = None, builtin_names: frozenset[str]
) -> ToolsFile:
    """Read and check ``path``; ``builtin_names`` are the names ``[builtin] enable`` may use."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolsFileError(
            f"tools file {path}: cannot be read ({exc.strerror or exc}); "
            "check the path given to --tools / GATEWAY_TOOLS"
        ) from None
    except UnicodeDecodeError:
        raise ToolsFileError(f"tools file {path}: is not UTF-8 text; save it as UTF-8") from None
    return parse_tools_file(text, str(path), env=env, builtin_names=builtin_names)


def parse_tools_file(
    text: str,
    path: str,
    *,
    env: Mapping[str, str] | None = None,
    builtin_names: frozenset[str],
) -> ToolsFile:
    environ = os.environ if env is None else env
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ToolsFileError(
            f"tools file {path}: not valid TOML ({exc}); fix the syntax there"
        ) from None
    except RecursionError:  # tomllib recurses per nested table or array
        raise ToolsFileError(
            f"tools file {path}: its tables or arrays nest too deeply to read; a tool's "
            f"parameters nest at most {MAX_SCHEMA_DEPTH} levels"
        ) from None
    known = {"builtin", "mcp", "http"}
    for key in data:
        if key not in known:
            raise ToolsFileError(
                f"tools file {path}: unknown section [{key}]; "
                "use [builtin], [mcp.NAME] or [http.NAME]"
            )
    where = _Where(path, environ)
    builtins = _builtins(data.get("builtin"), where, builtin_names)
    builtin_approval = _builtin_list(data.get("builtin"), "require_approval", where, builtin_names)
    builtin_background = _builtin_list(data.get("builtin"), "background", where, builtin_names)
    base = str(Path(path).resolve().parent)
    sections: dict[str, str] = {}
    mcp = tuple(
        _mcp(name, body, where, base)
        for name, body in _tables(data.get("mcp", {}), "mcp", where).items()
    )
    for spec in mcp:
        sections[spec.name] = f"[mcp.{spec.name}]"
    http: list[HttpToolSpec] = []
    taken = set(builtins if builtins is not None else builtin_names)
    for name, body in _tables(data.get("http", {}), "http", where).items():
        http_spec = _http(name, body, where)
        if name in taken:
            raise ToolsFileError(
                f"tools file {path}, [http.{name}]: a built-in tool is already named {name!r}; "
                "give the HTTP tool another name"
            )
        sections[name] = f"[http.{name}]"
        http.append(http_spec)
    return ToolsFile(
        path, builtins, builtin_approval, builtin_background, mcp, tuple(http), sections
    )


@dataclass(frozen=True, slots=True)
class _Where:
    path: str
    env: Mapping[str, str]
    # Values taken from the environment, by section: ``(variable, value)``, secrets.
    taken: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def error(self, section: str, key: str | None, problem: str) -> ToolsFileError:
        at = f"[{section}] {key}" if key else f"[{section}]"
        return ToolsFileError(f"tools file {self.path}, {at}: {problem}")

    def substitute(self, section: str, key: str, value: str) -> str:
        def replace(match: re.Match[str]) -> str:
            var = match[1]
            if var not in self.env:
                raise self.error(
                    section,
                    key,
                    f"the environment variable {var} is not set; set it before starting "
                    f"the gateway (or remove ${{{var}}} from the file)",
                )
            self.taken.setdefault(section, []).append((var, self.env[var]))
            return self.env[var]

        return _VAR.sub(replace, value)


def _tables(value: Any, kind: str, where: _Where) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        raise ToolsFileError(
            f"tools file {where.path}: {kind} must be tables such as [{kind}.NAME], "
            f"not a plain value"
        )
    for name, body in value.items():
        if not _NAME.fullmatch(name):
            raise where.error(
                f"{kind}.{name}",
                None,
                "the name must be 1-64 letters, digits, _ or - starting with a letter or _ "
                "(it becomes part of the tool names the model calls)",
            )
        if not isinstance(body, dict):
            raise where.error(f"{kind}.{name}", None, "must be a table of keys, not a value")
    return value


def _check_keys(body: dict[str, Any], allowed: set[str], section: str, where: _Where) -> None:
    for key in body:
        if key not in allowed:
            raise where.error(
                section,
                key,
                f"unknown key; the keys of this section are {', '.join(sorted(allowed))}",
            )


def _timeout(body: dict[str, Any], default: float, section: str, where: _Where) -> float:
    value = body.get("timeout", default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise where.error(
            section, "timeout", f"must be a positive number of seconds, not {value!r}"
        )
    return float(value)


def _strings(value: Any, section: str, key: str, where: _Where) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise where.error(section, key, 'must be a table of strings, like { NAME = "value" }')
    return {k: where.substitute(section, f"{key}.{k}", v) for k, v in value.items()}


def _url(value: Any, section: str, where: _Where) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise where.error(section, "url", f"must be an http:// or https:// URL, not {value!r}")
    return where.substitute(section, "url", value)


def _builtins(value: Any, where: _Where, builtin_names: frozenset[str]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ToolsFileError(f"tools file {where.path}: builtin must be a table [builtin]")
    _check_keys(value, set(_BUILTIN_KEYS), "builtin", where)
    enable = value.get("enable")
    if enable is None:
        return None
    if not isinstance(enable, list) or not all(isinstance(n, str) for n in enable):
        raise where.error("builtin", "enable", 'must be a list of names, like ["read", "list"]')
    for name in enable:
        if name not in builtin_names:
            raise where.error(
                "builtin",
                "enable",
                f"there is no built-in tool {name!r}; choose from {', '.join(sorted(builtin_names))}",
            )
    if len(set(enable)) != len(enable):
        raise where.error("builtin", "enable", "lists a tool twice; list each once")
    return tuple(enable)


def _builtin_list(
    value: Any, key: str, where: _Where, builtin_names: frozenset[str]
) -> tuple[str, ...]:
    """``[builtin] KEY = ["name", ...]``: built-ins marked so (checked names)."""
    if not isinstance(value, dict) or key not in value:
        return ()
    names = value[key]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise where.error("builtin", key, 'must be a list of names, like ["write", "shell"]')
    for name in names:
        if name not in builtin_names:
            raise where.error(
                "builtin",
                key,
                f"there is no built-in tool {name!r}; choose from "
                f"{', '.join(sorted(builtin_names))}",
            )
    return tuple(names)


def _flag(body: dict[str, Any], key: str, section: str, where: _Where) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise where.error(section, key, f"must be true or false, not {value!r}")
    return value


def _mcp(name: str, body: dict[str, Any], where: _Where, base: str) -> McpServerSpec:
    section = f"mcp.{name}"
    _check_keys(body, set(_MCP_KEYS), section, where)
    command = body.get("command")
    url = body.get("url")
    if (command is None) == (url is None):
        raise where.error(
            section,
            None,
            'give exactly one of command = ["program", "arg", ...] (a stdio server the gateway '
            'starts) or url = "http://host:port/mcp" (a streamable HTTP server)',
        )
    if command is not None and (
        not isinstance(command, list)
        or not command
        or not all(isinstance(p, str) and p for p in command)
    ):
        raise where.error(
            section, "command", 'must be a non-empty list of strings, like ["python3", "server.py"]'
        )
    spec = McpServerSpec(
        name=name,
        command=_own_python(tuple(command or ())),
        url=_url(url, section, where) if url is not None else "",
        env=_strings(body.get("env", {}), section, "env", where),
        timeout=_timeout(body, 30.0, section, where),
        cwd=base if command is not None else None,
        require_approval=_flag(body, "require_approval", section, where),
        background=_flag(body, "background", section, where),
    )
    return replace(spec, secrets=tuple(where.taken.get(section, ())))


def _own_python(command: tuple[str, ...]) -> tuple[str, ...]:
    """``python3 server.py`` runs with the gateway's own interpreter, whose
    environment has the MCP SDK the gateway was installed with (a system
    ``python3`` may have no ``mcp`` at all); any other program runs as written."""
    if command and command[0] in ("python", "python3"):
        return (sys.executable, *command[1:])
    return command


def _http(name: str, body: dict[str, Any], where: _Where) -> HttpToolSpec:
    section = f"http.{name}"
    _check_keys(body, set(_HTTP_KEYS), section, where)
    for key in ("url", "description", "parameters"):
        if key not in body:
            raise where.error(
                section, key, "is missing; an HTTP tool needs url, description and parameters"
            )
    description = body["description"]
    if not isinstance(description, str) or not description.strip():
        raise where.error(
            section,
            "description",
            "must be a non-empty string telling the model what the tool does",
        )
    try:
        TenantSchema(body["parameters"])
    except ValueError as exc:
        raise where.error(section, "parameters", f"{exc}") from None
    spec = HttpToolSpec(
        name=name,
        url=_url(body["url"], section, where),
        description=description.strip(),
        parameters=body["parameters"],
        headers=_strings(body.get("headers", {}), section, "headers", where),
        timeout=_timeout(body, 10.0, section, where),
        require_approval=_flag(body, "require_approval", section, where),
        background=_flag(body, "background", section, where),
    )
    # Every header value is a secret (a key written into the file), and whatever
    # came from the environment.
    taken = [*where.taken.get(section, ()), *header_secrets(spec.headers.items())]
    return replace(spec, secrets=tuple(taken))
