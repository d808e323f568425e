"""Helpers for the deploy tests: the deploy files, and the real tools that check them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# haproxy and nginx live in sbin, which is not on every user's PATH.
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def binary(name: str) -> str:
    """The path of a system tool, or skip the test: CI installs them (see .ci/run)."""
    found = shutil.which(name) or next(
        (str(Path(d) / name) for d in _SBIN if (Path(d) / name).is_file()), None
    )
    if found is None:
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return found


def lb_backends(text: str) -> list[tuple[str, int]]:
    """``(host, port)`` of every backend server in an haproxy.cfg or nginx.conf."""
    haproxy = re.findall(r"^\s*server\s+\S+\s+([\w.-]+):(\d+)", text, re.M)
    nginx = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", text, re.M)
    return [(host, int(port)) for host, port in haproxy or nginx]


def substitute_backends(text: str, addresses: dict[str, str]) -> str:
    """The config with backend ``host:port`` replaced (e.g. by loopback addresses)."""
    for old, new in addresses.items():
        text = text.replace(old, new)
    return text
