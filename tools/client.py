"""Client-side tools: tools a session's client declares and runs itself.

A client declares them with a ``configure`` frame (``protocol.configuration.
ClientToolSpec``: name, description, JSON Schema of the args). The model sees
them in the session's prompt next to the server tools; when it calls one, the
gateway checks the args against the schema (``tools.validation``) and, if they
fit, sends the call to the client (``runs_on: "client"``) and waits for its
``tool_result``. ``ClientTools`` is the turn machine's ``ClientToolRouter``;
the waiting itself is the turn machine's job (``protocol.turn``), not this
module's: there is no ``run`` here because nothing here runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.calls import ToolCall
from protocol.configuration import ClientToolSpec
from protocol.prompt import ToolSpec

from .allowlist import AllowList
from .schema import describe_args
from .validation import ArgsValidator

__all__ = ["ClientTools", "schema_problem"]


class ClientTools:
    """The client tools of one session (only those its key's ``allowed`` list lets it call).

    Raises ``ValueError`` naming the tool when a declared schema is not a
    valid JSON Schema of an object: a ``configure`` that declares it is refused.
    """

    def __init__(self, specs: Sequence[ClientToolSpec], allowed: AllowList | None = None) -> None:
        self.declared = tuple(specs)
        self._validators: dict[str, ArgsValidator] = {}
        self._specs: list[ToolSpec] = []
        for spec in specs:
            try:
                validator = ArgsValidator(spec.parameters)
            except ValueError as exc:
                raise ValueError(f"tools: {spec.name!r} parameters: {exc}") from None
            if allowed is not None and not allowed.allows(spec.name):
                continue  # not listed, and a call to it is refused where calls run
            self._validators[spec.name] = validator
            self._specs.append(ToolSpec(spec.name, spec.description, validator.schema))

    def __len__(self) -> int:
        return len(self._validators)

    def runs_on_client(self, name: str) -> bool:
        return name in self._validators

    def check_args(self, call: ToolCall) -> str | None:
        validator = self._validators.get(call.name)
        if validator is None:
            return f"{call.name!r} is not a client tool of this session"
        problem = validator.explain(call.args)
        if problem is None:
            return None
        return (
            f"invalid args for {call.name!r}: {problem}. "
            f"Send args as a JSON object with: {describe_args(validator.schema)}."
        )

    def specs(self) -> list[ToolSpec]:
        """What the prompt lists for them (after the server tools)."""
        return list(self._specs)


def schema_problem(specs: Sequence[ClientToolSpec]) -> str | None:
    """Why one of ``specs``' parameters is not a usable JSON Schema (naming the tool), or None.

    Checked where a configuration is made or changed, so a bad one is the
    caller's ``bad_frame`` (HTTP 400) rather than a session that cannot be set up.
    """
    try:
        ClientTools(specs)
    except ValueError as exc:
        return str(exc)
    return None
