"""Trying a recipe of docs/architecture.md on a copy of the code.

A recipe test copies the rooms it needs to a temporary directory, makes
exactly the recipe's edits there (``edit`` fails when the text it replaces
is gone, so a recipe test breaks loudly when the code's shape changes) and
runs what must follow from them in a subprocess, on the copy.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["ROOT", "copy_rooms", "edit", "passed", "run", "run_tests"]

ROOT = Path(__file__).resolve().parents[2]

# What every copy needs to import the packages and run pytest as the repository does.
_ALWAYS = ("gateway", "protocol", "tools", "tests/support")
_FILES = ("README.md", "pyproject.toml", "tests/__init__.py", "tests/conftest.py")


def copy_rooms(tmp_path: Path, rooms: Iterable[str] = ()) -> Path:
    """A copy of the code and of ``rooms`` (folders or files) under ``tmp_path``; its root."""
    root = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "node_modules", "*.pyc")
    for room in (*_ALWAYS, *rooms):
        source = ROOT / room
        if source.is_dir():
            shutil.copytree(source, root / room, ignore=ignore)
        else:
            (root / room).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, root / room)
    for name in _FILES:
        shutil.copy(ROOT / name, root / name)
    return root


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one ``old`` in ``path`` by ``new`` (the recipe's edit, where it goes)."""
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer has {old!r} once: the recipe test's edit"
    path.write_text(text.replace(old, new))


def run(root: Path, *args: str, timeout: float = 100) -> str:
    """``python ARGS`` on the copy; its output (it must succeed)."""
    done = subprocess.run(
        [sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def run_tests(root: Path, *args: str, timeout: float = 100) -> str:
    """pytest on the copy, in one process (``-n0``), with ``args`` (files, ``-k``)."""
    return run(root, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", *args, timeout=timeout)


def passed(report: str) -> int:
    """How many tests a pytest report says passed."""
    found = re.search(r"(\d+) passed", report)
    return 0 if found is None else int(found.group(1))
