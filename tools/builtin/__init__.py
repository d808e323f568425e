"""The built-in tools and the factories that assemble them.

File tools are always offered; ``shell`` only when the operator passes
``enable_shell=True``, because it is the one tool the workspace sandbox does
not confine.
"""

from __future__ import annotations

from typing import Any

from tools.base import Tool
from tools.registry import Registry

from .files import EditTool, ReadTool, WriteTool
from .listing import FindTool, ListTool
from .search import SearchTool
from .shell import ShellTool

__all__ = [
    "EditTool",
    "FindTool",
    "ListTool",
    "ReadTool",
    "SearchTool",
    "ShellTool",
    "WriteTool",
    "builtin_tools",
    "default_registry",
]


def builtin_tools(*, enable_shell: bool = False) -> list[Tool[Any]]:
    """Fresh instances of the built-ins: read, write, edit, list, find, search (+ shell)."""
    tools: list[Tool[Any]] = [
        ReadTool(),
        WriteTool(),
        EditTool(),
        ListTool(),
        FindTool(),
        SearchTool(),
    ]
    if enable_shell:
        tools.append(ShellTool())
    return tools


def default_registry(*, enable_shell: bool = False) -> Registry:
    """A registry of the built-in tools; ``shell`` only with ``enable_shell=True``.

    It lives here, not in ``tools.registry``, so imports point one way: the
    built-ins use the registry's module, the registry knows nothing of them.
    """
    return Registry(builtin_tools(enable_shell=enable_shell))
