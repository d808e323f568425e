"""A session's guardrails at the log: what the model says is judged before it is logged.

``SessionLog.emit`` hands every event to the session's ``EventGuard`` first
(when it has rules): the model's answer and reasoning go through a
``StreamGuard`` per block (held back only as much as a rule needs), a call's
arguments and a tool's result are judged whole, and history is judged as it
is persisted. So the stored log, exports, recordings and the history the
model is given back never hold what a rule forbids, and no client sees it.
Each trip is logged as a ``guardrail`` event (rule and action, never the
matched text) and counted in ``rtgw_guardrail_trips``.

The rules come from ``gateway.sessions.guardrail_rules`` (``--guardrails
FILE`` and the owner's key policy, compiled into ``Guardrails``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import msgspec

from gateway.metrics import Metrics
from gateway.sessions.guardrail_rules import Guardrails
from protocol.assembly import HistoryItem
from protocol.audio import OUTPUT_RATE
from protocol.events import (
    Call,
    Cancelled,
    ContextMessage,
    End,
    Error,
    Event,
    Execute,
    Forgotten,
    Guardrail,
    Interrupt,
    Respond,
    Result,
    Think,
    ToolResultMessage,
    User,
    UserMessage,
)
from protocol.guardrails import Hit, RuleSet, StreamGuard, Verdict, check, check_input
from protocol.turn_events import TurnInput

__all__ = ["EventGuard", "guard_result", "guard_value", "judged_input"]

_JSON: Final = msgspec.json.Decoder()
_ENCODER: Final = msgspec.json.Encoder()
PREJUDGE_FROM: Final = 32_768
"""Characters from which an input is judged off the loop (``EventGuard.prejudge``)."""


def guard_value(rules: RuleSet, value: Any) -> tuple[Any, list[Hit]]:
    """Every string in a JSON-like value judged whole (a call's args, a tool's result).

    A string a rule would block or cut becomes the rule's replacement: the
    value keeps its shape, and what is left of it is still valid JSON.
    """
    hits: list[Hit] = []

    def walk(v: Any, depth: int) -> Any:
        if isinstance(v, str):
            piece = check(rules, v)
            if piece.hits:
                hits.extend(piece.hits)
                return (
                    piece.text
                    if not piece.cut or piece.hits[-1].action == "redact"
                    else (piece.text + "[blocked]")
                )
            return v
        if depth > 64:
            return v
        if isinstance(v, dict):
            return {k: walk(x, depth + 1) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, depth + 1) for x in v]
        return v

    return walk(value, 0), hits


def guard_result(rules: RuleSet, content: Any) -> tuple[Any, list[Hit], bool]:
    """A tool's result judged as input: (content to give the model, hits, withheld).

    Withheld when a ``block``/``end_turn`` rule tripped: the content is then a
    note naming the rule, and the call counts as failed.
    """
    if not rules:
        return content, [], False
    guarded, hits = guard_value(rules, content)
    blocking = [h for h in hits if h.action != "redact"]
    if blocking:
        return f"the result was withheld by the guardrail {blocking[0].rule!r}", hits, True
    return guarded, hits, False


def judged_input(
    guard: EventGuard, given: TurnInput, emit: Callable[[Event], None]
) -> TurnInput | None:
    """A user's message (or a ``context``) or a client tool's result as the input rules leave it (their
    ``guardrail`` events given to ``emit``); None: a blocked message, which never
    reaches the model."""
    rules = guard.guardrails.input
    if isinstance(given, UserMessage | ContextMessage):
        verdict = guard.judge_input(given.content)
        # A context may come while the model answers: its rule blocks it, ending no turn.
        ends = type(given) is UserMessage
        for event in guard.tripped(verdict.hits, "input", reply_to=given.id, ends=ends):
            emit(event)
        if verdict.blocked:
            return None  # the session takes the next message
        return msgspec.structs.replace(given, content=verdict.text) if verdict.hits else given
    if isinstance(given, ToolResultMessage):
        content, hits, withheld = guard_result(rules, given.content)
        if not hits:
            return given
        if withheld:
            for event in guard.tripped(hits, "input", ends=False):
                emit(event)
        status = "failure" if withheld else given.status
        return msgspec.structs.replace(given, content=content, status=status)
    return given


def _json_text(rules: RuleSet, text: str) -> tuple[str, list[Hit]]:
    """A JSON text with its strings judged (the whole text when it is not JSON)."""
    try:
        value = _JSON.decode(text)
    except (msgspec.DecodeError, RecursionError):
        piece = check(rules, text)
        return piece.text, piece.hits
    guarded, hits = guard_value(rules, value)
    return (_ENCODER.encode(guarded).decode() if hits else text), hits


def _judged_result(
    input_: RuleSet, output: RuleSet, result: Result
) -> tuple[Result, list[Hit], list[Hit]]:
    """A tool's result judged as what it is twice over: input (it goes to the model),
    then output (clients, the log and the export show it: a card the model wrote into
    a file, redacted in its call, came back whole in the read's result). Its JSON is
    read and written once: ``(result, input hits, output hits)``. A call's result a
    block rule withheld is the failure naming the rule the model got
    (``tool_runs._guarded``), counted as one, not a success whose text lost its match."""
    text, withheld = result.content, 0
    try:
        value = _JSON.decode(text)
    except (msgspec.DecodeError, RecursionError):
        taken = check(input_, text)
        shown = check(output, taken.text) if output else None
        judged = shown.text if shown else taken.text
        return _with(result, judged, 0), taken.hits, (shown.hits if shown else [])
    if isinstance(value, list) and all(isinstance(e, dict) and "content" in e for e in value):
        guarded: Any = []
        hits: list[Hit] = []
        for entry in value:  # a step's calls, each as the model got it
            content, entry_hits, blocked = guard_result(input_, entry["content"])
            failed = blocked and entry.get("status") != "failure"
            withheld += failed
            status = {"status": "failure"} if blocked else {}
            guarded.append({**entry, "content": content, **status} if entry_hits else entry)
            hits += entry_hits
    else:
        guarded, hits = guard_value(input_, value)
    shown_hits: list[Hit] = []
    if output:
        guarded, shown_hits = guard_value(output, guarded)
    if not hits and not shown_hits:
        return result, hits, shown_hits
    return _with(result, _ENCODER.encode(guarded).decode(), withheld), hits, shown_hits


def _with(result: Result, content: str, withheld: int) -> Result:
    """``result`` with ``content``, ``withheld`` of its successes counted as failures."""
    if not withheld:
        return msgspec.structs.replace(result, content=content)
    counts = result.payload
    payload = msgspec.structs.replace(
        counts,
        success_count=max(0, counts.success_count - withheld),
        failure_count=counts.failure_count + withheld,
    )
    return msgspec.structs.replace(result, content=content, payload=payload)


# Events that end a turn (an end_turn rule's withholding ends with it).
_TURN_ENDS: Final = (End, Cancelled, Error, Interrupt)
# Events that close the model's block of text (what it held is judged as final). Others
# (a background call's result, speech started, a metric) pass it by: were they to close
# it, a card split around one would be judged as two halves.
_BLOCK_ENDS: Final = (Call, Execute, *_TURN_ENDS)


class EventGuard:
    """Judges a session's events on their way into its log (see the module docstring).

    ``filter`` returns the events to log instead of the one given: the
    released text of a block (maybe none yet), the ``guardrail`` events of the
    rules that tripped, and whatever else passes. ``on_end_turn`` is called
    (once per turn) when an ``end_turn`` rule trips on a written answer.

    **A spoken answer** (``speaks``: its audio goes to the clients) is cut
    where any rule trips: its transcript there (after the replacement, for
    ``redact``), and its audio with it. Its audio is held (``hold_audio``)
    until a chunk of transcript that came after it leaves nothing held
    (OpenAI sends a piece of audio with or just before its text:
    docs/guardrails.md), and given to ``send_audio`` then; what is held when a
    rule trips is dropped, and so is the rest of the answer's audio. The cut
    waits in ``cut_ms`` (how much of the answer's audio went out, what the
    listener can have heard) for the driver's reader to give the turn machine.
    """

    __slots__ = (
        "_audio",
        "_ended",
        "_kind",
        "_streams",
        "cut_ms",
        "guardrails",
        "judged",
        "metrics",
        "on_end_turn",
        "released_ms",
        "send_audio",
        "speaks",
    )

    def __init__(
        self,
        guardrails: Guardrails,
        metrics: Metrics,
        on_end_turn: Callable[[], None],
        send_audio: Callable[[bytes], None] | None = None,
    ) -> None:
        self.guardrails = guardrails
        self.metrics = metrics
        self.on_end_turn = on_end_turn
        self.send_audio = send_audio
        self._kind: type[Think] | type[Respond] | None = None  # the block being written
        # One stream per kind, kept while the other kind is written between (a card
        # split around a <think> block reached clients whole, each half judged alone),
        # and finished at the step's end (a call, a turn's end: ``_flush``).
        self._streams: dict[type[Think] | type[Respond], StreamGuard] = {}
        self._ended = False  # a rule ended the turn: the rest of it is withheld
        self.speaks = False  # the answers are spoken to the clients
        self._audio: list[bytes] = []  # the answer's audio waiting for its transcript
        self.released_ms = 0.0  # of the current answer's audio, sent to the clients
        # A rule cut the spoken answer after this many ms of its audio: the driver's
        # reader tells the turn machine (``GuardrailCut``) before the next upstream event.
        self.cut_ms: int | None = None
        self.judged: tuple[str, Verdict] | None = None  # a large input, judged off the loop

    def judge_input(self, text: str) -> Verdict:
        """``check_input`` by the input rules; a text ``prejudge`` judged is not again."""
        judged = self.judged
        if judged is not None and judged[0] is text:
            return judged[1]
        return check_input(self.guardrails.input, text)

    async def prejudge(self, text: str) -> None:
        """A large input judged in a thread before the machine reads it (``judge_input``):
        the rules are Python, ~0.2-0.5 s a MiB of digits, emails or phone numbers, and a
        door client's message may be 20 MiB. The loop still gets the interpreter every
        switch interval (5 ms) meanwhile, instead of waiting for the whole judgement."""
        rules = self.guardrails.input
        if len(text) >= PREJUDGE_FROM and rules:
            self.judged = (text, await asyncio.to_thread(check_input, rules, text))

    @property
    def gates_audio(self) -> bool:
        """The answers' audio waits for their transcript to be judged (``hold_audio``)."""
        return self.speaks and bool(self.guardrails.output)

    def hold_audio(self, pcm16: bytes) -> None:
        """A piece of the spoken answer's audio (PCM16 at ``OUTPUT_RATE``): sent once the
        transcript that comes after it is judged clean; dropped if the answer was cut."""
        if not self._ended:
            self._audio.append(pcm16)

    def take_cut(self) -> int | None:
        """The pending cut of a spoken answer (``cut_ms``), once."""
        cut, self.cut_ms = self.cut_ms, None
        return cut

    def answer_done(self) -> list[Event]:
        """The provider's response is complete: a spoken answer's transcript is judged to
        its end now, while its turn still runs (a cut can still truncate it)."""
        return self._flush() if self.speaks and self._kind is Respond else []

    def _release_audio(self) -> None:
        if not self._audio:
            return  # called on every clean spoken token: nothing held, nothing to do
        audio, self._audio = self._audio, []
        send = self.send_audio
        for pcm16 in audio:
            self.released_ms += len(pcm16) * 500 / OUTPUT_RATE
            if send is not None:
                send(pcm16)

    def filter(self, event: Event) -> list[Event]:
        kind = type(event)
        output = self.guardrails.output
        if isinstance(event, Respond | Think):
            if self._ended:
                return []
            if not output:  # input rules only: the stream goes out as it is (per token)
                return [event] if event.content else []
            out: list[Event] = []
            block = type(event)  # Respond or Think, as narrowed
            spoken = self.speaks and block is Respond
            self._kind = block
            stream = self._streams.get(block)
            if stream is None:
                stream = self._streams[block] = StreamGuard(output, cuts=spoken)
                if spoken:
                    self.released_ms = 0.0  # a new answer (its audio before it still waits)
            piece = stream.feed(event.content)
            if piece.text:
                event.content = piece.text
                out.append(event)
            if piece.hits:
                out += self.tripped(piece.hits, "output", spoken=spoken)
            elif spoken and not stream.held:
                self._release_audio()  # its transcript so far is judged and sent
            return out
        if kind is Cancelled or kind is Interrupt or kind is Error:
            self._audio = []  # the answer stops: what of its audio waits is not played
        out = self._flush() if isinstance(event, _BLOCK_ENDS) else []
        if isinstance(event, Call):
            if self._ended:
                return out
            content, hits = _json_text(output, event.content)
            if hits:
                event = msgspec.structs.replace(event, content=content)
                out.append(event)
                out += self.tripped(hits, "output", ends=False)
                return out
        elif isinstance(event, Result) or (isinstance(event, User) and event.source == "audio"):
            rules = self.guardrails.input
            judged: Event
            if isinstance(event, Result):
                judged, hits, shown = _judged_result(rules, output, event)
            else:
                verdict = check_input(rules, event.content)
                judged = msgspec.structs.replace(event, content=verdict.text)
                hits, shown = list(verdict.hits), []
            if hits or shown:
                out.append(judged)
                out += self.tripped(hits, "input", ends=False)
                out += self.tripped(shown, "output", ends=False)
                return out
        elif isinstance(event, _TURN_ENDS):
            if not self._ended:
                self._release_audio()  # an answer's audio after its last transcript
            self._ended = False
            self.cut_ms = None  # too late to cut the turn that ends
        out.append(event)
        return out

    def history(self, items: Sequence[HistoryItem]) -> list[HistoryItem]:
        """History items as the log has them: judged whole (what the stream gave)."""
        out: list[HistoryItem] = []
        output, input_ = self.guardrails.output, self.guardrails.input
        for item in items:
            kind = type(item)
            if isinstance(item, Forgotten):
                pass  # seqs only: nothing to judge
            elif kind is Respond or kind is Think:
                piece = check(output, item.content, cuts=self.speaks and kind is Respond)
                if piece.hits:
                    item = msgspec.structs.replace(item, content=piece.text)
            elif kind is Call:
                content, hits = _json_text(output, item.content)
                if hits:
                    item = msgspec.structs.replace(item, content=content)
            elif isinstance(item, Result):
                item = _judged_result(input_, output, item)[0]
            elif isinstance(item, User) and item.source == "audio":
                verdict = check_input(input_, item.content)
                if verdict.hits:
                    item = msgspec.structs.replace(item, content=verdict.text)
            out.append(item)
        return out

    def answer(self, text: str) -> str:
        """The model's answer as the clients got it (judged whole): what the provider is
        told it said when its answer is replaced (``ReplaceResponse``)."""
        if not self.guardrails.output:
            return text
        return check(self.guardrails.output, text, cuts=self.speaks).text

    def _flush(self) -> list[Event]:
        """The step's text ended: the rest of what each kind's stream held, the block
        written last at the end."""
        streams, last = self._streams, self._kind
        self._streams, self._kind = {}, None
        out: list[Event] = []
        for kind, stream in sorted(streams.items(), key=lambda ks: ks[0] is last):
            if stream.cut:
                continue
            piece = stream.finish()
            if piece.text:
                out.append(kind(content=piece.text))
            spoken = self.speaks and kind is Respond
            if piece.hits:
                out += self.tripped(piece.hits, "output", spoken=spoken)
            elif spoken:
                self._release_audio()
        return out

    def tripped(
        self,
        hits: Sequence[Hit],
        on: Literal["input", "output"],
        *,
        ends: bool = True,
        spoken: bool = False,
        reply_to: str | msgspec.UnsetType = msgspec.UNSET,
    ) -> list[Event]:
        """Count the hits and make their ``guardrail`` events, one a rule (``reply_to``:
        the id of the message they judged; a message of 40,000 emails logged 40,000 of
        them). An output's ``end_turn`` ends the turn (``on_end_turn``); any rule on a
        ``spoken`` answer cuts it (``cut_ms``, its waiting audio dropped)."""
        counter = self.metrics.guardrails.trips
        events: list[Event] = []
        # Counted a rule at a time (a rule has one action): a metric's ``labels`` per hit
        # took 0.1 s of the loop for a message of 40,000 emails.
        for (rule, action), count in Counter((hit.rule, hit.action) for hit in hits).items():
            counter.labels(rule, action, on).inc(count)
            events.append(Guardrail(rule=rule, action=action, on=on, reply_to=reply_to))
            ending = action == "end_turn" or spoken
            if ends and ending and not self._ended:
                self._ended = True
                self._audio = []
                if spoken:
                    self.cut_ms = int(self.released_ms)  # the reader feeds it to the machine
                else:
                    self.on_end_turn()
        return events
