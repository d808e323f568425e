"""Context assembly: stored history → upstream messages with synthesized markers."""

from __future__ import annotations

from protocol.assembly import (
    BARGED_IN_NOTE,
    CANCELLED_NOTE,
    Message,
    assemble,
    assistant_text,
    decode_history_item,
    encode_history_item,
    forgetting,
    is_note,
    results_message,
)
from protocol.calls import ToolCall, ToolResult, encode_call, encode_results, result_payload
from protocol.events import (
    Call,
    Cancelled,
    Context,
    Forget,
    Forgotten,
    Respond,
    Result,
    Think,
    User,
)
from protocol.prompt import ToolSpec, render_tools, system_prompt

CALL = encode_call(ToolCall(name="read", args={"path": "main.py"}))
RESULTS = encode_results([ToolResult(tool="read", status="success", content="print(1)")])


def test_the_seeds_storage_example_assembles_as_the_seed_shows() -> None:
    history = [
        User(content="What's in main.py?"),
        Think(content="analyzing data"),
        Call(content=CALL),
        Result(content=RESULTS, payload=result_payload([])),
    ]
    assert assemble(history) == [
        Message("user", "What's in main.py?"),
        Message("assistant", f"<think>analyzing data</think>\n\n<execute>\n[{CALL}]\n</execute>"),
        Message("user", f"<results>\n{RESULTS}\n</results>"),
    ]


def test_a_full_turn_then_a_new_user_message() -> None:
    history = [
        User(content="hi"),
        Think(content="greet"),
        Respond(content="Hello!"),
        User(content="again"),
    ]
    messages = assemble(history)
    # The finished answer gets the <end> the model wrote; the new message follows.
    assert messages[1] == Message("assistant", "<think>greet</think>\n\nHello!\n<end>")
    assert messages[2] == Message("user", "again")


def test_calls_of_one_step_share_one_execute_block_in_order() -> None:
    other = encode_call(ToolCall(name="list", args={}))
    text = assistant_text([Call(content=CALL), Call(content=other)])
    assert text == f"<execute>\n[{CALL},\n{other}]\n</execute>"


def test_split_chunks_are_joined() -> None:
    text = assistant_text([Think(content="a"), Think(content="b"), Respond(content="c")])
    assert text == "<think>ab</think>\n\nc"


def test_cancelled_becomes_a_note_to_the_model() -> None:
    history = [User(content="long task"), Respond(content="Start"), Cancelled(content="x")]
    messages = assemble(history)
    assert messages[-2] == Message("assistant", "Start")
    assert messages[-1] == Message("user", CANCELLED_NOTE)


def test_a_barge_in_tells_the_model_how_much_of_its_answer_was_heard() -> None:
    history = [
        User(content="tell me a story"),
        Respond(content="Once upon a time"),
        Cancelled(content="x", reason="barge_in", heard_ms=1250),
    ]
    note = assemble(history)[-1]
    assert note == Message("user", BARGED_IN_NOTE.format(seconds=1.25))
    assert "after hearing 1.2 s of its audio" in note.content
    assert is_note(note) and is_note(Message("user", CANCELLED_NOTE))
    assert not is_note(Message("user", "(The user is here.)"))


def test_results_message_wraps_the_results_json() -> None:
    assert results_message("[]").content == "<results>\n[]\n</results>"


def test_history_items_round_trip() -> None:
    for item in (User(content="u"), Call(content=CALL), Cancelled(content="")):
        assert decode_history_item(encode_history_item(item)) == item


def test_system_prompt_teaches_markers_and_lists_tools() -> None:
    spec = ToolSpec(
        name="read",
        description="Read a file.",
        parameters={"type": "object", "properties": {"path": {"type": "string"}}},
    )
    prompt = system_prompt([spec], "Be brief.")
    for marker in ("<think>", "<execute>", "</execute>", "<results>", "<end>"):
        assert marker in prompt
    assert "- read: Read a file." in prompt
    assert '"path"' in prompt
    assert prompt.rstrip().endswith("Be brief.")
    assert "No tools are available" in render_tools([])


def test_context_messages_keep_their_place_role_and_the_turn_ends_around_them() -> None:
    """A ``context`` is a message of its role where it was added: after a finished
    answer that answer keeps its ``<end>``; added while the turn waited for its calls,
    the step stays open for its results; an assistant line reads as an answer."""
    history = [
        User(content="hi", seq=1),
        Respond(content="Hello!", seq=2),
        Context(role="system", content="Speak French now.", seq=4),
        Context(role="assistant", content="Bonjour.", seq=5),
        User(content="list", seq=6),
        Call(content=CALL, seq=7),
        Context(role="user", content="(the user is waiting)", seq=8),
        Result(content=RESULTS, payload=result_payload([]), seq=9),
    ]
    assert assemble(history) == [
        Message("user", "hi"),
        Message("assistant", "Hello!\n<end>"),
        Message("system", "Speak French now.", context=True),
        Message("assistant", "Bonjour.\n<end>", context=True),
        Message("user", "list"),
        Message("assistant", f"<execute>\n[{CALL}]\n</execute>"),
        Message("user", "(the user is waiting)", context=True),
        Message("user", f"<results>\n{RESULTS}\n</results>"),
    ]
    assert decode_history_item(encode_history_item(history[2])) == history[2]
    # A forget names a context message by its seq, as it names a user message.
    forgotten = forgetting(history, Forget(first=4, last=4), idle=True)
    assert isinstance(forgotten, Forgotten)
    messages = assemble([*history, forgotten])
    assert Message("system", "Speak French now.", context=True) not in messages
    assert messages[1] == Message("assistant", "Hello!\n<end>")


def test_a_context_message_is_no_turn_when_history_is_cut_to_a_budget() -> None:
    """The latest turn is kept whole under a budget: a user context added while its
    tools ran does not make the user's own message before it look like an old one."""
    from protocol.budget import fit

    history = [
        User(content="old " * 400, seq=1),
        Respond(content="ok", seq=2),
        User(content="the question " * 200, seq=3),
        Call(content=CALL, seq=4),
        Context(role="user", content="(still there?)", seq=5),
    ]
    kept = fit(assemble(history), budget=300)
    assert any(m.role == "user" and m.content.endswith("the question " * 200) for m in kept)
    assert not any("old old" in m.content for m in kept)  # the older turn went
