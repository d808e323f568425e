"""agents-js (``@openai/agents-realtime``) installed once for every test worker.

``tests/openai_door/js/package-lock.json`` pins it; ``npm ci`` installs it on first
use. Several xdist workers ask for it at once (the Node turns and the Chromium
bundle), and ``npm ci`` starts by deleting ``node_modules``: unguarded, one worker's
install removed files another worker's Node was importing (``Cannot find package
…/zod/index.js``). So the install runs under an exclusive ``flock`` and is trusted
only when its marker names the lock file it installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

JS = Path(__file__).parents[1] / "openai_door" / "js"
_MARKER = JS / "node_modules" / ".installed-from"


def agents_js() -> Path:
    """The directory whose ``node_modules`` holds the locked agents-js (skips without npm)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed to run agents-js")
    lock = hashlib.sha256((JS / "package-lock.json").read_bytes()).hexdigest()
    with (JS / ".install.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
        if _MARKER.is_file() and _MARKER.read_text() == lock:
            return JS
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=JS,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        _MARKER.write_text(lock)
    return JS
