"""``Client``: the gateway's Python client library (asyncio, typed).

```python
async with Client("ws://127.0.0.1:8765/v1/realtime", token=KEY) as c:
    async for event in c.send("hello"):
        ...  # protocol.events Structs: User, Think, Respond, Call, Result, End, Metric, ...
```

Why it is more than a WebSocket: connections drop (networks, node drains,
slow-client cutoffs), and the gateway keeps every session's events in a log so
nothing has to be lost. The client holds the last ``seq`` it delivered and,
whenever its connection ends for a reason a retry can fix, reconnects with
``session_id`` and ``after`` (backoff with jitter), drops what it already
holds, refills gaps by resuming again, and unpacks nothing: a merged frame
(``seq_from``) is delivered as one event. So ``send()`` yields every event of
the turn exactly once, in order, across any number of dropped connections.

Decisions (the rules themselves are in ``gateway.client.stream``; how a
connection is kept, failed over and resumed, in ``gateway.client.connection``):

- **A turn's iterator starts at the echo of its own ``user`` message** and
  ends after the closing event and the metric that follows it, or after
  ``end``/``cancelled`` when the next event is not a metric or no metric comes
  within ``metric_grace`` seconds. Events outside a turn (another client's
  turn on the same session, a late metric, a background call's late result)
  are counted in ``last_seq`` and told to ``on_event`` as they arrive, never
  both yielded and told.
- **A ``user`` message that the connection lost is sent again** only when the
  session's log did not grow while the client was away (the ``session``
  frame's seq equals ``after``): then the server never logged it, so sending
  it again cannot start a second turn.
- **Client tools.** ``@client.tool`` registers a handler for ``call`` events
  with ``"runs_on": "client"``; the client answers with ``{"type":
  "tool_result", "id", "status", "content"}`` (a handler that raises answers
  ``failure`` with the exception's text). ``configure(tools=[...])`` declares
  the tools to the session (name, description, JSON Schema), so the model
  sees them.
- **Approvals.** ``approve(id, digest, "allow" | "deny")`` decides on a call
  that waits for approval (an ``approval_required`` event, yielded in the
  turn) and returns its ``approval`` event, or raises ``ApprovalRefused``.
  ``on_approval`` is told each ``approval_required`` as it is read (also in
  a resumed client's replay) and may decide at once by returning ``"allow"``
  or ``"deny"`` (``gateway.client.calls``).
- **Commands are answered.** ``configure(...)`` returns the session's ``configured``
  event and ``context(...)`` its ``context`` event, or they raise ``CommandRefused``
  (``ConfigureRefused``) with the gateway's reply: a refusal is never silent.
- **Voice.** ``speak(pcm, rate)`` streams PCM16 as binary frames at real-time
  pace and yields the spoken turn's events (from its ``speech_started``,
  through its closing event and metric). It ends the spoken turn itself: with
  server VAD it goes on sending silence until the gateway heard the speech
  end, with ``commit`` it sends ``commit``; a turn that does not start within
  ``end_timeout`` raises ``ClientError``. ``on_audio(seq, pcm)`` gets the
  model's speech (``protocol.audio``); an app that plays it reports how far
  with ``played(seq, ms)``. Audio sent over a connection that drops is not
  resent: speak again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final, TypeVar, overload

import msgspec
import orjson

from gateway.client.calls import ApprovalHook, ApprovalRefused, Calls, Decision, ToolHandler
from gateway.client.confirming import CommandRefused, ConfigureRefused, Confirmations
from gateway.client.connection import (
    Failed,
    Reconnected,
    ResumingConnection,
    Timing,
    event_kind,
)
from gateway.client.dial import (
    ClientError,
    normalize_url,
)
from gateway.client.hooks import Hook, Hooks, call_hook
from gateway.client.pacing import first_of, stream_speech
from gateway.client.stream import METRIC_GRACE, REFUSAL_CODES, TurnTracker
from protocol.events import (
    Approval,
    Cancel,
    Commit,
    Configured,
    Context,
    Error,
    Event,
    Guardrail,
    Replying,
    ReplyNow,
    Role,
    Session,
    SpeechStarted,
    SpeechStopped,
    ToolResultMessage,
    User,
    UserMessage,
)

__all__ = [
    "ApprovalRefused",
    "Client",
    "CommandRefused",
    "ConfigureRefused",
    "Hooks",
    "Timing",
    "ToolHandler",
    "ToolResultMessage",
    "event_kind",
]

H = TypeVar("H", bound=ToolHandler)

_encoder: Final = msgspec.json.Encoder()


# The ``id`` of every ``played`` frame: a gateway that does not know the
# message answers ``unknown_type`` with this ``reply_to``.
_PLAYED_ID: Final = "played"


HOOK_NAMES: Final = (
    "on_connect",
    "on_disconnect",
    "on_audio",
    "on_retry",
    "on_approval",
    "on_event",
)


class Client:
    """One gateway session, kept alive across connections (see the module docstring).

    Settings: ``token`` (API key, sent as ``Authorization: Bearer``),
    ``session_id``/``after`` (resume an existing session), ``metric_grace``
    (seconds to wait for the metric after ``end``/``cancelled``),
    ``reconnect_timeout`` (seconds of failed reconnecting before
    ``ConnectionLost``), ``backoff_initial``/``backoff_max`` (reconnect delays,
    doubled per attempt, with jitter), ``open_timeout`` (per handshake).
    ``on_connect``/``on_disconnect`` are told about each connection (for a UI),
    ``on_retry`` about each failed attempt that will be retried (a 503, say),
    ``on_approval`` about each call that waits for approval (``ApprovalHook``),
    ``on_audio(seq, pcm16)`` gets the model's speech, ``on_event(event)`` each
    event no ``send()``/``speak()`` yields (see ``on_event``). Every hook may
    also be set as an attribute (``c.on_audio = play``), at any time.
    ``url`` may be several URLs (nodes of one gateway) to fail over between.
    """

    on_connect = Hook[Callable[[Session], None]]("hooks")
    on_disconnect = Hook[Callable[[str], None]]("hooks")
    on_audio = Hook[Callable[[int, bytes], None]]("hooks")
    on_retry = Hook[Callable[[ClientError], None]]("hooks")
    on_approval = Hook[ApprovalHook]("_calls")
    on_event = Hook[Callable[[Event], None]]("hooks")
    """Told each event that arrives outside a turn, as it is read: a background
    call's ``result`` after its turn ended and the model's answer to it, another
    client's turn on the session, a resumed client's replay, anything ``send()``
    and ``speak()`` do not yield (each event goes to exactly one of them)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name.startswith("on_") and not isinstance(getattr(type(self), name, None), Hook):
            raise AttributeError(
                f"Client has no hook {name!r}: its hooks are {', '.join(HOOK_NAMES)}"
            )
        object.__setattr__(self, name, value)

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        session_id: str | None = None,
        after: int | None = None,
        metric_grace: float = METRIC_GRACE,
        reconnect_timeout: float = 60.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        open_timeout: float = 10.0,
        on_connect: Callable[[Session], None] | None = None,
        on_disconnect: Callable[[str], None] | None = None,
        on_audio: Callable[[int, bytes], None] | None = None,
        on_retry: Callable[[ClientError], None] | None = None,
        on_approval: ApprovalHook | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("give the gateway's URL (or several, to fail over between them)")
        self.hooks = Hooks(on_connect, on_disconnect, on_audio, on_retry, on_event)
        self._conn = ResumingConnection(
            [normalize_url(u)[0] for u in urls],
            token=token,
            timing=Timing(
                metric_grace, reconnect_timeout, backoff_initial, backoff_max, open_timeout
            ),
            session_id=session_id,
            after=after,
            hooks=self.hooks,
            receive=self._receive,
        )
        self._calls = Calls(self._conn.send)
        self._calls.on_approval = on_approval
        self._in_turn = False
        # Each configure() waits for the reply naming its id (``configure-N``).
        self._confirming = Confirmations()  # configure() and context(), until answered
        self._speech_ended = asyncio.Event()  # the gateway heard the spoken turn end
        self._played_supported = True  # False once the gateway answered unknown_type

    # ------------------------------------------------------------------ public

    @property
    def url(self) -> str:
        """The URL dialled last (one of ``urls``)."""
        return self._conn.url

    @property
    def urls(self) -> list[str]:
        """The gateway's nodes this client fails over between."""
        return self._conn.urls

    @property
    def timing(self) -> Timing:
        return self._conn.timing

    @property
    def session(self) -> Session | None:
        """The last ``session`` frame (provider, node, resumed)."""
        return self._conn.session

    @property
    def reconnects(self) -> int:
        """Connections opened after the first one."""
        return self._conn.reconnects

    @property
    def session_id(self) -> str:
        """The session's id (known once connected)."""
        if self._conn.session_id is None:
            raise RuntimeError(
                "not connected yet: use `async with Client(...)` or `await connect()`"
            )
        return self._conn.session_id

    @property
    def last_seq(self) -> int:
        """The seq of the last logged event delivered (what a resume asks ``after``)."""
        return self._conn.last

    @property
    def connected(self) -> bool:
        return self._conn.connected

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the first connection (``Refused``/``Unreachable`` if that fails)."""
        await self._conn.open()

    async def close(self) -> None:
        """Close the connection and stop reconnecting; running tool handlers are cancelled."""
        await self._conn.close(self._calls.tasks)

    async def send(self, text: str) -> AsyncIterator[Event]:
        """Start a turn with ``text`` and yield its events, from its ``user`` echo to its end.

        An ``error`` refusing the turn (``turn_active``, ``rate_limited``, …) is
        yielded and ends the iteration. Raises ``ClientError`` if the session
        cannot be reached any more. One turn at a time per client.
        """
        async for event in self._own_turn(text):
            yield event

    async def reply(self) -> AsyncIterator[Event]:
        """Start a turn with no new message (``reply``): the model answers the conversation as
        it is (a greeting, a follow-up to ``context``). Yields as ``send``, from ``reply``."""
        async for event in self._own_turn(None):
            yield event

    async def context(
        self, content: str, role: Role = "system", *, timeout: float = 60.0
    ) -> Context:
        """Add a message without a turn (``context``): the app's instructions (``system``),
        history it restores (``user``; ``assistant`` and ``system`` need the API key). The
        logged ``context`` event (sent while the model answers: once the answer is written,
        so give ``timeout`` an answer's length); ``CommandRefused`` with the gateway's
        reply (``forbidden``, ``rate_limited``, ``guardrail_blocked``)."""
        frame = {"type": "context", "role": role, "content": content}
        return await self._confirming.ask(self._conn.send, frame, Context, timeout)

    async def _own_turn(self, text: str | None) -> AsyncIterator[Event]:
        if self._in_turn:
            raise RuntimeError("a turn is running: finish iterating it (or cancel()) first")
        self._in_turn = True
        try:
            async for event in self._turn(text):
                yield event
        finally:
            self._end_turn()

    async def approve(
        self, call_id: str, digest: str, decision: Decision = "allow", *, timeout: float = 10.0
    ) -> Approval:
        """Decide on call ``call_id`` that waits for approval (an ``approval_required``
        event; ``digest`` is that event's): ``"allow"`` runs it, ``"deny"`` answers the
        model that the user denied it. Returns the logged ``approval`` event.

        Raises ``ApprovalRefused`` with the gateway's reply (``wrong_digest``,
        ``unknown_call``: decided already or not waiting; ``forbidden``: this
        connection may not approve), ``ClientError`` without an answer in ``timeout``.
        """
        return await self._calls.approve(call_id, digest, decision, timeout)

    async def cancel(self) -> None:
        """Ask the gateway to cancel the running turn (its ``cancelled`` ends the iteration)."""
        await self._conn.send(_encoder.encode(Cancel()))

    @overload
    def tool(self, handler: H) -> H: ...

    @overload
    def tool(self, handler: None = None, *, name: str) -> Callable[[H], H]: ...

    def tool(self, handler: H | None = None, *, name: str | None = None) -> H | Callable[[H], H]:
        """Register a client tool (decorator): ``@c.tool`` or ``@c.tool(name="read")``.

        The handler gets the call's ``args`` dict and returns the result's
        content (anything JSON-encodable); sync or async.
        """

        def register(fn: H) -> H:
            self._calls.tools[name or fn.__name__] = fn
            return fn

        return register(handler) if handler is not None else register

    # ------------------------------------------------------------------ a turn

    async def configure(self, *, timeout: float = 10.0, **fields: Any) -> Configured:
        """Change the session's configuration (only the fields given), e.g.
        ``tools=[{"name", "description", "parameters"}]``, ``input_audio={"rate": 24000}``,
        ``output="audio"``; the ``configured`` event that answers it.

        Raises ``ConfigureRefused`` with the gateway's reply when it refuses
        (``forbidden``: a client token, or a value the key's policy does not
        allow; ``bad_frame``: a value that is not valid), ``ClientError`` when
        no answer comes within ``timeout`` seconds.
        """
        frame = {"type": "configure", **fields}
        return await self._confirming.ask(self._conn.send, frame, Configured, timeout)

    async def played(self, seq: int, ms: int) -> None:
        """Report the model's speech played so far: ``ms`` milliseconds of the
        spoken answer, up to the audio tagged ``seq`` (the newest audio actually
        heard), so a barge-in cuts the answer where the user stopped hearing it.

        A gateway that does not know the message yet answers ``unknown_type``
        once; the client then stops sending it, silently.
        """
        if self._played_supported:
            frame = orjson.dumps({"type": "played", "seq": seq, "ms": int(ms), "id": _PLAYED_ID})
            await self._conn.send(frame)

    async def send_audio(self, pcm16: bytes) -> None:
        """One binary frame of user audio (PCM16 LE mono at the configured rate)."""
        await self._conn.send(pcm16, binary=True)

    async def commit(self) -> None:
        """End a spoken turn yourself (``input_audio.turn_detection: "none"``)."""
        await self._conn.send(_encoder.encode(Commit()))

    async def speak(
        self,
        pcm16: bytes,
        rate: int,
        *,
        frame_ms: int = 20,
        commit: bool = False,
        end_timeout: float = 5.0,
    ) -> AsyncIterator[Event]:
        """Stream ``pcm16`` at real-time pace, end the spoken turn, yield its events.

        The events start at the turn's ``speech_started`` (or, with ``commit``,
        its audio-sourced ``user`` event) and end as ``send``'s do. The turn is
        ended for the caller: with ``commit`` (turn detection ``none``) a
        ``commit`` frame follows the audio; otherwise silence follows it, at
        real-time pace, until the gateway's VAD heard the speech end, for at
        most ``end_timeout`` seconds. Raises ``ClientError`` when the turn has
        not started ``end_timeout`` seconds after the audio (no speech heard).
        """
        if self._in_turn:
            raise RuntimeError("a turn is running: finish iterating it (or cancel()) first")
        self._in_turn = True
        while not self._conn.queue.empty():
            self._conn.queue.get_nowait()
        self._speech_ended.clear()
        ending = self.commit if commit else None
        sender = asyncio.create_task(
            stream_speech(
                self.send_audio, ending, self._speech_ended, pcm16, rate, frame_ms, end_timeout
            ),
            name="speak",
        )
        tracker = TurnTracker()
        started = False
        try:
            while True:
                getter = asyncio.ensure_future(self._conn.queue.get())
                try:
                    if tracker.closing:
                        async with asyncio.timeout(self.timing.metric_grace):
                            item = await getter
                    elif not started:
                        item = await first_of(getter, sender, end_timeout)
                    else:
                        item = await getter
                except TimeoutError:
                    return
                if isinstance(item, Failed):
                    raise item.error
                if isinstance(item, Reconnected):
                    continue
                kind = event_kind(item)
                if not started:
                    if kind == "speech_started" or (
                        isinstance(item, User) and item.source == "audio"
                    ):
                        started = True
                    elif isinstance(item, Error) and item.seq <= self._conn.last:
                        yield item  # a refusal of our frames
                        return
                    else:
                        call_hook(self.hooks.on_event, item)
                        continue
                if tracker.ends_before(kind):
                    call_hook(self.hooks.on_event, item)
                    return
                yield item
                if tracker.feed(kind, item.code if isinstance(item, Error) else ""):
                    return
        finally:
            self._end_turn()
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender

    async def _turn(self, text: str | None) -> AsyncIterator[Event]:
        """The events of a turn this client starts: with ``text``, or none (``reply``)."""
        self._conn.raise_if_failed()
        while not self._conn.queue.empty():  # what came before this turn is not part of it
            item = self._conn.queue.get_nowait()
            if isinstance(item, Failed):
                raise item.error
        ref = self._confirming.new_id("reply")
        payload = _encoder.encode(
            UserMessage(content=text) if text is not None else ReplyNow(id=ref)
        )
        sent_on, after = await self._conn.send(payload), self._conn.last  # the seq seen then
        started, tracker = False, TurnTracker()
        while True:
            try:
                if tracker.closing:
                    async with asyncio.timeout(self.timing.metric_grace):
                        item = await self._conn.queue.get()
                else:
                    item = await self._conn.queue.get()
            except TimeoutError:
                tracker.expire()
                return
            if isinstance(item, Failed):
                raise item.error
            if isinstance(item, Reconnected):
                lost = item.session.seq == item.after and item.generation > sent_on
                if not started and lost:
                    sent_on = await self._conn.send(payload)
                continue
            if not started:
                if (
                    isinstance(item, Guardrail)
                    and item.on == "input"
                    and item.seq > after
                    and item.reply_to is msgspec.UNSET  # ours: a message this turn sent
                ):
                    yield item  # blocked (no turn: the model never got it), or redacted
                    if item.action != "redact":
                        return
                    text = ""  # its echo is the redacted text
                elif item.seq > after and (
                    (isinstance(item, User) and text in ("", item.content))
                    or (isinstance(item, Replying) and text is None and item.reply_to == ref)
                ):
                    started = True
                    tracker.feed("user")
                    yield item
                elif (
                    isinstance(item, Error)
                    and item.code in REFUSAL_CODES
                    and item.seq <= self._conn.last  # an unlogged reply to our frame
                ):
                    yield item
                    return
                else:
                    call_hook(self.hooks.on_event, item)  # not this turn's
                continue
            kind = event_kind(item)
            if tracker.ends_before(kind):
                call_hook(self.hooks.on_event, item)
                return
            yield item
            if tracker.feed(kind, item.code if isinstance(item, Error) else ""):
                return

    def _end_turn(self) -> None:
        """The turn's iterator is done: what it left unread goes to ``on_event``."""
        self._in_turn = False
        while not self._conn.queue.empty():
            item = self._conn.queue.get_nowait()
            if not isinstance(item, Reconnected | Failed):  # a failure is in _failure
                call_hook(self.hooks.on_event, item)

    # ------------------------------------------------------------------ what is read

    def _receive(self, event: Event, logged: bool) -> None:
        """Each event the connection delivers: to a waiting command, the turn's iterator
        or ``on_event`` (an unlogged ``error`` may answer one of this client's frames)."""
        if not logged and isinstance(event, Error) and self._answers_own_frame(event):
            return  # a reply configure(), played() or approve() takes
        self._confirming.seen(event)
        if isinstance(event, SpeechStopped) or (
            isinstance(event, User) and event.source == "audio"
        ):
            self._speech_ended.set()
        elif isinstance(event, SpeechStarted):
            self._speech_ended.clear()
        self._calls.seen(event)
        if self._in_turn:
            self._conn.queue.put_nowait(event)  # the turn's iterator decides
        else:
            call_hook(self.hooks.on_event, event)

    def _answers_own_frame(self, error: Error) -> bool:
        """Whether an unlogged error reply answers ``played`` (dropped silently: the
        gateway does not know it yet), a pending ``approve`` or ``configure`` (raised
        there): matched by its ``reply_to``, the frame's ``id``."""
        # A gateway older than ``played`` names no command either: ``played`` is
        # the only type this client sends that some gateway may not know.
        if error.code == "unknown_type" and error.reply_to in (_PLAYED_ID, msgspec.UNSET):
            self._played_supported = False
            return True
        if self._calls.refused(error):
            return True
        return self._confirming.refused(error)
