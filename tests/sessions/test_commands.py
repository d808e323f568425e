"""The command table: every client message has a place, and each command runs its method."""

from __future__ import annotations

import typing
from collections.abc import Sequence

import msgspec
import pytest

from gateway.sessions.commands import (
    COMMANDS,
    CONNECTION_MESSAGES,
    FORWARDED,
    CommandSpec,
    admit,
    dispatch,
)
from gateway.upstream.base import AudioIn, VoiceConfig
from protocol.configuration import ConfigChange
from protocol.events import (
    Approve,
    Cancel,
    ClearAudio,
    ClientMessage,
    Commit,
    Configure,
    ContextMessage,
    End,
    Error,
    Played,
    ReplyNow,
    ToolResultMessage,
    User,
    UserMessage,
)
from protocol.turn_events import Action, Refuse, TurnInput


class Recorder:
    """A ``SessionCommands`` that writes down what it was asked (``feed`` echoes
    its input as the one action; a ``Cancel`` is refused as the machine would)."""

    closed = False
    voice: VoiceConfig | None = VoiceConfig(audio_in=AudioIn(turn_detection="none"))
    tool_max_output = 5

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.heard_all: list[tuple[str, str]] = []

    def feed(self, given: TurnInput) -> Sequence[Action]:
        if isinstance(given, Cancel):
            return [Refuse(Error(code="no_turn", content="nothing to cancel"))]
        if isinstance(given, UserMessage):
            return [User(content=given.content)]
        return [given]  # type: ignore[list-item]

    def perform(self, actions: Sequence[Action], *, interrupt: bool) -> Error | None:
        first = actions[0]
        if isinstance(first, Refuse):
            return first.error
        self.calls.append((type(first).__name__, interrupt))
        self.performed = first
        return None

    async def configure(self, change: ConfigChange) -> Error | None:
        self.calls.append(("configure", change.instructions))
        return None

    async def screen(self, message: object) -> object:
        return message

    def heard(self, message: object, refused: Error | None) -> None:
        self.heard_all.append((type(message).__name__, refused.code if refused else ""))


def test_every_client_message_is_a_command_or_the_connections_own() -> None:
    """A new message type with no row (and not the connection's) fails here."""
    kinds = set(typing.get_args(ClientMessage))
    assert kinds == set(COMMANDS) | set(CONNECTION_MESSAGES)
    assert not set(COMMANDS) & set(CONNECTION_MESSAGES)


def test_voice_commands_run_where_the_microphone_is() -> None:
    # Only voice stays where it is: a new command is forwarded unless it says otherwise.
    assert set(COMMANDS) - set(FORWARDED) == {Commit, ClearAudio}


async def test_dispatch_feeds_each_command_and_returns_its_refusal() -> None:
    target = Recorder()
    assert await dispatch(UserMessage(content="hi"), target) is None
    refusal = await dispatch(Cancel(), target)
    assert isinstance(refusal, Error) and refusal.code == "no_turn"
    await dispatch(ToolResultMessage("call_1", "success", "x" * 50), target)
    assert isinstance(target.performed, ToolResultMessage)
    assert "output truncated" in target.performed.content  # cut to tool_max_output
    await dispatch(Configure(instructions="Be brief."), target)
    await dispatch(Commit(), target)
    await dispatch(Played(seq=3, ms=120), target)
    await dispatch(Approve("call_2", "d" * 64, "allow"), target)
    assert target.calls == [
        ("User", False),
        ("ToolResultMessage", False),
        ("configure", "Be brief."),
        ("Commit", False),
        ("Played", False),
        ("Approve", False),
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


async def test_messages_and_tool_results_are_screened_first_and_a_blocked_one_runs_nothing() -> (
    None
):
    class Screening(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.screened: list[str] = []

        async def screen(self, message: object) -> object:
            self.screened.append(type(message).__name__)
            return None  # blocked by a checker (the guardrail event went out already)

    target = Screening()
    assert await dispatch(UserMessage(content="hi"), target) is None
    assert await dispatch(ToolResultMessage("call_1", "success", "x"), target) is None
    await dispatch(Played(seq=3, ms=120), target)
    assert target.screened == ["UserMessage", "ToolResultMessage"]
    assert target.calls == [("Played", False)]  # the blocked ones fed nothing
    assert target.heard_all == [("Played", "")]


async def test_a_refusal_and_the_confirming_event_name_the_command() -> None:
    target = Recorder()
    refusal = await dispatch(Cancel(id="c-7"), target)
    assert refusal is not None and refusal.reply_to == "c-7"
    await dispatch(UserMessage(content="hi", id="m-1"), target)
    assert isinstance(target.performed, User) and target.performed.reply_to == "m-1"
    target.voice = None
    refusal = await dispatch(Commit(id="k-2"), target)  # refused before the machine
    assert refusal is not None and (refusal.code, refusal.reply_to) == ("bad_frame", "k-2")
    target.closed = True
    refusal = await dispatch(UserMessage(content="late"), target)
    assert refusal is not None and refusal.reply_to is msgspec.UNSET


def test_a_command_is_confirmed_only_by_an_event_that_can_name_it() -> None:
    with pytest.raises(TypeError, match="reply_to"):
        CommandSpec("mark", None, confirms=End)


class Sender:
    def __init__(self, *, trusted: bool, may_approve: bool, draining: bool = False) -> None:
        self.trusted = trusted
        self.may_approve = may_approve
        self.draining = draining
        self.asked: list[str] = []

    async def admit_turn(self) -> Error | None:
        self.asked.append("admit_turn")
        return None

    async def record(self) -> Error | None:
        self.asked.append("record")
        return None


async def test_admit_checks_who_may_send_each_command_beside_its_row() -> None:
    token = Sender(trusted=False, may_approve=False)
    refusal = await admit(Configure(model="m", id="cfg"), token)
    assert refusal is not None and (refusal.code, refusal.reply_to) == ("forbidden", "cfg")
    refusal = await admit(Approve("call_1", "d" * 64, "allow"), token)
    assert refusal is not None and (refusal.code, refusal.reply_to) == ("forbidden", "call_1")
    assert await admit(UserMessage(content="hi"), token) is None
    assert token.asked == ["record", "admit_turn"]
    draining = Sender(trusted=True, may_approve=True, draining=True)
    refusal = await admit(UserMessage(content="hi", id="u"), draining)
    assert refusal is not None and (refusal.code, refusal.reply_to) == ("draining", "u")
    assert await admit(Cancel(), draining) is None  # only a new turn is refused while draining
    # context: a user's is anyone's; system and assistant speak for the app and the model.
    assert await admit(ContextMessage(role="user", content="x"), token) is None
    for role in ("system", "assistant"):
        refusal = await admit(ContextMessage(role=role, content="x", id="c"), token)
        assert refusal is not None and (refusal.code, refusal.reply_to) == ("forbidden", "c")
        assert f"a {role} message" in refusal.content
    refusal = await admit(Configure(model="m"), token)  # its own words, not a message's
    assert refusal is not None and "cannot send configure" in refusal.content
    refusal = await admit(ContextMessage(role="user", content="x", id="d"), draining)
    assert refusal is not None and (refusal.code, refusal.reply_to) == ("draining", "d")


def test_only_configure_needs_an_api_key_and_only_a_message_or_a_reply_starts_a_turn() -> None:
    assert [k for k, spec in COMMANDS.items() if spec.who == "api_key"] == [Configure]
    assert [k for k, spec in COMMANDS.items() if spec.turn] == [UserMessage, ReplyNow]


def test_only_approve_needs_the_right_to_approve_and_only_cancel_interrupts() -> None:
    assert [k for k, spec in COMMANDS.items() if spec.who == "approver"] == [Approve]
    assert [k for k, spec in COMMANDS.items() if spec.interrupts] == [Cancel]
