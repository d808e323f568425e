"""Tools the model can call: interface, registry, parallel executor, sandboxed built-ins.

The gateway builds a ``Registry`` (usually ``default_registry()``), renders
``registry.specs()`` into the system prompt, and hands every ``<execute>``
batch to ``Executor.run_batch`` with the session's ``ToolContext``. Nothing
here imports ``gateway``; ``protocol`` supplies ``ToolCall``, ``ToolResult``
and ``ToolSpec``.
"""

from .base import Limits, Tool, ToolContext, ToolFailure
from .builtin import builtin_tools, default_registry
from .executor import Executor
from .registry import InvalidArgs, Registry, UnknownTool

__all__ = [
    "Executor",
    "InvalidArgs",
    "Limits",
    "Registry",
    "Tool",
    "ToolContext",
    "ToolFailure",
    "UnknownTool",
    "builtin_tools",
    "default_registry",
]
