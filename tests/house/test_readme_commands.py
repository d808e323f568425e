"""Every shell command in README.md's fenced blocks is one that exists.

A newcomer copies these lines first. Each block without a language (or
``sh``/``bash``/``shell``) is read as shell: every command in it must name a
program that exists (a ``.venv/bin`` script this package or its lock installs, a
file in the checkout, or one on ``PATH``), every file it reads from the
checkout (``-r lock/…``) must exist, and a ``gateway`` command's subcommand and
flags must be ones its argparse parser has.
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
    """The simple commands of a block: lines joined at ``\\``, split at ``&&``, ``||``, ``|``, ``;``."""
    text = re.sub(r"\\\n", " ", block)
    commands: list[list[str]] = []
    for line in text.splitlines():
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
    for word in words:
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in flags, f"README passes {flag}, which `{parser.prog}` does not have"


def _check(command: list[str]) -> None:
    while command and re.fullmatch(r"[A-Z_]+=.*", command[0]):  # VAR=value cmd
        command = command[1:]
    program, args = command[0], command[1:]
    if program.startswith(".venv/bin/"):
        name = program.removeprefix(".venv/bin/")
        assert name in VENV_TOOLS | _scripts(), f"README runs {program}, which nothing installs"
    elif "/" in program:
        assert (ROOT / program).is_file(), f"README runs {program}, which is not in the checkout"
    else:
        assert shutil.which(program) or program in _scripts(), f"README runs {program}: not found"
    for flag, value in itertools.pairwise(args):
        if flag in ("-r", "--requirement"):
            assert (ROOT / value).is_file(), f"README reads {value}, which is not in the checkout"
    if Path(program).name == "gateway":
        _check_gateway(args)
    elif Path(program).name.startswith("python") and args[:2] == ["-m", "gateway.cli"]:
        _check_gateway(args[2:])


README_COMMANDS = [c for b in _blocks((ROOT / "README.md").read_text()) for c in _commands(b)]


def test_the_readme_shows_the_commands_a_newcomer_needs() -> None:
    programs = {Path(c[0]).name for c in README_COMMANDS}
    assert {"gateway", "pip", "python"} <= programs, programs


@pytest.mark.parametrize("command", README_COMMANDS, ids=lambda c: " ".join(c)[:60])
def test_every_readme_command_exists(command: list[str]) -> None:
    _check(command)


@pytest.mark.parametrize(
    "line",
    [
        ".venv/bin/gateway serve --no-such-flag",
        ".venv/bin/gateway serv",
        ".venv/bin/pip install -r lock/nothing.txt",
        ".venv/bin/gatewy chat",
    ],
)
def test_a_wrong_command_is_caught(line: str) -> None:
    (command,) = _commands(line)
    with pytest.raises(AssertionError):
        _check(command)
