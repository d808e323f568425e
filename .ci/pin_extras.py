"""Pin the packages the lock's packages require *with extras* under those extras.

pip's ``--require-hashes`` treats ``google-auth[requests]`` (google-genai's
requirement) as a requirement of its own: while the lock's ``google-auth==2.63.0``
was the newest release, pip chose it; once 2.63.1 came out, pip picked the new
release for the extra and refused the install ("all requirements must have their
versions pinned with =="). uv writes the base name only, so this rewrites those
lines as ``name[extras]==version``: the same version and hashes, now matched by the
extra's requirement too. Run by ``.ci/lock`` after each resolution.

The names come from the packages' metadata (``Requires-Dist`` with extras), listed
here because the lock's tool venv has none of them installed; ``.ci/check_lock.py``
does not need them (it compares versions).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Required with extras by a locked package (who requires it, in the comment).
EXTRAS = {
    "google-auth": "requests",  # google-genai
    "pyjwt": "crypto",  # mcp
    "opentelemetry-exporter-http-transport": "requests",  # opentelemetry-exporter-otlp-proto-http
}


def pin(text: str) -> str:
    def extra(match: re.Match[str]) -> str:
        name = match.group(1)
        wanted = EXTRAS.get(name.lower().replace("_", "-"))
        return f"{name}[{wanted}]==" if wanted else match.group(0)

    return re.sub(r"^([A-Za-z0-9_.\-]+)==", extra, text, flags=re.M)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        path = Path(arg)
        path.write_text(pin(path.read_text()))
