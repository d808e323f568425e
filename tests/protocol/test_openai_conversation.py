"""The OpenAI door's conversation, without sockets: client events in, commands out;
logged events in, OpenAI server events out (validated against the SDK's union)."""

from __future__ import annotations

import base64
import json
from typing import Any

from msgspec import UNSET
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from protocol.configuration import ClientToolSpec, SessionConfig
from protocol.events import (
    AudioCleared,
    Call,
    Cancel,
    Cancelled,
    ClearAudio,
    Configure,
    Configured,
    Context,
    ContextMessage,
    End,
    Error,
    Forget,
    Forgotten,
    Guardrail,
    Metric,
    ReplyNow,
    Respond,
    Result,
    SpeechStarted,
    SpeechStopped,
    Think,
    ToolResultMessage,
    Usage,
    User,
    UserMessage,
)
from protocol.openai_conversation import Conversation
from protocol.openai_events import decode_client
from protocol.openai_ids import Replay
from protocol.openai_items import KEPT_WEIGHT
from protocol.openai_speech import EARLY_SPEECH_MAX
from protocol.openai_typed import HELD_CHARS_MAX, HELD_MAX
from protocol.payloads import ResultPayload

SERVER: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
ROUTE = ("sim", "gpt-realtime-2.1")


def client(conv: Conversation, **event: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    emit = conv.client(decode_client(json.dumps(event)), model_route=ROUTE)
    for e in emit.events:
        SERVER.validate_python(e)
    return emit.commands, emit.events


def feed(conv: Conversation, *events: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in events:
        out += conv.gateway(event)
    for e in out:
        SERVER.validate_python(e)
    return out


def user_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


def test_session_update_becomes_configure_and_configured_session_events() -> None:
    conv = Conversation("s1", "gpt-realtime-2.1")
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    commands, events = client(
        conv,
        type="session.update",
        session={"type": "realtime", "instructions": "hi", "tools": [tool]},
    )
    assert events == []
    assert commands == [
        Configure(
            instructions="hi", tools=(ClientToolSpec(name="f", parameters={"type": "object"}),)
        )
    ]
    config = SessionConfig(instructions="hi")
    out = feed(conv, Configured(seq=1, config=config), Configured(seq=2, config=config))
    assert [e["type"] for e in out] == ["session.created", "session.updated"]
    assert out[0]["session"]["id"] == "s1"


def created(conv: Conversation) -> Conversation:
    """``conv`` once its session.created went out (a new session's first configured)."""
    feed(conv, Configured(seq=1, config=SessionConfig()))
    return conv


def test_a_user_item_is_shown_at_once_and_waits_for_response_create() -> None:
    conv = created(Conversation("s1", "m"))
    commands, events = client(conv, type="conversation.item.create", item=user_item("a"))
    assert commands == []
    assert [(e["type"], e["item"]["id"], e["previous_item_id"]) for e in events] == [
        ("conversation.item.added", "item_c_1", None),
        ("conversation.item.done", "item_c_1", None),
    ]
    assert events[1]["item"]["content"] == [{"type": "input_text", "text": "a"}]
    commands, _ = client(conv, type="response.create")
    # Named by the door (the client named no event): a refusal of it is known as its.
    assert commands == [UserMessage(content="a", id="~said1", item="item_c_1")]
    _, events = client(conv, type="response.create", event_id="e9")
    assert events[0]["type"] == "error" and events[0]["error"]["event_id"] == "e9"


def test_an_item_created_before_session_created_is_shown_after_it() -> None:
    conv = Conversation("s1", "m")
    assert client(conv, type="conversation.item.create", item=user_item("a")) == ([], [])
    out = feed(conv, Configured(seq=1, config=SessionConfig()))
    assert [e["type"] for e in out] == [
        "session.created",
        "conversation.item.added",
        "conversation.item.done",
    ]


def test_a_client_item_id_is_kept_through_the_log() -> None:
    """pipecat and LiveKit name every item they create; OpenAI keeps the name."""
    conv = created(Conversation("s1", "m"))
    item = {**user_item("y"), "id": "mine"}
    _, events = client(conv, type="conversation.item.create", previous_item_id="root", item=item)
    assert [e["item"]["id"] for e in events] == ["mine", "mine"]
    commands, _ = client(conv, type="response.create", event_id="c")
    assert commands == [UserMessage(content="y", id="c", item="mine")]
    logged = User(seq=2, content="y", reply_to="c", item="mine")
    assert feed(conv, logged) == []  # shown already: now it has its place in the log
    commands, _ = client(conv, type="conversation.item.delete", item_id="mine")
    assert commands == [Forget(first=2, last=2, id=UNSET)]
    _, events = client(conv, type="conversation.item.retrieve", item_id="mine")
    assert events[0]["item"]["content"][0]["text"] == "y"
    # Resumed (or another client of the session): the same id, from the log.
    again = feed(Conversation("s1", "m"), Configured(seq=1, config=SessionConfig()), logged)
    assert [e["item"]["id"] for e in again if "item" in e and e["type"] != "session.created"] == [
        "mine",
        "mine",
    ]


def test_a_client_item_id_out_of_bounds_or_in_use_is_refused() -> None:
    conv = created(Conversation("s1", "m"))
    client(conv, type="conversation.item.create", item={**user_item("y"), "id": "mine"})
    for iid, code in (("mine", "invalid_request_error"), ("x" * 65, "string_above_max_length")):
        _, events = client(
            conv, type="conversation.item.create", event_id="c", item={**user_item("z"), "id": iid}
        )
        error = events[0]["error"]
        assert (error["param"], error["code"], error["event_id"]) == ("item.id", code, "c")
    commands, _ = client(conv, type="response.create")
    assert commands == [UserMessage(content="y", id="~said1", item="mine")]  # nothing else


def test_a_held_item_deleted_before_response_create_never_reaches_the_model() -> None:
    conv = created(Conversation("s1", "m"))
    client(conv, type="conversation.item.create", item={**user_item("x"), "id": "a"})
    client(conv, type="conversation.item.create", item={**user_item("y"), "id": "b"})
    commands, events = client(conv, type="conversation.item.delete", item_id="a")
    assert commands == [] and events[0] == {**events[0], "type": "conversation.item.deleted"}
    assert events[0]["item_id"] == "a"
    _, events = client(conv, type="conversation.item.retrieve", item_id="a")
    assert events[0]["error"]["code"] == "item_retrieve_invalid_item_id"
    commands, _ = client(conv, type="response.create", event_id="c")
    assert commands == [UserMessage(content="y", id="c", item="b")]


def test_a_text_turn_streams_one_message_and_ends_with_usage() -> None:
    conv = Conversation("s1", "m")
    out = feed(
        conv,
        User(seq=1, content="hi"),
        Respond(seq=2, content="Hel"),
        Respond(seq=3, content="lo"),
        End(seq=4),
        Metric(seq=5, step=Usage(input=7, output=2), total=Usage(input=7, output=2)),
    )
    kinds = [e["type"] for e in out]
    assert kinds[:2] == ["conversation.item.added", "conversation.item.done"]
    assert kinds.count("response.output_text.delta") == 2
    done = out[-1]
    assert done["type"] == "response.done"
    assert done["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert done["response"]["usage"]["total_tokens"] == 9
    assert [e["event_id"] for e in out][-1] == "evt_5_" + out[-1]["event_id"].split("_")[2]


def test_a_chunk_of_an_open_message_is_the_same_delta_as_the_general_path_makes() -> None:
    """``gateway``'s hot path (a chunk of an open message: one delta) against ``_gateway``."""
    for audio_out in (False, True):
        fast, general = (Conversation("s1", "m", audio_out=audio_out) for _ in range(2))
        opening = [
            User(seq=1, content="hi"),
            Think(seq=2, content="hm"),
            Respond(seq=3, content="He"),
        ]
        assert feed(fast, *opening) == feed(general, *opening)
        chunks = [Respond(seq=4, content="l"), Respond(seq=5, content="lo", seq_from=4)]
        deltas = feed(fast, *chunks)
        expected: list[dict[str, Any]] = []
        for chunk in chunks:
            general.ids.seq, general.ids.n = chunk.seq, 0
            expected += general._gateway(chunk)
            general.ids.seq = 0
        assert deltas == expected
        assert [e["event_id"] for e in deltas] == ["evt_4_1", "evt_5_1"]
        assert feed(fast, Think(seq=6, content="x")) == []  # reasoning is not shown
        end = [
            End(seq=7),
            Metric(seq=8, step=Usage(input=1, output=2), total=Usage(input=1, output=2)),
        ]
        assert feed(fast, *end) == feed(general, Think(seq=6, content="x"), *end)


def test_a_client_call_is_a_function_call_item_and_its_output_a_tool_result() -> None:
    conv = created(Conversation("s1", "m"))
    call = Call(seq=3, content='{"name": "f", "args": {"x": 1}}', id="call_1", runs_on="client")
    out = feed(conv, User(seq=2, content="go"), call)
    args = next(e for e in out if e["type"] == "response.function_call_arguments.done")
    assert (args["name"], json.loads(args["arguments"]), args["call_id"]) == (
        "f",
        {"x": 1},
        "call_1",
    )
    assert out[-1]["type"] == "response.done"
    commands, shown = client(
        conv,
        type="conversation.item.create",
        item={"type": "function_call_output", "call_id": "call_1", "output": "42"},
    )
    # Shown at once, held for the create that answers it (OpenAI answers only then).
    assert commands == [] and [e["type"] for e in shown] == [
        "conversation.item.added",
        "conversation.item.done",
    ]
    iid = shown[0]["item"]["id"]
    commands, events = client(conv, type="response.create", response={"metadata": {"k": "v"}})
    assert commands == [ToolResultMessage("call_1", "success", "42", item=iid)] and events == []
    # The answer it starts is that create's response: it carries its metadata (LiveKit's
    # generate_reply waits for the response.created naming its create).
    out = feed(conv, Respond(seq=5, content="It is 42."))
    started = next(e for e in out if e["type"] == "response.created")
    assert started["response"]["metadata"] == {"k": "v"}
    # A gateway (server) tool's call is not the client's: nothing is shown.
    assert feed(conv, Call(seq=9, content='{"name": "g", "args": {}}', id="c2")) == []


def test_a_function_call_output_named_by_its_client_is_shown_by_that_name() -> None:
    conv = created(Conversation("s1", "m"))
    call = Call(seq=3, content='{"name": "f", "args": {}}', id="call_1", runs_on="client")
    feed(conv, User(seq=2, content="go"), call)
    output = {"type": "function_call_output", "id": "out_1", "call_id": "call_1", "output": "42"}
    _, shown = client(conv, type="conversation.item.create", item=output)
    assert [(e["type"], e["item"]["id"]) for e in shown] == [
        ("conversation.item.added", "out_1"),
        ("conversation.item.done", "out_1"),
    ]
    commands, _ = client(conv, type="response.create")
    assert commands == [ToolResultMessage("call_1", "success", "42", item="out_1")]
    content = '[{"tool": "f", "status": "success", "content": "42"}]'
    payload = ResultPayload(tools_executed=1, success_count=1, failure_count=0)
    result = Result(seq=4, content=content, payload=payload, id="call_1", item="out_1")
    assert feed(conv, result) == []  # shown when created: not again
    # A client that resumes (a fresh conversation over the log) is shown it by that name.
    again = created(Conversation("s1", "m"))
    feed(again, User(seq=2, content="go"), call)
    out = feed(again, result)
    assert [(e["type"], e["item"]["id"]) for e in out] == [
        ("conversation.item.added", "out_1"),
        ("conversation.item.done", "out_1"),
    ]


def test_a_function_call_output_no_create_asks_for_goes_at_the_grace_or_the_turns_end() -> None:
    """Held outputs go when the door's grace is over (``take_outputs``: a client that never
    sends response.create, pipecat's run_llm=False, is answered as before), and a turn
    that ends first (cancelled) sends them at once: the session refuses them, and its
    error names the output's event, as for an output sent after its turn."""
    conv = created(Conversation("s1", "m"))
    call = Call(seq=3, content='{"name": "f", "args": {}}', id="call_1", runs_on="client")
    feed(conv, User(seq=2, content="go"), call)
    output = {"type": "function_call_output", "id": "out_1", "call_id": "call_1", "output": "1"}
    client(conv, type="conversation.item.create", item=output)
    assert conv.requests.typed.take_outputs() == [
        ToolResultMessage("call_1", "success", "1", item="out_1")
    ]
    conv = created(Conversation("s1", "m"))
    feed(conv, User(seq=2, content="go"), call)
    client(conv, type="conversation.item.create", item=output, event_id="c_out")
    feed(conv, Cancelled(seq=4, content="cancelled"))
    assert conv.take_due() == [ToolResultMessage("call_1", "success", "1", item="out_1")]
    out = feed(conv, Error(code="unknown_call", content="no call waits", reply_to="call_1"))
    assert out[0]["error"]["event_id"] == "c_out"


def test_cancel_and_unsupported_events() -> None:
    conv = Conversation("s1", "m")
    commands, _ = client(conv, type="response.cancel")
    assert commands == [Cancel()]
    out = feed(conv, User(seq=1, content="x"), Respond(seq=2, content="a"), Cancelled(seq=3))
    assert out[-1]["response"]["status"] == "cancelled"
    realtime = {"type": "realtime"}
    _, events = client(
        conv, type="session.update", event_id="u", session=realtime | {"max_output_tokens": 5}
    )
    assert "max_output_tokens" in events[0]["error"]["message"]
    _, events = client(conv, type="session.update", session=realtime | {"model": "other"})
    assert events[0]["error"]["param"] == "session.model"
    # An event's type, and session.type, are required (the SDK's types, and OpenAI's
    # service, refuse them left out).
    _, events = client(conv, event_id="n")
    assert (events[0]["error"]["param"], events[0]["error"]["event_id"]) == ("type", "n")
    commands, events = client(conv, type="session.update", event_id="t", session={})
    error = events[0]["error"]
    assert commands == [] and (error["code"], error["param"]) == (
        "missing_required_parameter",
        "session.type",
    )


def test_replayed_events_have_the_same_ids() -> None:
    log = [User(seq=1, content="x"), Respond(seq=2, content="a"), End(seq=3)]
    first = feed(Conversation("s", "m"), *log)
    again = feed(Conversation("s", "m"), *log)
    assert first == again
    assert Conversation.position(first[-1]["event_id"]) is not None


def test_an_item_inserted_mid_conversation_is_refused() -> None:
    conv = created(Conversation("s1", "m"))
    feed(conv, User(seq=2, content="x"))
    for previous in ("item_0", "root"):  # root: the beginning, before item_2
        _, events = client(
            conv, type="conversation.item.create", previous_item_id=previous, item=user_item("y")
        )
        assert events[0]["error"]["param"] == "previous_item_id"
    _, events = client(
        conv, type="conversation.item.create", previous_item_id="item_2", item=user_item("y")
    )
    assert [e["type"] for e in events] == ["conversation.item.added", "conversation.item.done"]


def test_an_error_names_the_event_its_command_came_from_with_two_in_flight() -> None:
    """OpenAI's ``error.event_id`` comes from the gateway's ``reply_to``: the client's
    event_id travels as the command's id, so a late refusal names the right event."""
    conv = Conversation("s1", "m")
    commands, _ = client(conv, type="response.cancel", event_id="e_cancel")
    assert commands == [Cancel(id="e_cancel")]
    client(conv, type="conversation.item.create", item=user_item("a"))
    commands, _ = client(conv, type="response.create", event_id="e_create")
    assert commands == [UserMessage(content="a", id="e_create", item="item_c_1")]
    # The cancel's refusal arrives after the create was sent.
    out = feed(conv, Error(code="no_turn", content="no turn is running", reply_to="e_cancel"))
    assert out[-1]["error"]["event_id"] == "e_cancel"
    # A reply naming no command of this client falls back to the newest command.
    commands, _ = client(conv, type="response.cancel", event_id="e_again")
    out = feed(conv, Error(code="no_turn", content="no turn", reply_to="call_3"))
    assert out[-1]["error"]["event_id"] == "e_again"


def test_delete_forgets_an_items_logged_events_and_the_logged_forgotten_deletes_it() -> None:
    conv = Conversation("s1", "m")
    feed(
        conv,
        User(seq=1, content="hi"),
        Respond(seq=2, content="Hel"),
        Respond(seq=3, content="lo"),
        End(seq=4),
        Metric(seq=5, step=Usage(input=1, output=1), total=Usage(input=1, output=1)),
    )
    commands, events = client(conv, type="conversation.item.delete", item_id="msg_1_1_0")
    assert (commands, events) == ([Forget(first=2, last=3)], [])
    commands, _ = client(conv, type="conversation.item.delete", item_id="item_1", event_id="d")
    assert commands == [Forget(first=1, last=1, id="d")]
    out = feed(conv, Forgotten(seq=6, first=1, last=1, reply_to="d"))
    assert out == [
        {"type": "conversation.item.deleted", "event_id": "evt_6_1", "item_id": "item_1"}
    ]
    # Gone: neither deleted again nor retrievable; the next item follows the answer.
    _, events = client(conv, type="conversation.item.delete", item_id="item_1", event_id="e")
    assert events[0]["error"]["event_id"] == "e"
    assert events[0]["error"]["code"] == "item_delete_invalid_item_id"
    added = feed(conv, User(seq=7, content="again"))[0]
    assert added["previous_item_id"] == "msg_1_1_0"


def test_a_function_call_is_not_deleted() -> None:
    conv = Conversation("s1", "m")
    call = Call(seq=3, content='{"name": "f", "args": {}}', id="call_1", runs_on="client")
    feed(conv, User(seq=1, content="go"), call)
    commands, events = client(conv, type="conversation.item.delete", item_id="fc_3")
    assert commands == [] and "function calls" in events[0]["error"]["message"]


def test_a_failure_on_the_servers_side_is_a_server_error() -> None:
    """OpenAI's service marks its own failures ``server_error``; the door marked every
    error ``invalid_request_error``, so a client retrying server errors never did."""
    conv = Conversation("s1", "m")
    feed(conv, User(seq=1, content="hi"), Respond(seq=2, content="Hel"))
    out = feed(conv, Error(seq=3, code="upstream", content="the provider went away"))
    assert out[-2]["response"]["status"] == "failed"
    assert (out[-1]["error"]["type"], out[-1]["error"]["code"]) == ("server_error", "upstream")
    client(conv, type="response.cancel", event_id="e_cancel")
    out = feed(conv, Error(code="no_turn", content="no turn", reply_to="e_cancel"))
    assert out[-1]["error"]["type"] == "invalid_request_error"


def test_a_message_refused_for_a_running_turn_is_held_again_named_or_not() -> None:
    """The session refuses a message while a turn runs (``turn_active``, naming the
    command's id): the door holds the text again for the next response.create, whether
    the client named its event (the id is its event_id) or not (the door's own id)."""
    for event_id in ("e_create", None):
        conv = Conversation("s1", "m")
        client(conv, type="conversation.item.create", item=user_item("late"))
        named = {"event_id": event_id} if event_id else {}
        commands, _ = client(conv, type="response.create", **named)
        (said,) = commands
        out = feed(conv, Error(code="turn_active", content="a turn runs", reply_to=said.id))
        assert out[-1]["error"]["code"] == "conversation_already_has_active_response"
        assert out[-1]["error"]["event_id"] == event_id  # never the door's own id
        commands, _ = client(conv, type="response.create")
        assert [c.content for c in commands] == ["late"]


def test_a_response_create_after_a_refused_call_output_is_answered() -> None:
    """A call's output sent as its turn was cancelled is refused by the session; the
    response.create after it was swallowed as the turn's going on (no response, no
    error). If the door saw the turn end first, the create starts a turn of its own
    (the model answers the conversation as it is, as OpenAI's service does); if not,
    the session's refusal of the output names the create."""
    call = Call(seq=2, content='{"name": "f", "args": {}}', id="call_1", runs_on="client")
    output = {"type": "function_call_output", "call_id": "call_1", "output": "{}"}
    for cancel_seen_first in (True, False):
        conv = Conversation("s1", "m")
        feed(conv, User(seq=1, content="go"), call)
        if cancel_seen_first:
            feed(conv, Cancelled(seq=3, content="cancelled"))
        client(conv, type="conversation.item.create", event_id="c_out", item=output)
        commands, events = client(conv, type="response.create", event_id="c_go")
        if cancel_seen_first:
            assert commands == [ReplyNow(id="c_go")] and events == []
            continue
        assert events == []  # the turn goes on, as far as the door knows
        feed(conv, Cancelled(seq=3, content="cancelled"))
        events = feed(conv, Error(code="unknown_call", content="gone", reply_to="call_1"))
        refusals = [e["error"]["event_id"] for e in events if e["type"] == "error"]
        assert "c_go" in refusals, events


def test_a_commit_counts_only_the_audio_heard_since_the_client_commits() -> None:
    # Audio heard under server VAD is the VAD's: switched to turn_detection none, a
    # commit takes only what came after, whichever path it came by (an append, or a
    # fast path's ``heard``: the door's, a WebRTC microphone's).
    conv = Conversation("s1", "gpt-realtime-2.1")
    second = bytes(2 * 24000)
    client(conv, type="input_audio_buffer.append", audio=base64.b64encode(second).decode())
    manual = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    client(conv, type="session.update", session=manual)
    commands, events = client(conv, type="input_audio_buffer.commit", event_id="c1")
    assert commands == [] and events[0]["error"]["code"] == "input_audio_buffer_commit_empty"
    conv.requests.heard(len(second) // 5)  # 200 ms by a fast path
    commands, events = client(conv, type="input_audio_buffer.commit", event_id="c2")
    assert events == [] and len(commands) == 1  # the commit goes on


def test_a_refused_clear_discards_nothing_and_a_done_one_what_it_found() -> None:
    """Gemini cannot discard audio it was sent: its clear is refused. The door had
    zeroed its count anyway, and the next commit said the buffer held 0 ms."""
    conv = Conversation("s1", "gpt-realtime-2.1")
    manual = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    client(conv, type="session.update", session=manual)
    conv.requests.hearing = True  # the configured: input audio is taken
    conv.requests.heard(2 * 24000 * 3 // 5)  # 600 ms
    commands, _ = client(conv, type="input_audio_buffer.clear", event_id="x1")
    assert commands == [ClearAudio(id="x1")]
    feed(conv, Error(code="unsupported", content="no clear here", reply_to="x1"))
    commands, events = client(conv, type="input_audio_buffer.commit", event_id="c1")
    assert events == [] and len(commands) == 1  # the 600 ms are still there
    conv.requests.heard(2 * 24000 * 3 // 5)
    client(conv, type="input_audio_buffer.clear", event_id="x2")
    conv.requests.heard(2 * 24000 // 20)  # 50 ms after the clear went
    assert [e["type"] for e in feed(conv, AudioCleared())] == ["input_audio_buffer.cleared"]
    _, events = client(conv, type="input_audio_buffer.commit", event_id="c2")
    assert "only has 50.00ms" in events[0]["error"]["message"]


def test_a_response_create_after_a_refused_commit_is_answered() -> None:
    """Turn detection off, a response.create after a commit is the commit's answer
    (swallowed, no error); when the session refuses the commit (a turn already runs),
    that create is answered with an error instead of left waiting, named or not."""
    manual = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    second = base64.b64encode(bytes(2 * 24000)).decode()
    for commit_id in ("c_commit", None):
        conv = Conversation("s1", "gpt-realtime-2.1")
        client(conv, type="session.update", session=manual)
        client(conv, type="input_audio_buffer.append", audio=second)
        named = {"event_id": commit_id} if commit_id else {}
        commands, _ = client(conv, type="input_audio_buffer.commit", **named)
        _, events = client(conv, type="response.create", event_id="c_go")
        assert events == []  # the gateway answers the commit by itself
        refused = Error(code="turn_active", content="a turn runs", reply_to=commands[0].id)
        refusals = [e["error"]["event_id"] for e in feed(conv, refused) if e["type"] == "error"]
        assert "c_go" in refusals


def test_speech_ahead_of_its_event_waits_so_the_user_item_comes_first() -> None:
    """The model's speech is sent unlogged and overtakes the user's logged turn: its
    first piece (tagged with the user event) waits for it, so the client sees the
    committed user item before the response it answers, and the speech in order."""
    conv = Conversation("s1", "m", audio_out=True)
    feed(conv, SpeechStarted(seq=1, offset_ms=100))
    assert conv.audio(3, b"\x01\x00" * 480) == []  # tagged with seq 3, not yet seen
    assert conv.audio(3, b"\x02\x00" * 480) == []  # behind it
    kinds = [e["type"] for e in feed(conv, SpeechStopped(seq=2, offset_ms=900))]
    assert kinds == ["input_audio_buffer.speech_stopped"]
    out = feed(conv, User(seq=3, content="(speech 0.8 s)", source="audio"))
    kinds = [e["type"] for e in out]
    assert kinds.index("input_audio_buffer.committed") < kinds.index("conversation.item.added")
    assert kinds.index("conversation.item.added") < kinds.index("response.created")
    deltas = [e["delta"] for e in out if e["type"] == "response.output_audio.delta"]
    assert deltas == [b"\x01\x00" * 480, b"\x02\x00" * 480]
    # Once the response is open, speech goes at once.
    assert [e["type"] for e in conv.audio(4, b"\x03\x00")] == ["response.output_audio.delta"]


def test_speech_whose_event_never_comes_goes_in_its_order_past_the_bound() -> None:
    conv = Conversation("s1", "m", audio_out=True)
    piece = bytes(EARLY_SPEECH_MAX // 4)
    assert all(conv.audio(9, piece) == [] for _ in range(4))  # at the bound: held
    out = conv.audio(9, b"\x05\x00")
    deltas = [e["delta"] for e in out if e["type"] == "response.output_audio.delta"]
    assert deltas == [piece] * 4 + [b"\x05\x00"]
    assert out[0]["type"] == "response.created"


def test_speech_tagged_with_reasoning_goes_once_the_reasoning_is_logged() -> None:
    """Reasoning is not shown but is logged: speech tagged with a ``think`` event's
    seq goes as soon as that event is translated, not at the next shown one."""
    conv = Conversation("s1", "m", audio_out=True)
    feed(conv, User(seq=1, content="(speech 1.0 s)", source="audio"))
    assert conv.audio(2, b"\x01\x00") == []
    out = feed(conv, Think(seq=2, content="hmm"))
    assert [e["type"] for e in out][-1] == "response.output_audio.delta"
    assert [e["type"] for e in conv.audio(2, b"\x02\x00")] == ["response.output_audio.delta"]


USAGE = Usage(input=1, output=1)


def test_a_commit_whose_create_never_came_leaves_the_next_create_its_own() -> None:
    """A commit's answer swallows the response.create that follows it, but only for
    that turn: once another user turn is logged, or turn detection is back on, a bare
    response.create starts a turn of its own (with no new message)."""
    manual = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    vad = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    second = base64.b64encode(bytes(2 * 24000)).decode()
    for switch_to_vad in (False, True):
        conv = Conversation("s1", "gpt-realtime-2.1")
        client(conv, type="session.update", session=manual)
        client(conv, type="input_audio_buffer.append", audio=second)
        client(conv, type="input_audio_buffer.commit", event_id="c_commit")
        feed(conv, User(seq=1, content="(speech 1.0 s)", source="audio", reply_to="c_commit"))
        feed(conv, End(seq=2), Metric(seq=3, step=USAGE, total=USAGE))
        if switch_to_vad:
            client(conv, type="session.update", session=vad)
            feed(conv, Configured(seq=4, config=SessionConfig()))
        else:  # another turn, typed (by another of the session's clients), answered
            feed(
                conv, User(seq=4, content="hi"), End(seq=5), Metric(seq=6, step=USAGE, total=USAGE)
            )
        commands, events = client(conv, type="response.create", event_id="c_late")
        assert commands == [ReplyNow(id="c_late")] and events == []


def test_speech_tagged_with_an_event_not_shown_goes_before_the_next_one() -> None:
    """A connection joining a session mid-answer: its first frame (the log's head, not
    shown) may be what the speech is tagged with. The speech goes before the next
    event, so the response it opens is the one that event ends, and is done."""
    conv = Conversation("s1", "m", audio_out=True)
    assert conv.audio(7, b"\x01\x00" * 480) == []  # tagged 7: never translated here
    out = feed(conv, End(seq=8), Metric(seq=9, step=USAGE, total=USAGE))
    kinds = [e["type"] for e in out]
    assert kinds[0] == "response.created" and "response.output_audio.delta" in kinds
    assert kinds[-1] == "response.done" and out[-1]["response"]["status"] == "completed"


def test_what_waits_for_response_create_is_bounded() -> None:
    """A client creating messages and never asking for a response held them all, as
    much text as its frames carried (21 MiB each on this door): bounded now, refused
    before anything is kept, and response.create sends what was taken."""
    conv = created(Conversation("s1", "m"))
    _, events = client(
        conv, type="conversation.item.create", event_id="big", item=user_item("x" * HELD_CHARS_MAX)
    )
    assert [e["type"] for e in events] == ["conversation.item.added", "conversation.item.done"]
    _, events = client(conv, type="conversation.item.create", event_id="more", item=user_item("y"))
    assert events[0]["type"] == "error" and events[0]["error"]["event_id"] == "more"
    assert events[0]["error"]["param"] == "item.content"
    commands, _ = client(conv, type="response.create", event_id="c")
    assert [len(c.content) for c in commands] == [HELD_CHARS_MAX]
    conv = created(Conversation("s2", "m"))
    for n in range(HELD_MAX):
        client(conv, type="conversation.item.create", item=user_item(str(n)))
    _, events = client(conv, type="conversation.item.create", item=user_item("one more"))
    assert "wait for a response.create already" in events[0]["error"]["message"]


def test_an_unlogged_event_names_the_logged_event_it_was_sent_after() -> None:
    """A client resumes after the last event it saw, whichever: an unlogged one (a
    message shown when created, the model's speech) names the logged event before it."""
    conv = created(Conversation("s1", "m"))
    out = feed(conv, User(seq=2, content="x"), Respond(seq=3, content="a"))
    _, events = client(conv, type="conversation.item.create", item=user_item("y"))
    assert Conversation.position(events[0]["event_id"]) == position_of(out[-1]) == (3, 5)
    assert events[0]["event_id"] != out[-1]["event_id"]
    for bad in ("evt_x4", "evt_5_x3", "evt__5", "evt_5_", "evt_\u0663_1", "evt_1_2x"):
        assert Conversation.position(bad) is None, bad  # names no place (evt_x4: the old form)


def position_of(event: dict[str, object]) -> tuple[int, int] | None:
    return Conversation.position(str(event["event_id"]))


def test_a_refused_or_blocked_system_item_is_taken_back_and_no_response_is_touched() -> None:
    """A system item goes to the session as ``context`` at once; refused (a client token's:
    ``forbidden``) or blocked by an input guardrail, it is taken back, and the error names
    the client's event; neither is the running response's (its overrides stay)."""
    conv = created(Conversation("s1", "m"))
    system = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "x"}]}
    commands, shown = client(conv, type="conversation.item.create", event_id="e_sys", item=system)
    [context] = commands
    assert isinstance(context, ContextMessage) and context.id == "e_sys"
    assert [e["type"] for e in shown] == ["conversation.item.added", "conversation.item.done"]
    iid = shown[0]["item"]["id"]
    out = feed(conv, Error(code="forbidden", content="no", reply_to="e_sys"))
    assert [e["type"] for e in out] == ["error", "conversation.item.deleted"]
    assert out[0]["error"]["event_id"] == "e_sys" and out[1]["item_id"] == iid
    commands, _ = client(conv, type="conversation.item.create", item=system)
    [unnamed] = commands
    before = list(conv.overrides.due)
    blocked = Guardrail(rule="r", action="block", on="input", reply_to=unnamed.id)
    out = feed(conv, blocked)
    assert [e["type"] for e in out] == ["error", "conversation.item.deleted"]
    assert out[0]["error"]["event_id"] is None  # the client named no event
    assert conv.overrides.due == before


def test_a_historys_function_call_and_its_output_are_told_to_the_model_as_context() -> None:
    """LiveKit's plugin sends its chat context again after a reconnect, function calls and
    their outputs with it; the door refused both ("no function call is waiting"). They are
    shown as sent, and the model gets what was done then, in words."""
    conv = created(Conversation("s1", "m"))
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather"}
    commands, shown = client(
        conv, type="conversation.item.create", item=call | {"arguments": '{"city":"Paris"}'}
    )
    [said] = commands
    assert isinstance(said, ContextMessage) and said.role == "assistant"
    assert "get_weather" in said.content and "Paris" in said.content
    assert shown[-1]["item"]["type"] == "function_call" and shown[-1]["item"]["id"] == "fc_1"
    out = {"type": "function_call_output", "call_id": "c1", "output": '{"sky":"sunny"}'}
    commands, shown = client(conv, type="conversation.item.create", item=out)
    [told] = commands
    assert isinstance(told, ContextMessage) and told.role == "system" and "sunny" in told.content
    assert shown[-1]["item"]["type"] == "function_call_output"
    # An output for a call nobody made is still refused.
    _, events = client(conv, type="conversation.item.create", item=out | {"call_id": "c9"})
    assert events[0]["error"]["param"] == "item.call_id"


def test_a_context_deleted_in_flight_is_forgotten_once_logged_or_taken_back_if_refused() -> None:
    """A system item goes to the session at once; deleted before its ``context`` event
    is logged, no span names it yet. The door said "function calls stay in the model's
    context" and the message stayed. Now it is forgotten as soon as it is logged, and a
    refused one is taken back once, with nothing forgotten."""
    conv = created(Conversation("s1", "m"))
    system = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "x"}]}
    [context], shown = client(conv, type="conversation.item.create", item=system)
    iid = shown[0]["item"]["id"]
    commands, events = client(conv, type="conversation.item.delete", item_id=iid, event_id="d")
    assert (commands, events) == ([], [])  # no error: the delete is kept for the log
    assert (
        feed(conv, Context(seq=2, role="system", content="x", reply_to=context.id, item=iid)) == []
    )
    assert conv.take_due() == [Forget(first=2, last=2)]
    out = feed(conv, Forgotten(seq=3, first=2, last=2))
    assert [(e["type"], e["item_id"]) for e in out] == [("conversation.item.deleted", iid)]

    [context], shown = client(conv, type="conversation.item.create", item=system)
    iid = shown[0]["item"]["id"]
    client(conv, type="conversation.item.delete", item_id=iid)
    out = feed(conv, Error(code="forbidden", content="no", reply_to=context.id))
    assert [e["type"] for e in out] == ["error", "conversation.item.deleted"]
    assert conv.take_due() == []


def test_a_message_of_the_turn_in_flight_cannot_be_deleted_and_says_when_it_can() -> None:
    conv = created(Conversation("s1", "m"))
    client(conv, type="conversation.item.create", item={**user_item("x"), "id": "u1"})
    client(conv, type="response.create", event_id="c")
    _, events = client(conv, type="conversation.item.delete", item_id="u1", event_id="d")
    error = events[0]["error"]
    assert (error["event_id"], error["param"]) == ("d", "item_id")
    assert "once that response is done" in error["message"]


def test_a_system_item_behind_a_deleted_user_message_goes_at_once() -> None:
    """A system item created while a user message is held waits behind it; once that
    message is deleted nothing is ahead of it, and it goes with the delete (it waited
    for the end of a turn before, and between turns no turn was coming)."""
    conv = created(Conversation("s1", "m"))
    client(conv, type="conversation.item.create", item={**user_item("x"), "id": "u1"})
    system = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "y"}]}
    commands, _ = client(conv, type="conversation.item.create", item=system | {"id": "s1"})
    assert commands == []  # held behind the user message
    commands, events = client(conv, type="conversation.item.delete", item_id="u1")
    assert [e["type"] for e in events] == ["conversation.item.deleted"]
    [context] = commands
    assert isinstance(context, ContextMessage) and (context.role, context.item) == ("system", "s1")
    commands, _ = client(conv, type="response.create", event_id="c")
    assert commands == [ReplyNow(id="c")]  # nothing held is sent twice


def test_a_replay_shows_what_follows_the_clients_event_or_the_head_and_ends_there() -> None:
    """``Replay``: after ``after_event``, or from the head when the client names none (a
    token's reload: the past is not sent as live events); either way it ends as the
    replay reaches the head, so a reply made then is never held back as replayed."""
    resumed = Replay((3, 1))
    assert not resumed.start(5)
    assert not resumed.shows("evt_3_1") and resumed.shows("evt_3_2") and resumed.shows("evt_4_1")
    assert not resumed.replayed(4) and resumed.skip is None  # past the client's event
    assert resumed.replayed(5) and not resumed.replayed(6)  # at the head: once
    at_head = Replay((5, 2))
    at_head.start(5)
    assert not at_head.shows("evt_5_2x3")  # sent after evt_5_2: seen
    assert at_head.replayed(5) and at_head.skip is None  # a reply now is sent
    joined = Replay(None)
    assert not joined.start(5)
    assert not joined.shows("evt_5_9") and not joined.shows("evt_1_1x1")
    assert joined.replayed(5) and joined.skip is None
    fresh = Replay(None)
    assert fresh.start(0) and fresh.skip is None and fresh.caught_up


def test_a_lone_surrogate_escape_is_said_plainly_not_as_truncated_input() -> None:
    # Found from outside on the WebRTC data channel: msgspec calls it "Input data was
    # truncated", which sends a client looking for a cut frame.
    bad = decode_client('{"type":"session.update","session":{"instructions":"\\ud800"}}')
    assert "escape without its pair" in bad.message  # type: ignore[union-attr]
    cut = decode_client('{"type":"session.upd')
    assert "truncated" in cut.message  # type: ignore[union-attr]


def test_a_create_right_after_a_commit_names_the_answer_the_commit_starts() -> None:
    """LiveKit's manual turns: commit_audio() then generate_reply(), whose response.create
    comes before the commit's turn is logged and waits for the response.created naming
    it. Its metadata went nowhere (the turn was not open yet), and the plugin timed out
    after 10 s on every turn (its probe, s4_manual_turns)."""
    conv = created(Conversation("s1", "m"))
    manual = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    client(conv, type="session.update", session=manual)
    conv.requests.heard(2 * 24000 // 2)  # 500 ms
    commands, _ = client(conv, type="input_audio_buffer.commit", event_id="c1")
    assert len(commands) == 1
    asked = {"metadata": {"client_event_id": "r1"}}
    assert client(conv, type="response.create", event_id="r1", response=asked) == ([], [])
    out = feed(conv, User(seq=3, content="hi", source="audio"), Respond(seq=4, content="Hey"))
    started = next(e for e in out if e["type"] == "response.created")
    assert started["response"]["metadata"] == {"client_event_id": "r1"}


def test_the_items_kept_for_retrieve_are_bounded_by_what_they_hold() -> None:
    """Found from outside (2026-12-07): 256 kept items of 30,000 one-character parts held
    2 GB on one connection. The newest items are kept within ``KEPT_WEIGHT``; an older one
    is retrieved as OpenAI answers an unknown id."""
    conv = created(Conversation("s1", "m"))
    parts = [{"type": "input_text", "text": "a"}] * 1_000  # 257 KB of weight each
    for n in range(20):
        item = {"type": "message", "role": "user", "content": parts, "id": f"i{n}"}
        client(conv, type="conversation.item.create", item=item)
    assert conv.shown.weight <= KEPT_WEIGHT
    _, events = client(conv, type="conversation.item.retrieve", item_id="i19")
    assert len(events[0]["item"]["content"]) == 1_000
    _, events = client(conv, type="conversation.item.retrieve", item_id="i0")
    assert events[0]["error"]["code"] == "item_retrieve_invalid_item_id"
    before = conv.shown.weight
    client(conv, type="conversation.item.delete", item_id="i19")
    assert conv.shown.weight < before
