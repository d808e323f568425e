"""Stand-ins for what the session rooms talk to, where the real part cannot be made to.

The driver's turns run on the in-process simulator and the real ``LogWriter`` on
the memory store (tests/sessions/test_driver.py), and ``UpstreamLink`` opens real
adapters on it (``tests.sessions.sims``); what stays here, and why:

- ``Writer``: ``SessionLog`` is a state machine fed each append's outcome; its tests
  hand it ``StoreUnavailable``, ``LeaseLost`` and ``SeqConflict`` at chosen points,
  which no store produces on cue;
- ``Subscriber``: a client connection that records what reaches it;
- ``ScriptedUpstream``: a provider that drops only the first connection mid-answer,
  never answers a request, or has a bug (the simulator's faults hit every
  connection alike), and a sink that keeps the exact chunks ``VoiceInput`` hands
  it and the resume handles and positions ``UpstreamLink`` sets, which the
  simulator does not keep;
- ``ScriptedFactory``: makes them, one per connection, and counts them;
- ``Spawned``: a ``spawn`` that keeps the tasks, so a test can await them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from gateway.sessions.logwriter import Batch
from gateway.sessions.session_log import SessionLog
from gateway.store.base import LogEntry
from gateway.upstream.base import (
    ModelOptions,
    Resume,
    Upstream,
    UpstreamClosed,
    UpstreamEvent,
    UpstreamFactory,
    VoiceConfig,
)
from protocol.assembly import Message
from protocol.events import Error, Event, decode_event
from protocol.turn_events import ResponseDone, TextDelta

__all__ = [
    "ScriptedFactory",
    "ScriptedUpstream",
    "Spawned",
    "Subscriber",
    "Writer",
    "reply",
]


class Writer:
    """``LogWriter.mark`` and what follows it, driven by the test (``take``)."""

    def __init__(self) -> None:
        self.marked: list[SessionLog] = []
        self.batches: list[Batch] = []
        self.marks = asyncio.Event()
        self.hurried: list[list[SessionLog]] = []  # what was marked at each ``hurry``

    def mark(self, source: SessionLog) -> None:
        self.marked.append(source)
        self.marks.set()

    def hurry(self, source: SessionLog | None = None) -> None:
        self.hurried.append(list(self.marked))

    def take(self) -> tuple[SessionLog, Batch | None]:
        """The oldest mark's batch, as the writer would take it for an append."""
        source = self.marked.pop(0)
        if not self.marked:
            self.marks.clear()
        batch = source.take_batch()
        if batch is not None:
            self.batches.append(batch)
        return source, batch


class Subscriber:
    """A client connection: what was delivered, noticed, heard and why it was let go."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []
        self.notices: list[Error] = []
        self.audio: list[bytes] = []
        self.lost: list[str] = []

    @property
    def events(self) -> list[Event]:
        return [decode_event(entry.data) for entry in self.entries]

    def deliver(self, entries: Sequence[LogEntry]) -> None:
        self.entries.extend(entries)

    def notify(self, event: Error) -> None:
        self.notices.append(event)

    def deliver_audio(self, frame: bytes) -> None:
        self.audio.append(frame)

    def session_lost(self, reason: str) -> None:
        self.lost.append(reason)

    def switch_source(self, source: object) -> None:  # pragma: no cover - not used here
        raise AssertionError("a subscriber of a driven session is not switched")


Reply = Sequence[UpstreamEvent | UpstreamClosed] | UpstreamClosed


def reply(text: str, *, output: int = 5) -> list[UpstreamEvent]:
    """One response: ``text`` as one delta, then its end with usage."""
    from protocol.events import Usage

    return [TextDelta(text), ResponseDone("completed", Usage(input=10, output=output))]


class ScriptedUpstream(Upstream):
    """Answers each ``start_response`` with the next reply of ``script``.

    A reply is a list of events read by ``recv`` in order (an ``UpstreamClosed``
    among them is raised when its turn comes: the connection broke there). A
    reply without a ``ResponseDone`` leaves ``recv`` waiting (a response still
    streaming, or stopped: ``cancel_response`` ends it as the provider would).
    """

    provider = "scripted"

    def __init__(self, script: Iterable[Reply] = (), *, resumes: bool = False) -> None:
        self.script: deque[Reply] = deque(script)
        self.resumes = resumes
        self.calls: list[str] = []
        self.opened_with: tuple[str, list[Message], VoiceConfig | None, Resume | None] | None = None
        self.messages: list[Message] = []
        self.audio: list[bytes] = []
        self.closed = False
        self._events: asyncio.Queue[UpstreamEvent | UpstreamClosed] = asyncio.Queue()
        self._position = 0

    async def open(
        self,
        instructions: str,
        history: Sequence[Message],
        *,
        voice: VoiceConfig | None = None,
        resume: Resume | None = None,
        options: ModelOptions | None = None,
    ) -> None:
        self.calls.append("open")
        self.opened_with = (instructions, list(history), voice, resume)

    @property
    def position(self) -> int:
        return self._position

    @property
    def resumed(self) -> bool:
        return self.resumes and self.opened_with is not None and self.opened_with[3] is not None

    async def add_message(self, message: Message) -> None:
        self.calls.append("add_message")
        self.messages.append(message)

    async def start_response(self) -> None:
        self.calls.append("start_response")
        if not self.script:
            return  # nothing scripted: the response never comes (a stalled model)
        answer = self.script.popleft()
        events = [answer] if isinstance(answer, UpstreamClosed) else answer
        for event in events:
            self._events.put_nowait(event)
        if events and isinstance(events[-1], ResponseDone):
            self._position += 1

    async def cancel_response(self) -> None:
        self.calls.append("cancel_response")
        self._events.put_nowait(ResponseDone("cancelled"))

    async def replace_response(self, text: str, *, heard_ms: int | None = None) -> None:
        self.calls.append("replace_response")

    async def send_audio(self, pcm16: bytes) -> None:
        self.audio.append(pcm16)

    async def commit_audio(self) -> None:
        self.calls.append("commit_audio")

    async def send_function_output(self, call_id: str, output: str) -> None:
        self.calls.append("send_function_output")

    async def recv(self) -> UpstreamEvent:
        event = await self._events.get()
        if isinstance(event, UpstreamClosed):
            raise event
        return event

    async def close(self) -> None:
        self.calls.append("close")
        self.closed = True


class ScriptedFactory(UpstreamFactory):
    """One ``ScriptedUpstream`` per connection, each with the next script of ``scripts``."""

    def __init__(
        self,
        *scripts: Sequence[Reply],
        provider: str = "scripted",
        model: str = "scripted-model",
        wire: str = "openai",
    ) -> None:
        self.scripts = deque(scripts)
        self.provider = provider
        self.model = model
        self.wire = wire
        self.made: list[ScriptedUpstream] = []
        self.failures: list[tuple[str, bool]] = []

    def create(self) -> ScriptedUpstream:
        upstream = ScriptedUpstream(self.scripts.popleft() if self.scripts else ())
        self.made.append(upstream)
        return upstream

    def failed(self, provider: str, *, fatal: bool) -> str:
        self.failures.append((provider, fatal))
        return provider


class Spawned:
    """``spawn(coro, name)`` that keeps its tasks; ``await spawned.done()`` runs them out."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []
        self.names: list[str] = []

    def __call__(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self.names.append(name)
        self.tasks.append(asyncio.create_task(coro, name=name))

    async def done(self) -> None:
        await asyncio.gather(*self.tasks)
