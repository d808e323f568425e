"""Where a session's workspace lives, and which directory names can be one.

A node keeps its sessions' workspaces under ``workspace_root/NAMESPACE/SID``.
``NAMESPACE`` names the store the sessions live in (``namespace_name``):
nodes of one store on one machine share it, a node of another store never
sweeps it (``gateway.sessions.workspaces``). A session id becomes a
directory name under it, so it must be a single harmless path component.
The gateway's ids are ``secrets.token_urlsafe`` (``A-Z a-z 0-9 - _``); a
client can name a session on resume, so an id is checked here before it
touches the file system, and the sweeper of ended sessions' workspaces only
ever removes directories whose names pass the same check. A namespace's
name has a dot, which no session id has, so the two never mix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final, Literal

__all__ = [
    "InvalidSessionId",
    "NamespaceKind",
    "is_workspace_name",
    "namespace_kind",
    "namespace_name",
    "workspace_dir",
]

# token_urlsafe(18) is 24 characters; other lengths are allowed, other characters not.
_NAME: Final = re.compile(r"[A-Za-z0-9_-]{8,128}")

NamespaceKind = Literal["store", "memory"]
"""``store``: a store shared by nodes (Redis), named by an id kept in it;
``memory``: an in-process store, whose sessions end with its process."""
_NAMESPACE: Final = re.compile(r"(store|memory)\.([A-Za-z0-9_-]{8,128})")


class InvalidSessionId(ValueError):
    """A session id that cannot be a directory name (a bug or a forged id)."""


def is_workspace_name(name: str) -> bool:
    """Whether ``name`` could be a session's workspace directory (url-safe token characters)."""
    return _NAME.fullmatch(name) is not None


def namespace_name(kind: NamespaceKind, identity: str) -> str:
    """The directory of one store's workspaces: ``KIND.IDENTITY``.

    Raises ``ValueError`` unless ``identity`` is 8-128 url-safe characters.
    """
    if not is_workspace_name(identity):
        raise ValueError(f"store identity {identity[:40]!r} cannot name a directory")
    return f"{kind}.{identity}"


def namespace_kind(name: str) -> NamespaceKind | None:
    """The kind of store whose namespace ``name`` is; None: not a namespace."""
    match = _NAMESPACE.fullmatch(name)
    if match is None:
        return None
    return "store" if match[1] == "store" else "memory"


def workspace_dir(root: Path, session_id: str) -> Path:
    """The workspace directory of ``session_id`` under ``root`` (not created).

    ``root`` is a store's namespace directory. Raises ``InvalidSessionId``
    unless the id is 8-128 url-safe token characters, so no id can name
    ``..``, a path with ``/`` or a hidden file.
    """
    if not is_workspace_name(session_id):
        raise InvalidSessionId(
            f"session id {session_id[:40]!r} cannot name a workspace: session ids are "
            "8-128 characters of A-Z, a-z, 0-9, '-' and '_'"
        )
    return root / session_id
