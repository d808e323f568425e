"""A client's frame read: its message, or an ``error`` saying how to write it.

Bad input is the client's to fix, so it is answered, never raised: the
``error``'s ``content`` says what was wrong and what a correct frame looks like,
its ``code`` names the fault and its ``reply_to`` is the frame's ``id`` as far
as it could be read. The frames themselves are ``protocol.events``'s.
"""

from __future__ import annotations

from typing import Final

import msgspec

from protocol.events import (
    CLIENT_MESSAGE_TYPES,
    COMMAND_ID_MAX,
    ClientMessage,
    ContextMessage,
    Error,
    UserMessage,
    answering,
)
from protocol.json_outline import too_many_values

__all__ = ["decode_client"]

_client_decoder: Final = msgspec.json.Decoder(ClientMessage)
_probe_decoder: Final = msgspec.json.Decoder(dict[str, object])


def decode_client(data: bytes | str) -> ClientMessage | Error:
    """Decode one client frame. Bad input becomes an ``Error`` event, never an exception.

    The error's ``content`` says what was wrong and what a correct frame looks like.
    """
    if (crowded := too_many_values(data, "id")) is not None:
        problem, ref = crowded
        error = Error(code="bad_frame", content=f"invalid frame: {problem}")
        if ref is not None:
            error.reply_to = ref  # the frame's id, read as far as it could be
        return error
    try:
        try:
            message = _client_decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _explain_bad_frame(data, exc)
    except RecursionError:
        # msgspec recurses per nesting level, also to skip unknown fields: a
        # frame of deeply nested arrays must be an answer, not a crash.
        return Error(code="bad_frame", content=f"frame is nested too deeply; {_EXPECTED}")
    if isinstance(message, UserMessage | ContextMessage) and (
        not message.content or message.content.isspace()
    ):
        # A turn about nothing would cost a model call and teach the model to
        # answer blanks; refuse it here, where the client learns why.
        what = "user" if type(message) is UserMessage else "context"
        return answering(
            Error(
                code="bad_frame",
                content=f'the "{what}" message is empty; put the text of your message in "content"',
            ),
            message,
        )
    return message


_EXPECTED = (
    'send {"type": "user", "content": "<text>"} to start a turn, '
    'or {"type": "cancel"} to cancel the running one'
)


_HOW: Final = {
    "configure": (
        "a configure frame sets any of instructions, tools "
        '([{"name", "description", "parameters"}]), server_tools, provider, model, '
        "metadata, input_audio, output, voice (see docs/protocol.md)"
    ),
    "approve": (
        'decide on a call waiting for approval with {"type": "approve", "id": "<the '
        'approval_required event\'s id>", "digest": "<its digest>", "decision": "allow" '
        'or "deny"}'
    ),
    "tool_result": (
        'answer a call with "runs_on": "client" with {"type": "tool_result", "id": "<the '
        'call\'s id>", "status": "success" or "failure", "content": <any JSON>}'
    ),
}


def _explain_bad_frame(data: bytes | str, exc: Exception) -> Error:
    try:
        obj = _probe_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return Error(
            code="bad_frame",
            content=f"frame is not a JSON object ({_first_line(exc)}); {_EXPECTED}",
        )
    error = _explain(obj, exc)
    ref = obj.get("id")
    if isinstance(ref, str) and 0 < len(ref) <= COMMAND_ID_MAX:
        error.reply_to = ref  # the frame's id, read as far as it could be
    return error


def _explain(obj: dict[str, object], exc: Exception) -> Error:
    kind = obj.get("type")
    if not isinstance(kind, str):
        return Error(code="bad_frame", content=f'frame has no string "type" field; {_EXPECTED}')
    if kind not in CLIENT_MESSAGE_TYPES:
        shown = kind if len(kind) <= 40 else kind[:40] + "…"
        return Error(
            code="unknown_type",
            content=f"unknown message type {shown!r}; {_EXPECTED}",
        )
    how = _HOW.get(kind, _EXPECTED)
    return Error(code="bad_frame", content=f"invalid {kind!r} message: {_first_line(exc)}; {how}")


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
