"""Tools described by a JSON Schema instead of a msgspec Struct.

Built-ins declare their args as a Struct, so one declaration gives the schema
and the typed value. Tools that live outside the gateway (an MCP server, an
HTTP endpoint) arrive with a JSON Schema written by someone else, so their
args stay a plain ``dict`` and are checked against that schema by
``tools.tenant_schema`` before the call leaves the gateway: the model learns
which field is wrong from us, not from a remote stack trace. That checker is
bounded in time whatever the schema, as a client tool's is: an MCP server may
be a third party's, and ``jsonschema``, which checked these before, held the
node 0.5 s on a backtracking ``pattern``, 2.7 s (and 200 MB) on ``anyOf``s 16
levels deep through ``$ref``, and failed the turn on a ``$ref`` loop.
"""

from __future__ import annotations

import abc
from typing import Any

from .base import ToolContext
from .secrets import Secrets
from .tenant_schema import TenantSchema

__all__ = ["DescribedTool"]


class DescribedTool(abc.ABC):
    """One tool whose args are a JSON object checked against ``parameters``.

    Subclasses set ``name``, ``description`` and ``parameters`` (a JSON Schema
    object) in ``__init__`` via ``super().__init__`` and implement ``run``,
    which follows the same contract as ``Tool.run``: return a JSON value, raise
    ``ToolFailure`` with a message for the model, let ``CancelledError`` through.
    """

    journaled = False
    require_approval = False
    """Its calls wait for a user's approve (``require_approval = true`` in its section)."""
    background = False
    """Its calls do not block the turn (``background = true`` in its section)."""
    secrets: Secrets | None = None
    """What the gateway holds for it (headers, environment values): the executor
    scrubs them from its results (``tools.secrets``)."""

    def __init__(self, name: str, description: str, parameters: dict[str, Any]) -> None:
        self.name = name
        self.description = description
        # Raises ValueError for a schema that is not valid JSON Schema: at startup.
        self.validator = TenantSchema(parameters)
        self.parameters = self.validator.schema

    @abc.abstractmethod
    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        """Do the work; ``args`` already matches ``parameters``."""
