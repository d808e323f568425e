"""The command table: every client message has a place, and each command runs its method."""

from __future__ import annotations

import typing

from gateway.sessions.commands import COMMANDS, CONNECTION_MESSAGES, FORWARDED, dispatch
from protocol.configuration import ConfigChange
from protocol.events import (
    Approve,
    Cancel,
    ClientMessage,
    Commit,
    Configure,
    Error,
    Played,
    ToolResultMessage,
    UserMessage,
)


class Recorder:
    """A ``SessionCommands`` that writes down what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.heard_all: list[tuple[str, str]] = []

    def start_turn(self, text: str) -> Error | None:
        self.calls.append(("start_turn", text))
        return None

    def cancel_turn(self) -> Error | None:
        self.calls.append(("cancel_turn", None))
        return Error(code="no_turn", content="nothing to cancel")

    def tool_result(self, answer: ToolResultMessage) -> Error | None:
        self.calls.append(("tool_result", answer.id))
        return None

    async def configure(self, change: ConfigChange) -> Error | None:
        self.calls.append(("configure", change.instructions))
        return None

    def commit_audio(self) -> Error | None:
        self.calls.append(("commit_audio", None))
        return None

    def played(self, report: Played) -> Error | None:
        self.calls.append(("played", report.ms))
        return None

    def heard(self, message: object, refused: Error | None) -> None:
        self.heard_all.append((type(message).__name__, refused.code if refused else ""))

    def approve(self, decision: Approve) -> Error | None:
        self.calls.append(("approve", decision.id))
        return None


def test_every_client_message_is_a_command_or_the_connections_own() -> None:
    """A new message type with no row (and not the connection's) fails here."""
    kinds = set(typing.get_args(ClientMessage))
    assert kinds == set(COMMANDS) | set(CONNECTION_MESSAGES)
    assert not set(COMMANDS) & set(CONNECTION_MESSAGES)


def test_voice_commands_run_where_the_microphone_is() -> None:
    assert Commit not in FORWARDED
    assert set(FORWARDED) == {UserMessage, Cancel, ToolResultMessage, Configure, Played, Approve}


async def test_dispatch_runs_each_commands_method_and_returns_its_refusal() -> None:
    target = Recorder()
    assert await dispatch(UserMessage(content="hi"), target) is None
    refusal = await dispatch(Cancel(), target)
    assert isinstance(refusal, Error) and refusal.code == "no_turn"
    await dispatch(ToolResultMessage("call_1", "success", 1), target)
    await dispatch(Configure(instructions="Be brief."), target)
    await dispatch(Commit(), target)
    await dispatch(Played(seq=3, ms=120), target)
    await dispatch(Approve("call_2", "d" * 64, "allow"), target)
    assert target.calls == [
        ("start_turn", "hi"),
        ("cancel_turn", None),
        ("tool_result", "call_1"),
        ("configure", "Be brief."),
        ("commit_audio", None),
        ("played", 120),
        ("approve", "call_2"),
    ]
    # Every command is heard after it ran, with its refusal (what a recording keeps).
    assert target.heard_all == [
        ("UserMessage", ""),
        ("Cancel", "no_turn"),
        ("ToolResultMessage", ""),
        ("Configure", ""),
        ("Commit", ""),
        ("Played", ""),
        ("Approve", ""),
    ]


def test_only_configure_needs_an_api_key_and_only_a_message_starts_a_turn() -> None:
    assert [k for k, spec in COMMANDS.items() if spec.trusted] == [Configure]
    assert [k for k, spec in COMMANDS.items() if spec.turn] == [UserMessage]


def test_only_approve_needs_the_right_to_approve() -> None:
    assert [k for k, spec in COMMANDS.items() if spec.approving] == [Approve]
