"""Every shell command in README.md's and docs/'s fenced blocks is one that exists.

A newcomer copies these lines first. Each block without a language (or
``sh``/``bash``/``shell``) is read as shell: every command in it must name a
program that exists (a ``.venv/bin`` script this package or its lock installs, a
script of a virtualenv the block itself makes, a file in the checkout, a shell
builtin, or one on ``PATH``), every file it reads from the checkout
(``-r lock/…``) must exist, and a ``gateway`` command's subcommand and flags
must be ones its argparse parser has. Output, queries and logs are in blocks
labelled as what they are (``text``, ``json``, ``promql``), so they are not read
as commands. A heredoc's body is the program's input, not commands.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pytest

from gateway.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
SHELL = {"", "sh", "bash", "shell"}
# What `python3 -m venv .venv` and the locks put in .venv/bin besides our scripts.
VENV_TOOLS = {"pip", "python", "python3"}


def _blocks(text: str) -> list[str]:
    return [
        body
        for lang, body in re.findall(r"^```([\w-]*)\n(.*?)^```", text, re.M | re.S)
        if lang in SHELL
    ]


def _commands(block: str) -> list[list[str]]:
    """The simple commands of a block: lines joined at ``\\``, split at ``&&``, ``||``, ``|``,
    ``;``; a heredoc's body (``<<'EOF'`` … ``EOF``) left out."""
    text = re.sub(r"\\\n", " ", block)
    commands: list[list[str]] = []
    ending: str | None = None
    for line in text.splitlines():
        if ending is not None:
            if line.strip() == ending:
                ending = None
            continue
        if heredoc := re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line):
            ending = heredoc.group(1)
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", "||", "|", ";"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def _scripts() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project.get("scripts", {}))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _check_gateway(args: list[str]) -> None:
    parser = build_parser()
    words = list(args)
    while words and (subs := _subparsers(parser)):
        name = words.pop(0)
        assert name in subs, (
            f"README runs `gateway … {name}`, which is no subcommand of {sorted(subs)}"
        )
        parser = subs[name]
    flags = set(parser._option_string_actions)
    if "--" in words:  # the end of options: what follows is positional
        words = words[: words.index("--")]
    for word in words:
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in flags, f"README passes {flag}, which `{parser.prog}` does not have"


# Shell builtins (no file on PATH to find).
BUILTINS = {"export", "cd", "set", "unset", "source", ".", "wait", "read", "exit"}
# Where a docs recipe keeps the checkout it installs from.
CHECKOUT = "/path/to/realtime-gateway/"


def _venvs(commands: list[list[str]]) -> set[str]:
    """The virtualenvs a block makes (``python3 -m venv DIR``), besides ``.venv``."""
    made = {".venv"}
    for command in commands:
        words = [w for w in command if w != "sudo"]
        if (
            len(words) >= 4
            and Path(words[0]).name.startswith("python")
            and words[1:3]
            == [
                "-m",
                "venv",
            ]
        ):
            made.add(words[3].rstrip("/"))
    return made


def _check(command: list[str], venvs: frozenset[str] | set[str] = frozenset({".venv"})) -> None:
    while command and re.fullmatch(r"[A-Z_]+=.*", command[0]):  # VAR=value cmd
        command = command[1:]
    if command[:1] == ["sudo"]:
        command = command[1:]
    if not command or command[0] in BUILTINS:
        return  # assignments only, or a builtin
    program, args = command[0], command[1:]
    venv, _, name = program.rpartition("/bin/")
    if venv in venvs:
        assert name in VENV_TOOLS | _scripts(), f"README runs {program}, which nothing installs"
    elif "/" in program:
        assert (ROOT / program).is_file(), f"README runs {program}, which is not in the checkout"
    else:
        assert shutil.which(program) or program in _scripts(), f"README runs {program}: not found"
    for flag, value in itertools.pairwise(args):
        if flag in ("-r", "--requirement"):
            value = value.removeprefix(CHECKOUT)
            assert (ROOT / value).is_file(), f"README reads {value}, which is not in the checkout"
    if Path(program).name == "gateway":
        _check_gateway(args)
    elif Path(program).name.startswith("python") and args[:2] == ["-m", "gateway.cli"]:
        _check_gateway(args[2:])


README_COMMANDS = [c for b in _blocks((ROOT / "README.md").read_text()) for c in _commands(b)]
DOCS_COMMANDS = [
    (f"{doc.relative_to(ROOT)}: {' '.join(command)[:60]}", command, venvs)
    for doc in sorted((ROOT / "docs").rglob("*.md"))
    for block in _blocks(doc.read_text())
    for venvs in [_venvs(_commands(block))]
    for command in _commands(block)
]


def test_the_readme_shows_the_commands_a_newcomer_needs() -> None:
    programs = {Path(c[0]).name for c in README_COMMANDS}
    assert {"gateway", "pip", "python"} <= programs, programs


@pytest.mark.parametrize("command", README_COMMANDS, ids=lambda c: " ".join(c)[:60])
def test_every_readme_command_exists(command: list[str]) -> None:
    _check(command)


@pytest.mark.parametrize(
    ("where", "command", "venvs"), DOCS_COMMANDS, ids=[where for where, _, _ in DOCS_COMMANDS]
)
def test_every_docs_command_exists(where: str, command: list[str], venvs: set[str]) -> None:
    _check(command, venvs)


@pytest.mark.parametrize(
    "line",
    [
        ".venv/bin/gateway serve --no-such-flag",
        ".venv/bin/gateway serv",
        ".venv/bin/pip install -r lock/nothing.txt",
        ".venv/bin/gatewy chat",
        "sudo /opt/gw/bin/gateway serve",  # a virtualenv no line of the block made
        "/usr/bin/python3 -m gateway.cli serv",
    ],
)
def test_a_wrong_command_is_caught(line: str) -> None:
    (command,) = _commands(line)
    with pytest.raises(AssertionError):
        _check(command)
