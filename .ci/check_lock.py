"""Fail when the venv holds a package at a version the lock does not name.

``pip install --require-hashes`` already refuses anything unpinned that it is
asked for; this catches what it is not asked for: a package left in the venv
by an earlier install, or one installed by hand after the lock.
Usage: python .ci/check_lock.py LOCKFILE   (run with the venv's python)
"""

import re
import sys
from importlib.metadata import distributions

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
_PROJECT = "realtime-gateway"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock_path: str) -> int:
    with open(lock_path, encoding="utf-8") as lock:
        # A universal lock may pin one package twice under exclusive markers
        # (numpy for Python < 3.12 and >= 3.12): either version is the lock's.
        pins: dict[str, set[str]] = {}
        for line in lock:
            if m := _PIN.match(line):
                pins.setdefault(_normal(m[1]), set()).add(m[2])
    wrong = []
    for dist in distributions():
        name = _normal(dist.metadata["Name"])
        if name == _PROJECT:
            continue
        if dist.version not in pins.get(name, ()):
            locked = " or ".join(sorted(pins.get(name, ()))) or "not in the lock"
            wrong.append(f"{name}=={dist.version} (lock: {locked})")
    if wrong:
        print(f"the venv differs from {lock_path}:", *sorted(wrong), sep="\n  ")
        print("reinstall from the lock (rm -rf .venv, then .ci/run) or regenerate it (.ci/lock)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
