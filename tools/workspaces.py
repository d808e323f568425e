"""Where a session's workspace lives, and which directory names can be one.

A session id becomes a directory name under the node's workspace root, so it
must be a single harmless path component. The gateway's ids are
``secrets.token_urlsafe`` (``A-Z a-z 0-9 - _``); a client can name a session
on resume, so an id is checked here before it touches the file system, and
the sweeper of ended sessions' workspaces (``gateway.sessions.workspaces``)
only ever removes directories whose names pass the same check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

__all__ = ["InvalidSessionId", "is_workspace_name", "workspace_dir"]

# token_urlsafe(18) is 24 characters; other lengths are allowed, other characters not.
_NAME: Final = re.compile(r"[A-Za-z0-9_-]{8,128}")


class InvalidSessionId(ValueError):
    """A session id that cannot be a directory name (a bug or a forged id)."""


def is_workspace_name(name: str) -> bool:
    """Whether ``name`` could be a session's workspace directory (url-safe token characters)."""
    return _NAME.fullmatch(name) is not None


def workspace_dir(root: Path, session_id: str) -> Path:
    """The workspace directory of ``session_id`` under ``root`` (not created).

    Raises ``InvalidSessionId`` unless the id is 8-128 url-safe token
    characters, so no id can name ``..``, a path with ``/`` or a hidden file.
    """
    if not is_workspace_name(session_id):
        raise InvalidSessionId(
            f"session id {session_id[:40]!r} cannot name a workspace: session ids are "
            "8-128 characters of A-Z, a-z, 0-9, '-' and '_'"
        )
    return root / session_id
