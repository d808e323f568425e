"""The streaming parser: the model's text deltas in, protocol events out.

The model writes the wire protocol of the seed (``<think>…</think>``,
``<execute>[…]</execute>``, ``<end>``, and plain text that is the response);
a ``Parser`` turns one response's deltas into ``Think``/``Respond`` chunks,
``Call``/``Execute`` events and ``End``, as soon as each is safe to send.

It is sans-I/O in the style of ``h11`` and ``websockets``: no socket, no clock,
no asyncio. The caller feeds text and gets events back, so the same model output
parses to equal events in any chunking (``seq``/``timestamp`` stay 0; the
gateway stamps them when it logs an event).

How it stays fast and linear:

- The common delta (a few characters of prose or reasoning, no ``<``) takes a
  fast path of one ``in`` test, one list append and one Struct: the parser runs
  once per token, next to one JSON decode of the provider's frame.
- Nothing is rescanned. Between deltas only a possible partial marker (at most
  9 characters, always starting with ``<``) is carried over and prepended to the
  next delta; an ``<execute>`` body is kept as a list of chunks and the JSON
  string/escape state as two flags, so a long open block costs O(its size).
"""

from __future__ import annotations

import enum
import re
from typing import Any, Final

import orjson

from protocol.calls import ToolCall, encode_call
from protocol.events import Call, End, Error, Event, Execute, Respond, Think

__all__ = ["Parser", "State"]


class State(enum.Enum):
    """Where the parser is in the response it is reading."""

    TEXT = "text"
    """Response text (the seed's respond); ``<think>``, ``<execute>`` and ``<end>`` are markers."""
    THINK = "think"
    """Inside ``<think>``: only ``</think>`` is a marker, the rest is reasoning."""
    EXECUTE = "execute"
    """Inside ``<execute>``: only ``</execute>`` outside a JSON string ends it."""
    STOPPED = "stopped"
    """Hard stop after ``</execute>`` or ``<end>``: later text is discarded."""
    CLOSED = "closed"
    """``close()`` was called without a hard stop; feeding again is a bug."""


# Module-level aliases: one global lookup instead of two on the scanning path.
_TEXT: Final = State.TEXT
_THINK: Final = State.THINK
_EXECUTE: Final = State.EXECUTE
_STOPPED: Final = State.STOPPED
_CLOSED: Final = State.CLOSED

_THINK_OPEN: Final = "<think>"
_THINK_CLOSE: Final = "</think>"
_EXECUTE_OPEN: Final = "<execute>"
_EXECUTE_CLOSE: Final = "</execute>"
_END: Final = "<end>"

# The markers of TEXT state. Every marker has its only "<" at position 0, so a
# partial marker at the end of a delta always starts at the last "<".
_TEXT_MARKERS: Final = (_THINK_OPEN, _EXECUTE_OPEN, _END)
_LONGEST_TEXT_MARKER: Final = max(len(m) for m in _TEXT_MARKERS)
_TEXT_PREFIXES: Final = frozenset(m[:k] for m in _TEXT_MARKERS for k in range(1, len(m)))

# In EXECUTE state: outside a JSON string only a quote (a string opens) or "<"
# (maybe "</execute>") matters; inside one only a quote (it closes) or a
# backslash (the next character is escaped) does.
_EXEC_OUTSIDE: Final = re.compile(r'["<]')
_EXEC_INSIDE: Final = re.compile(r'["\\]')

_EXAMPLE: Final = '<execute>[{"name": "tool_name", "args": {"arg": "value"}}]</execute>'
_FIX: Final = (
    'write the block as a JSON array of calls, each {"name": "<tool>", "args": {...}}, '
    f"e.g. {_EXAMPLE}"
)


class Parser:
    """Parse one model response, fed as text deltas, into events.

    Make one ``Parser`` per upstream response. ``feed(delta)`` returns the events
    the delta completes (``Think``/``Respond`` text is returned in the same call
    that delivers it; only a possible partial marker at the end of the delta is
    held back); ``close()`` returns what is still open when the response ends.

    Public attributes, for the gateway:

    - ``state``: the ``State`` the parser is in.
    - ``stopped``: True after ``</execute>`` (valid or malformed) or ``<end>``;
      from then on ``feed`` returns ``[]`` and the upstream response can be
      cancelled.
    - ``accepted_text``: the raw text the parser accepted, markers included,
      up to and including the ``</execute>`` or ``<end>`` that stopped it. After a
      hard stop the gateway writes exactly this back as the response's output,
      so the model's context never holds text it wrote past the stop.
    """

    __slots__ = (
        "_accepted",
        "_at_start",
        "_body",
        "_escape",
        "_fast",
        "_held",
        "_in_string",
        "_ws",
        "state",
        "stopped",
    )

    def __init__(self) -> None:
        self.state: State = _TEXT
        # A plain attribute, not a property: the gateway reads it for every delta.
        self.stopped = False
        # The event type a delta without "<" becomes as a whole, or None when a
        # delta needs the full scan (partial marker held, leading whitespace
        # rule active, execute block, stopped).
        self._fast: type[Think] | type[Respond] | None = None
        # Every accepted delta; joined on demand by ``accepted_text``.
        self._accepted: list[str] = []
        # A possible partial marker from the end of the last delta (< 10 chars).
        self._held = ""
        # TEXT: no non-whitespace yet in this respond segment, and the
        # whitespace held back meanwhile (sent with the first text, or dropped).
        self._at_start = True
        self._ws: list[str] = []
        # EXECUTE: the block's text so far, and the JSON lexer state.
        self._body: list[str] = []
        self._in_string = False
        self._escape = False

    @property
    def accepted_text(self) -> str:
        """The raw text accepted so far, markers included, ending at a stop marker."""
        text = "".join(self._accepted)
        self._accepted = [text]  # repeated calls stay cheap
        return text

    def feed(self, delta: str) -> list[Event]:
        """Parse the next delta; return the events it completes (often one text chunk)."""
        fast = self._fast
        if fast is not None and "<" not in delta and delta:
            self._accepted.append(delta)
            return [fast(content=delta)]
        return self._feed(delta)

    def close(self) -> list[Event]:
        """The response ended: flush what is open (idempotent).

        A held partial marker is text of the current state (a trailing ``<thi``
        is response text; inside ``<think>`` it is reasoning); held whitespace
        alone is dropped; an unclosed ``<execute>`` block is a
        ``malformed_execute`` error, so no call runs from a cut-off block.
        ``End`` is not emitted: whether the turn is over is the gateway's call.
        """
        state = self.state
        if state is _STOPPED or state is _CLOSED:
            return []
        out: list[Event] = []
        held, self._held = self._held, ""
        if state is _TEXT:
            self._respond(held, out)  # held whitespace alone is dropped
        elif state is _THINK:
            if held:
                out.append(Think(content=held))
        else:
            self._body.clear()
            inside = " inside a JSON string" if self._in_string else ""
            out.append(
                Error(
                    code="malformed_execute",
                    content=(
                        f"the response ended inside an <execute> block{inside} before "
                        f"</execute>, so no tool was run; close every JSON string and end "
                        f"the block with </execute> right after the array: {_EXAMPLE}"
                    ),
                )
            )
        self.state = _CLOSED
        self._fast = None
        return out

    # --- the full scan ----------------------------------------------------------

    def _feed(self, delta: str) -> list[Event]:
        """Scan ``held + delta`` once, state by state, from left to right."""
        state = self.state
        if state is _STOPPED:
            return []
        if state is _CLOSED:
            raise RuntimeError("Parser.feed() after close(): make a new Parser per response")
        held = self._held
        if held:
            self._held = ""
            text = held + delta
        else:
            text = delta
        out: list[Event] = []
        # Each scanner either consumes the rest of ``text`` (possibly holding
        # back a partial marker) and returns -1, or changes the state at a
        # marker and returns the index just past it.
        pos = 0
        while True:
            if state is _TEXT:
                pos = self._scan_text(text, pos, out)
            elif state is _THINK:
                pos = self._scan_think(text, pos, out)
            else:
                pos = self._scan_execute(text, pos, out)
            if pos < 0:
                break
            state = self.state
            if state is _STOPPED:  # accept the delta up to the stop marker only
                self._accepted.append(delta[: pos - len(held)])
                self._fast = None
                return out
        self._accepted.append(delta)
        if self._held:
            self._fast = None
        elif state is _THINK:
            self._fast = Think
        elif state is _TEXT and not self._at_start:
            self._fast = Respond
        else:
            self._fast = None
        return out

    def _scan_text(self, text: str, i: int, out: list[Event]) -> int:
        find = text.find
        startswith = text.startswith
        n = len(text)
        j = find("<", i)
        while j >= 0:
            if startswith(_TEXT_MARKERS, j):
                self._respond(text[i:j], out)
                self._ws.clear()  # whitespace before a marker is not a response
                return self._enter(text, j, out)
            if n - j < _LONGEST_TEXT_MARKER and text[j:] in _TEXT_PREFIXES:
                self._respond(text[i:j], out)
                self._held = text[j:]
                return -1
            j = find("<", j + 1)  # a "<" of prose or an unknown tag: plain text
        if self._at_start:
            self._respond(text[i:], out)
        elif n > i:
            out.append(Respond(content=text[i:]))
        return -1

    def _enter(self, text: str, j: int, out: list[Event]) -> int:
        """Switch state at the text marker at ``text[j]``; return the index past it."""
        if text.startswith(_THINK_OPEN, j):
            self.state = _THINK
            return j + len(_THINK_OPEN)
        if text.startswith(_EXECUTE_OPEN, j):
            self.state = _EXECUTE  # entered once per parser: the lexer flags start clear
            return j + len(_EXECUTE_OPEN)
        out.append(End())
        self._stop()
        return j + len(_END)

    def _stop(self) -> None:
        self.state = _STOPPED
        self.stopped = True

    def _respond(self, piece: str, out: list[Event]) -> None:
        """Emit response text, holding back whitespace at the start of a segment."""
        if not piece:
            return
        if self._at_start:
            if piece.isspace():
                self._ws.append(piece)
                return
            if self._ws:
                piece = "".join(self._ws) + piece
                self._ws.clear()
            self._at_start = False
        out.append(Respond(content=piece))

    def _scan_think(self, text: str, i: int, out: list[Event]) -> int:
        k = text.find(_THINK_CLOSE, i)
        if k >= 0:
            if k > i:
                out.append(Think(content=text[i:k]))
            self.state = _TEXT
            self._at_start = True
            return k + len(_THINK_CLOSE)
        end = len(text)
        j = text.rfind("<", max(i, end - len(_THINK_CLOSE) + 1))
        if j >= 0 and _THINK_CLOSE.startswith(text[j:]):
            self._held = text[j:]
            end = j
        if end > i:
            out.append(Think(content=text[i:end]))
        return -1

    def _scan_execute(self, text: str, i: int, out: list[Event]) -> int:
        """Find ``</execute>`` outside JSON strings; buffer the block's text."""
        start = i
        n = len(text)
        in_string = self._in_string
        if self._escape and i < n:  # the last delta ended with a backslash
            self._escape = False
            i += 1
        while True:
            if in_string:
                m = _EXEC_INSIDE.search(text, i)
                if m is None:
                    break
                k = m.start()
                if text[k] == '"':
                    in_string = False
                    i = k + 1
                elif k + 1 < n:
                    i = k + 2
                else:
                    self._escape = True
                    break
            else:
                m = _EXEC_OUTSIDE.search(text, i)
                if m is None:
                    break
                k = m.start()
                if text[k] == '"':
                    in_string = True
                    i = k + 1
                elif text.startswith(_EXECUTE_CLOSE, k):
                    self._body.append(text[start:k])
                    body = "".join(self._body)
                    self._body.clear()
                    out.extend(_calls(body))
                    self._stop()
                    return k + len(_EXECUTE_CLOSE)
                elif n - k < len(_EXECUTE_CLOSE) and _EXECUTE_CLOSE.startswith(text[k:]):
                    self._held = text[k:]
                    self._body.append(text[start:k])
                    self._in_string = False
                    return -1
                else:
                    i = k + 1
        self._in_string = in_string
        self._body.append(text[start:])
        return -1


def _calls(body: str) -> list[Event]:
    """The events of a closed ``<execute>`` block: calls then ``Execute``, or one error.

    Decoded with orjson rather than msgspec because its errors give line and
    column, which the model needs to fix its block. All calls are checked before
    any is emitted, so a batch runs whole or not at all.
    """
    if len(body) > MAX_EXECUTE_CHARS:
        return [
            _malformed(
                f"the <execute> block is {len(body):,} characters, over {MAX_EXECUTE_CHARS:,}; "
                "pass large data in several calls or through a file"
            )
        ]
    try:
        value: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return [_malformed(f"the <execute> block is not valid JSON ({exc})")]
    if not isinstance(value, list):
        kind = _JSON_KINDS.get(type(value), "a JSON value")
        return [_malformed(f"the <execute> block holds {kind}, not a JSON array of calls")]
    if not value:
        return [_malformed("the <execute> block holds an empty array: there is no call to run")]
    if len(value) > MAX_CALLS:
        return [
            _malformed(
                f"the <execute> block holds {len(value):,} calls, over {MAX_CALLS}; "
                "run them in several blocks"
            )
        ]
    events: list[Event] = []
    for number, item in enumerate(value, 1):
        where = f"call {number} of {len(value)}"
        if not isinstance(item, dict):
            return [_malformed(f"{where} is not a JSON object")]
        name = item.get("name")
        if not isinstance(name, str):
            return [_malformed(f'{where} has no string "name"')]
        shown = name if len(name) <= 40 else name[:40] + "…"
        if len(name) > MAX_NAME:
            return [_malformed(f'{where} ("{shown}") names a tool of {len(name):,} characters')]
        args = item.get("args")
        if not isinstance(args, dict):
            return [_malformed(f'{where} ("{shown}") has no "args" object')]
        if _too_deep(args):
            return [
                _malformed(
                    f'{where} ("{shown}") has arguments nested more than '
                    f"{MAX_ARGS_DEPTH} levels deep; pass them flatter"
                )
            ]
        events.append(Call(content=encode_call(ToolCall(name=name, args=args))))
    events.append(Execute())
    return events


MAX_NAME: Final = 128
"""Characters of a call's tool name (a tool's is at most 64): a 900,000-character name
was echoed whole in the call's failure, to the client, the log and the model."""
MAX_CALLS: Final = 256
"""Calls one ``<execute>`` block may hold (four times a session's 64 background calls).
A block of 30,000 was checked, logged and started in one loop pass (a 0.5 s stall),
and pushed its own turn's first events out of the session's log."""
MAX_EXECUTE_CHARS: Final = 1 << 20
"""Characters one ``<execute>`` block may hold: a provider's longest answer is a few
hundred KB; past this the block's JSON is not read."""
MAX_ARGS_DEPTH: Final = 64
"""Nesting a call's arguments may have. No tool needs more, and encoding far
deeper values (a model's runaway ``[[[[…``) exhausts the interpreter's stack."""


def _too_deep(args: dict[str, Any]) -> bool:
    """Whether ``args`` nests deeper than ``MAX_ARGS_DEPTH`` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(args, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_ARGS_DEPTH:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


_JSON_KINDS: Final[dict[type, str]] = {
    dict: "an object",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _malformed(problem: str) -> Error:
    return Error(
        code="malformed_execute",
        content=f"{problem}; no tool was run. Send the calls again: {_FIX}",
    )
