"""One session driven by this node: the event log writer and the turn loop.

A ``SessionRuntime`` exists on the node that holds the session's lease. It owns
the upstream connection, numbers every event (``seq``), logs it, and only then
hands it to the attached client connections (**log, then send**). Appends are
group-committed: events emitted while an append is in flight go out together in
the next one, so a token costs a share of a round trip, not a round trip.

The turn itself is decided by ``protocol.turn.TurnMachine``; this module is
its I/O shell. Commands (``start_turn``, ``cancel_turn``, ``tool_result``,
``rerun_interrupted``, ``configure``) feed the machine and hand its actions to
the turn driver (``_drive``), one task per running turn, which performs them
in order — events and history at once, upstream requests, tools and backoffs
awaited — and feeds the machine what the upstream, the tools and the timers
bring. A cancel interrupts the driver's current await; the actions it had not
performed yet are superseded.

**Client-side tools**: while the machine waits for a client's ``tool_result``
(``awaits_client``), the driver waits for a command to bring one, up to
``client_tool_timeout`` seconds after the batch began (server calls of the
same batch run meanwhile), then feeds ``ClientTimeout``. A voice session keeps
reading its upstream meanwhile, so the user's speech still barges in.

**Voice** (``set_voice``): a session that streams audio keeps its upstream
connection open between turns, and the driver keeps running while a client
is attached, reading the upstream's voice events when no turn runs too: the
provider's VAD starts turns by itself. User audio goes straight from the
client's connection to the upstream (``send_audio``); the model's audio goes
straight to the attached clients, unlogged (``protocol.audio``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.pricing import PriceTable
from gateway.sessions.limits import Limits
from gateway.sessions.logwriter import Batch, LogWriter
from gateway.sessions.observer import TurnObserver
from gateway.sessions.resumption import META_KEY, ResumePoint
from gateway.sessions.subscriber import Subscriber
from gateway.sessions.voice import HELD_AUDIO_SECONDS, HeldAudio, voice_config
from gateway.store.base import LeaseLost, LogEntry, SeqConflict, Store, StoreError, StoreUnavailable
from gateway.tracing import Tracing
from gateway.upstream.base import (
    AudioDelta,
    Resumable,
    Resume,
    Upstream,
    UpstreamClosed,
    UpstreamError,
    UpstreamEvent,
    UpstreamFactory,
    VoiceConfig,
    Woken,
)
from gateway.upstream.models import facts
from protocol.assembly import HistoryItem, Message, assemble, encode_history_item
from protocol.audio import audio_frame
from protocol.budget import context_tokens_estimate, fit
from protocol.calls import ToolCall, ToolResult
from protocol.configuration import ConfigChange, SessionConfig, apply_change
from protocol.events import (
    Configured,
    Error,
    Event,
    Interrupt,
    Metric,
    ToolResultMessage,
    Usage,
    encode,
)
from protocol.prompt import native_prompt
from protocol.turn import TurnMachine, TurnState, turn_in_flight
from protocol.turn_events import (
    EVENT_TYPES,
    Account,
    Action,
    AwaitClient,
    Backoff,
    Cancel,
    ClientTimeout,
    Commit,
    CommitAudio,
    DropUpstream,
    Persist,
    Refuse,
    ReplaceResponse,
    Request,
    Rerun,
    ResponseDone,
    RetryNow,
    RunTools,
    ShellFailed,
    Shutdown,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    StopResponse,
    TextDelta,
    Thought,
    ToolsDone,
    TurnStarted,
    UpstreamFailed,
    UpstreamLost,
    UserMessage,
)
from tools.allowlist import AllowList
from tools.base import ToolContext
from tools.client import ClientToolProblem, ClientTools, prepare
from tools.executor import CallObserver, Executor
from tools.output import cap_output

__all__ = ["SessionHost", "SessionRuntime", "SessionServices", "SessionSetup"]

log = logging.getLogger("gateway.sessions.runtime")

# The actions the driver awaits; a cancel supersedes those not yet performed.
_AWAITED: Final = frozenset(
    {Request, CommitAudio, StopResponse, ReplaceResponse, RunTools, AwaitClient, Backoff}
)
_COMMIT: Final = Commit()
_CANCEL: Final = Cancel()
_RETRY_NOW: Final = RetryNow()
# How long a cancelled response may take to report its end (and usage) before
# the turn closes with an estimate: OpenAI answers a response.cancel within a
# round trip; the Gemini adapter bounds its own wait by its cancel_grace.
_CANCEL_REPORT_WAIT: Final = 5.0
# What clients are told of upstream failures. The real reason goes to the log
# only: it may carry the upstream URL (with a key in its query string) or the
# provider's own text (account ids, internal hosts).
_LOST_REASON: Final = "connection failed"
_FAILED_MESSAGE: Final = (
    "the request failed at the provider; send your message again, and if it keeps "
    "failing tell the operator (the gateway's log has the details)"
)
# Provider codes and reasons that are plain identifiers (rate_limit_exceeded,
# max_output_tokens) help the client and are passed on; other text is not.
# A voice session listening between turns whose upstream cannot be opened
# retries after these many seconds (doubling from the first, up to the cap):
# at once in a loop it held a core at 100% and told the client nothing.
_LISTEN_RETRY_FIRST: Final = 0.5
_LISTEN_RETRY_CAP: Final = 10.0
_LISTEN_UNREACHABLE: Final = (
    "the model's API cannot be reached: audio sent now is not heard; "
    "the gateway keeps trying and the session goes on when it answers"
)
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True, slots=True)
class SessionSetup:
    """What one session's own configuration makes of the node's services.

    Built by the node (``Node.setup``) from the session's ``SessionConfig``,
    its owner's key policy and its key's allow-list of tools, on every node
    that drives it, so a reconnect or a takeover gives the model the same
    prompt, tools and provider.
    """

    config: SessionConfig
    system_prompt: str  # protocol + operator + key policy + session instructions, with tools
    upstream_factory: UpstreamFactory  # the session's provider and model
    server_tools: frozenset[str] | None = None  # the server tools it may run; None: all
    # The client tools it declared (those its key allows): the turn machine's router.
    client_tools: ClientTools = field(default_factory=lambda: ClientTools(()))
    # Its API key's allow-list of tools (``tools=`` in the keys file), stored with the
    # session so every node applies the same one; None: every tool.
    key_tools: AllowList | None = None
    # Operator + key policy + session instructions: all a model that does not write the
    # text protocol (it speaks; its tools are declared natively) is told.
    instructions: str = ""


@dataclass(frozen=True, slots=True)
class SessionServices:
    """What every session on a node shares: settings, metrics and the node's workers."""

    config: Config
    metrics: Metrics
    log_writer: LogWriter
    limits: Limits
    executor: Executor
    upstream_factory: UpstreamFactory
    system_prompt: str
    tool_context: Callable[[str], ToolContext]
    store: Store
    prices: PriceTable
    tracing: Tracing
    # The setup of a configuration for an owner (key id) and its key's allow-list of
    # tools, or why it is refused.
    session_setup: Callable[[str, SessionConfig, AllowList | None], SessionSetup | str]
    store_retry_delay: float = 0.5


class SessionHost(Protocol):
    """How a runtime calls up to the node that drives it: four calls, no node object."""

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` in the background, owned (and cancelled on stop) by the node."""

    def runtime_idle(self, runtime: SessionRuntime) -> None:
        """The runtime may have no client and no turn left: the node may let it go."""

    def runtime_closed(self, runtime: SessionRuntime, *, release: bool) -> None:
        """The runtime stopped: forget it and, if ``release``, free its lease."""

    def runtime_configured(self, runtime: SessionRuntime) -> None:
        """The session's configuration changed: store it with the session."""


class SessionRuntime:
    """The live state of one session on the node that drives it."""

    def __init__(
        self,
        host: SessionHost,
        services: SessionServices,
        sid: str,
        *,
        last_seq: int,
        history: list[HistoryItem],
        usage: Usage,
        cost: float = 0.0,
        setup: SessionSetup,
        owner: str = "",
        clock: Callable[[], float] = time.time,
        resume: ResumePoint | None = None,
    ) -> None:
        self.host = host
        self.services = services
        self.sid = sid
        self.owner = owner  # the key id that owns the session (its policy applies)
        # The provider's own copy of the conversation, to continue on the next connection,
        # and where its positions are in the history (position at a turn's end → items).
        self._resume_point = resume
        self._positions: dict[int, int] = {}
        self.setup = setup
        self._opened_with: SessionSetup | None = None  # the setup the upstream was opened with
        self.history = history
        cfg = services.config
        self.machine = TurnMachine(
            total=usage,
            max_steps=cfg.max_steps,
            upstream_retries=cfg.upstream_retries,
            client_tools=setup.client_tools,
            call_number=last_seq,
        )
        self._wake = asyncio.Event()  # a command queued actions for the driver
        self._client_deadline = 0.0  # loop time when the client-side calls time out
        factory = setup.upstream_factory
        # Cost and spans of the turns: what each Account costs, and the traces.
        self.observer = TurnObserver(
            services.tracing,
            services.prices,
            services.metrics,
            sid=sid,
            provider=factory.provider,
            model=factory.model,
            owner=owner,
            cost_total=cost,
        )
        self._clock = clock
        self._seq = last_seq
        self.delivered_seq = last_seq
        self._pending: list[LogEntry] = []
        self._pending_history: list[bytes] = []
        self._marked = False  # waiting in the node's LogWriter for its turn
        self._lost = False  # another node owns the session: write nothing more
        # A batch whose append failed with StoreUnavailable (may have landed).
        self.unsure: Batch | None = None
        self._flushed = asyncio.Event()
        self._flushed.set()
        self.subscribers: set[Subscriber] = set()
        self.upstream: Upstream | None = None
        self._provider = ""  # the provider of the upstream connection opened last
        # The turn driver: performs the machine's actions while a turn runs.
        self.turn: asyncio.Task[None] | None = None
        self._todo: deque[Action] = deque()  # actions the driver performs next, in order
        self._driving = False  # the driver task has started running
        self._interrupted = False  # a cancel interrupted the driver's await
        self._in_upstream_call = False  # the driver awaits a request to the upstream
        self._requested_at: float | None = None  # when the last response was requested
        # The upstream handing deltas to ``_text_now``, and what that failed with.
        self._streaming_to: Upstream | None = None
        self._text_failure: Exception | None = None
        self._store_down = False
        self.closed = False
        # Audio in and/or out, from the stored configuration (set_voice changes it).
        self.voice: VoiceConfig | None = self._voice_of(setup)
        self.machine.voice = self.voice is not None
        # The driver reads the upstream with nothing else to do (no turn, or a wait for
        # client results): a command interrupts that read (_wake_driver).
        self._listening_idle = False
        # Opens of a listening voice session's upstream that failed in a row.
        self._listen_failures = 0
        # The user's audio that came while no upstream was open; not while an
        # open that failed is waited out (``_listen_later``): that audio is lost.
        self._held_audio = self._held_audio_for(self.voice)
        self._holding_audio = True
        self._heard_at = -math.inf  # time.monotonic() of the user's last audio
        # Upstream events read while tools ran (``_hear_during_tools``), for the
        # driver's next reads, in order.
        self._heard: deque[UpstreamEvent | _Gone] = deque()

    # ------------------------------------------------------------------ log

    @property
    def last_seq(self) -> int:
        """The seq of the newest event emitted (logged or about to be)."""
        return self._seq

    def emit(self, event: Event) -> None:
        """Number, stamp and queue an event for logging, then delivery."""
        self._seq += 1
        event.seq = self._seq
        event.timestamp = self._clock()
        self._pending.append(LogEntry(self._seq, encode(event)))
        if not self._marked:
            self._mark()

    def persist(self, items: Sequence[HistoryItem]) -> None:
        """Add history items; they are written with the next log append (atomically)."""
        for item in items:
            self.history.append(item)
            self._pending_history.append(encode_history_item(item))
        if not self._marked:
            self._mark()

    def _mark(self) -> None:
        self._marked = True
        self._flushed.clear()
        self.services.log_writer.mark(self)

    async def flushed(self) -> None:
        """Wait until everything emitted so far is logged and delivered."""
        await self._flushed.wait()

    # The LogWriter's side: it takes a batch, writes it, and reports back.

    def take_batch(self) -> Batch | None:
        """What to append now (None: nothing). Called by the node's LogWriter."""
        self._marked = False
        if self._lost:
            return None
        entries, history = self._pending, self._pending_history
        self._pending, self._pending_history = [], []
        if not entries and not history and self.unsure is None:
            self._check_flushed()
            return None
        return entries, history

    def settle_unsure(self, stored_last: int, batch: Batch) -> Batch | None:
        """After a failed append: ``stored_last`` tells whether it landed after all.

        A batch whose append failed in flight may or may not be stored (Redis
        may have run it before the connection broke): never sent twice, never lost.
        """
        unsure, self.unsure = self.unsure, None
        assert unsure is not None
        if unsure[0] and stored_last >= unsure[0][-1].seq:
            self._delivered(unsure[0])  # it landed: just send it
        else:
            batch = (unsure[0] + batch[0], unsure[1] + batch[1])
        if not batch[0] and not batch[1]:
            self._check_flushed()
            return None
        return batch

    def appended(self, batch: Batch, result: BaseException | None) -> None:
        """The LogWriter's report on ``batch``: stored (None) or why not."""
        if result is None:
            if self._store_down:
                self._store_down = False
                log.info("store is back for session %s", self.sid)
            self._delivered(batch[0])
            self._check_flushed()
        elif isinstance(result, LeaseLost | SeqConflict):
            log.warning("session %s: lost ownership while logging: %s", self.sid, result)
            self._lost = True
            self._pending, self._pending_history = [], []
            self._flushed.set()
            self.lose(str(result))
        else:
            # StoreUnavailable (or an unexpected error): hold the batch, in
            # order, and retry; nothing reaches a client before it is logged.
            held = self.unsure  # still unsettled if the log could not be read
            self.unsure = batch if held is None else (held[0] + batch[0], held[1] + batch[1])
            if isinstance(result, StoreUnavailable):
                self._store_unavailable(result)
            else:
                log.error("session %s: appending failed: %r", self.sid, result)
            asyncio.get_running_loop().call_later(self.services.store_retry_delay, self._retry)

    def write_failed(self) -> None:
        """The LogWriter broke on this session's batch (a bug): reload it elsewhere."""
        self._lost = True
        self._flushed.set()
        self.lose("internal error while logging")

    def _retry(self) -> None:
        if not self._marked and not self._lost:
            self._mark()

    def _check_flushed(self) -> None:
        if (
            not self._marked
            and self.unsure is None
            and not self._pending
            and not self._pending_history
        ):
            self._flushed.set()

    def _delivered(self, entries: list[LogEntry]) -> None:
        """Entries are in the log: hand them to the attached clients."""
        if not entries:
            return
        self.delivered_seq = entries[-1].seq
        self.services.metrics.events.inc(len(entries))
        for sub in tuple(self.subscribers):
            sub.deliver(entries)

    def _store_unavailable(self, exc: StoreUnavailable) -> None:
        if self._store_down:
            return
        self._store_down = True
        self.services.metrics.store_errors.inc()
        log.warning("store unavailable for session %s: %s", self.sid, exc)
        self._notify(
            Error(
                code="store",
                content=(
                    "the session store is unavailable; events are held and "
                    "will be delivered when it returns — stay connected"
                ),
                seq=self.delivered_seq,
                timestamp=self._clock(),
            )
        )

    def _notify(self, event: Error) -> None:
        for sub in tuple(self.subscribers):
            sub.notify(event)

    # ------------------------------------------------------------------ subscribers

    def attach(self, sub: Subscriber) -> None:
        self.subscribers.add(sub)
        if self.voice is not None:
            self._listen()

    def detach(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers:
            self._wake_driver()  # a voice driver with nobody to listen to stops
        self.host.runtime_idle(self)

    # ------------------------------------------------------------------ commands

    @property
    def usage(self) -> Usage:
        """The session's token usage so far (the turn machine's total)."""
        return self.machine.meter.total

    def start_turn(self, text: str) -> Error | None:
        """Start a turn with the user's text; an ``Error`` reply if one is running.

        After the model's ``<end>`` or a cancel, the turn only waits for its
        usage report: a message sent then starts right after it (the machine
        queues it) instead of being refused.
        """
        if self.closed:
            return Error(code="internal", content="session is closing; reconnect and resend")
        return self._command(self.machine.feed(UserMessage(content=text)), interrupt=False)

    def cancel_turn(self) -> Error | None:
        """Cancel the running turn; an ``Error`` reply if there is none."""
        return self._command(self.machine.feed(_CANCEL), interrupt=True)

    def tool_result(self, answer: ToolResultMessage) -> Error | None:
        """A client answered a client-side call; an ``unknown_call`` error if none waits for it.

        Its content is cut to the node's ``tool_max_output`` like a server tool's.
        """
        content = cap_output(answer.content, self.services.config.tool_max_output)
        given = msgspec.structs.replace(answer, content=content)
        return self._command(self.machine.feed(given), interrupt=False)

    async def configure(self, change: ConfigChange) -> Error | None:
        """Apply a ``configure``: checked, logged (``configured``), stored; an ``Error`` if refused.

        The one place a session's configuration changes. Takes effect at the
        next model step: the upstream is reopened from history with the new
        prompt (and provider) then. Client tools change at once for calls the
        model makes from then on; calls already sent to the client still wait
        for their results. Their schemas are compiled off the loop (``prepare``)
        after the size limits passed (``apply_change``).
        """
        if self.closed:
            return Error(code="internal", content="session is closing; reconnect and resend")
        updated = apply_change(self.setup.config, change)
        if isinstance(updated, str):
            return Error(code="bad_frame", content=updated)
        problem = await prepare(updated.tools)
        if problem is not None:
            return Error(code="bad_frame", content=problem)
        if self.closed:
            return Error(code="internal", content="session is closing; reconnect and resend")
        updated = apply_change(self.setup.config, change)  # as it is now, after the wait
        if isinstance(updated, str):
            return Error(code="bad_frame", content=updated)
        setup = self.services.session_setup(self.owner, updated, self.setup.key_tools)
        if isinstance(setup, str):
            code = "bad_frame" if isinstance(setup, ClientToolProblem) else "forbidden"
            return Error(code=code, content=str(setup))
        self._apply_setup(setup)
        return None

    def rights_changed(self, setup: SessionSetup) -> None:
        """The owner's rights changed (the operator's key policy): ``setup`` from the
        next model step, as ``configure`` applies a change, told to every client
        as ``configured`` and stored. Calls already sent to a client still wait;
        a server tool no longer allowed fails when it would run."""
        if self.closed:
            return
        self._apply_setup(setup)

    def _apply_setup(self, setup: SessionSetup) -> None:
        """A new setup from the next model step: logged as ``configured``, stored."""
        self.setup = setup
        self.machine.batch.router = setup.client_tools
        # Priced and traced as the provider and model it now uses.
        self.observer.provider = setup.upstream_factory.provider
        self.observer.model = setup.upstream_factory.model
        self.emit(Configured(config=setup.config))
        self.host.runtime_configured(self)
        self.set_voice(self._voice_of(setup))

    def _voice_of(self, setup: SessionSetup, *, speaks_only: bool = False) -> VoiceConfig | None:
        """The audio a configuration asks for, with the tools this session may call
        (server tools, then its client tools: both are declared natively).
        ``speaks_only``: the upstream's model answers in audio only (see ``voice_config``)."""
        allowed = setup.server_tools
        specs = [
            s
            for s in self.services.executor.registry.specs()
            if allowed is None or s.name in allowed
        ]
        return voice_config(
            setup.config, [*specs, *setup.client_tools.specs()], speaks_only=speaks_only
        )

    # ------------------------------------------------------------------ voice

    @property
    def listening(self) -> bool:
        """The driver keeps reading the upstream between turns (a voice session with a client)."""
        return self.voice is not None and bool(self.subscribers) and not self.closed

    def set_voice(self, voice: VoiceConfig | None) -> None:
        """Switch the session's audio (``None``: text only). The upstream is reopened
        with the new configuration (its context rebuilt from history) when next needed."""
        if voice == self.voice:
            return
        before = self.voice.audio_in if self.voice is not None else None
        after = voice.audio_in if voice is not None else None
        if after is None or before is None or after.rate != before.rate:
            self._held_audio = self._held_audio_for(voice)  # held audio at another rate: gone
        self.voice = voice
        self.machine.voice = voice is not None
        if self.machine.idle:
            self._drop_upstream(stop=False)
        self._listen()

    def _listen(self) -> None:
        """Make sure the driver runs (and reads the upstream between turns) if it should."""
        if not self.listening:
            return
        driver = self.turn
        if driver is None or driver.done():
            self._todo = deque()
            self.turn = asyncio.create_task(self._drive(), name=f"turn:{self.sid}")
        else:
            self._wake_driver()

    async def send_audio(self, pcm16: bytes) -> None:
        """User audio (PCM16 at ``AudioIn.rate``) to the provider. Audio that arrives
        while the connection is being opened is held and sent first once it is
        open (``HeldAudio``); audio that arrives while a failed open is waited
        out is dropped (the client was told: ``error`` code ``upstream``)."""
        if self.voice is None or self.voice.audio_in is None:
            return
        self._heard_at = time.monotonic()
        upstream = self.upstream
        if upstream is None:
            self._hold_audio(pcm16)
            return
        try:
            await upstream.send_audio(pcm16)
        except UpstreamClosed:
            return  # the driver's recv sees the loss and reopens

    def send_audio_now(self, pcm16: bytes) -> bool:
        """``send_audio`` without awaiting when the upstream socket takes it at once
        (or the audio is held); False: nothing was sent, await ``send_audio``."""
        voice = self.voice
        if voice is None or voice.audio_in is None:
            return False
        self._heard_at = time.monotonic()
        upstream = self.upstream
        if upstream is None:
            self._hold_audio(pcm16)
            return True
        return upstream.send_audio_now(pcm16)

    def quiet_for(self, seconds: float) -> bool:
        """No audio from this node's clients for ``seconds`` (no live microphone here)."""
        return time.monotonic() - self._heard_at >= seconds

    def _hold_audio(self, pcm16: bytes) -> None:
        held = self._held_audio
        if held is None or not self._holding_audio or self.closed:
            return
        was_full = held.dropped
        held.hold(pcm16)
        if held.dropped and not was_full:
            log.warning(
                "session %s: the upstream is still opening; only the newest %gs of the "
                "user's audio is held for it",
                self.sid,
                HELD_AUDIO_SECONDS,
                extra={"sid": self.sid},
            )

    @staticmethod
    def _held_audio_for(voice: VoiceConfig | None) -> HeldAudio | None:
        audio_in = voice.audio_in if voice is not None else None
        return HeldAudio.for_rate(audio_in.rate) if audio_in is not None else None

    async def _send_held_audio(self, upstream: Upstream) -> None:
        """The audio held while ``upstream`` was opened, oldest first; audio that
        comes meanwhile is held behind it, so the order holds."""
        held = self._held_audio
        if held is None:
            return
        while (chunk := held.take()) is not None:
            if not upstream.send_audio_now(chunk):
                await upstream.send_audio(chunk)
        held.clear()

    def commit_audio(self) -> Error | None:
        """End the user's spoken turn (turn detection ``none``); an ``Error`` reply if
        the session takes no audio or a turn runs."""
        voice = self.voice
        if voice is None or voice.audio_in is None or voice.audio_in.turn_detection != "none":
            return Error(
                code="bad_frame",
                content='commit ends a spoken turn when input_audio.turn_detection is "none"; '
                'configure that first (with "server_vad" the gateway commits by itself)',
            )
        return self._command(self.machine.feed(_COMMIT), interrupt=False)

    def _wake_driver(self) -> None:
        """Interrupt the driver's between-turns read, so it looks at its work again."""
        driver = self.turn
        if (
            self._listening_idle
            and driver is not None
            and self._driving
            and not self._interrupted
            and not driver.done()
        ):
            self._interrupted = True
            self._stop_text_now()
            driver.cancel()

    def _audio_out(self, pcm16: bytes) -> None:
        """The model's audio to the attached clients, tagged with the newest seq."""
        voice = self.voice
        if voice is None or voice.audio_out is None:
            return  # a text session on a model that only speaks: its transcript is the answer
        if self.machine.state is not TurnState.STREAMING:
            return  # the rest of a cancelled answer
        frame = audio_frame(self._seq, pcm16)
        for sub in tuple(self.subscribers):
            sub.deliver_audio(frame)

    def rerun_interrupted(self, reason: str) -> None:
        """After a takeover: if the last turn was in flight, mark it and rerun it.

        The rerun's span links to the cut turn's (``observer.follows``, from the meta).
        """
        if turn_in_flight(self.history):
            self._command(self.machine.feed(Rerun(reason)), interrupt=False)
        else:
            self.observer.follows = ""

    def _command(self, actions: Sequence[Action], *, interrupt: bool) -> Error | None:
        """Hand a command's actions to the driver (starting it if no turn runs)."""
        if not actions:
            return None  # queued behind the closing turn
        first = actions[0]
        if type(first) is Refuse:
            return first.error
        driver = self.turn
        if driver is None or driver.done():
            self._todo = deque(actions)
            self.turn = asyncio.create_task(self._drive(), name=f"turn:{self.sid}")
        elif interrupt:
            # The awaits the driver had not performed yet are superseded (its
            # events and history items stay: they are decided); its current
            # await is interrupted and it performs these actions next.
            kept = [action for action in self._todo if type(action) not in _AWAITED]
            self._todo = deque([*kept, *actions])
            if self._driving and not self._interrupted:
                self._interrupted = True
                self._stop_text_now()
                driver.cancel()
        else:
            self._todo.extend(actions)
            self._wake.set()
            self._wake_driver()
        return None

    # ------------------------------------------------------------------ the turn driver

    async def _drive(self) -> None:
        """Perform the machine's actions and feed it what the I/O brings, until no turn runs."""
        machine = self.machine
        task = asyncio.current_task()
        assert task is not None
        self._driving = True
        try:
            while True:
                try:
                    await self._perform_pending()
                    if machine.idle and self.upstream is not None:
                        # A turn's end: the provider's position now holds the whole history.
                        self._positions[self.upstream.position] = len(self.history)
                    if machine.idle and not self._todo and not self.listening:
                        return
                    if machine.awaits_upstream or (self.listening and not self._todo):
                        await self._pump_upstream()
                    elif machine.awaits_client:
                        await self._await_client()
                except asyncio.CancelledError:
                    if not self._interrupted or self.closed:
                        raise
                    # A cancel: the superseded action may have left the upstream
                    # mid-request, in a state nobody knows: let it go.
                    self._interrupted = False
                    task.uncancel()
                    if self._in_upstream_call:
                        self._in_upstream_call = False
                        self._drop_upstream(stop=True)
                except UpstreamClosed as exc:
                    idle = machine.idle
                    self._upstream_gone(exc.reason, retryable=exc.retryable)
                    if idle and self.listening and not self._todo:
                        await self._listen_later()
                except Exception as exc:
                    log.exception("session %s: turn failed", self.sid)
                    self._todo = deque(machine.feed(ShellFailed(type(exc).__name__)))
        finally:
            self.observer.turn_ended()
            self._driving = False
            self._interrupted = False
            self._listening_idle = False
            if self.turn is task:
                self.turn = None
            self.host.runtime_idle(self)

    async def _await_client(self) -> None:
        """Wait for a command (a client's result, a cancel) or the client-side calls' timeout."""
        self._wake.clear()
        if self._todo:
            return
        remaining = self._client_deadline - asyncio.get_running_loop().time()
        if remaining > 0:
            try:
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
                return
            except TimeoutError:
                pass
        self._client_timed_out()

    def _client_timed_out(self) -> None:
        seconds = self.services.config.client_tool_timeout
        log.info("session %s: client-side calls unanswered after %gs", self.sid, seconds)
        self._todo.extend(self.machine.feed(ClientTimeout(seconds)))

    def _upstream_gone(self, reason: str, *, retryable: bool = True) -> None:
        self.observer.step_done(None, error=reason)
        self._drop_upstream(stop=False)
        self.services.metrics.upstream_errors.inc()
        log.warning("session %s: upstream lost (%s)", self.sid, reason)
        fatal = not retryable
        fallback = self._fallback(fatal=fatal)
        lost = UpstreamLost(_LOST_REASON, fatal=fatal, fallback=fallback)
        self._todo = deque(self.machine.feed(lost))

    async def _listen_later(self) -> None:
        """Wait before a listening voice session opens its upstream again.

        The first failure in a row is told to the client (``error`` code
        ``upstream``); the wait doubles up to ``_LISTEN_RETRY_CAP`` and ends
        early when a command comes (``_wake_driver`` cancels it)."""
        self._listen_failures += 1
        failures = self._listen_failures
        if failures == 1:
            self.emit(Error(code="upstream", content=_LISTEN_UNREACHABLE))
        delay = min(_LISTEN_RETRY_FIRST * 2 ** (failures - 1), _LISTEN_RETRY_CAP)
        self._listening_idle = True
        # Not heard, as the client was told: audio of the wait is not held for later.
        if self._held_audio is not None:
            self._held_audio.clear()
        self._holding_audio = False
        try:
            await asyncio.sleep(delay)
        finally:
            self._listening_idle = False
            self._holding_audio = True

    def _fallback(self, *, fatal: bool) -> str:
        """Report the failure to the session's providers; the one to use next if it changes."""
        factory = self.setup.upstream_factory
        provider = self._provider or factory.provider
        chosen = factory.failed(provider, fatal=fatal)
        if chosen == provider:
            return ""
        log.warning("session %s: falling back from %s to %s", self.sid, provider, chosen)
        return chosen

    async def _perform_pending(self) -> None:
        """Perform queued actions in order; events and history first, awaits last."""
        todo = self._todo
        while todo:
            action = todo.popleft()
            kind = type(action)
            if kind in EVENT_TYPES:
                if kind is Metric:
                    self.observer.fill(action)  # type: ignore[arg-type]
                elif kind is Error:
                    self.observer.turn_failed(action.code)  # type: ignore[union-attr]
                elif kind is Interrupt and self.upstream is None:
                    await self._reopen_for(action, todo[0] if todo else None)  # type: ignore[arg-type]
                    continue
                self.emit(action)  # type: ignore[arg-type]
            elif kind is Persist:
                self.persist(action.items)  # type: ignore[union-attr]
            elif kind is Account:
                self._account(action.usage)  # type: ignore[union-attr]
            elif kind is TurnStarted:
                self.services.metrics.turns.inc()
                self._turn_started()
            elif kind is DropUpstream:
                self._drop_upstream(stop=action.stop)  # type: ignore[union-attr]
            elif kind is AwaitClient:
                loop_time = asyncio.get_running_loop().time()
                self._client_deadline = loop_time + self.services.config.client_tool_timeout
                self.services.metrics.tool_calls.inc(len(action.ids))  # type: ignore[union-attr]
            elif kind is Request:
                await self._request(action.message, action.outputs)  # type: ignore[union-attr]
            elif kind is CommitAudio:
                upstream = self.upstream
                if upstream is None:
                    raise UpstreamClosed("the connection that heard the speech is gone")
                self._in_upstream_call = True
                self._requested_at = time.perf_counter()
                await upstream.commit_audio()
                self._in_upstream_call = False
            elif kind is StopResponse:
                upstream = self.upstream
                if upstream is None:
                    raise UpstreamClosed("no upstream connection to stop a response on")
                self._in_upstream_call = True
                await upstream.cancel_response()
                self._in_upstream_call = False
            elif kind is ReplaceResponse:
                await self._replace(action.text)  # type: ignore[union-attr]
            elif kind is RunTools:
                results = await self._run_tools_hearing(action.calls)  # type: ignore[union-attr]
                todo.extend(self.machine.feed(ToolsDone(tuple(results))))
            elif kind is Backoff:
                log.info(
                    "session %s: retrying the step (%d/%d)",
                    self.sid,
                    action.attempt,  # type: ignore[union-attr]
                    self.services.config.upstream_retries,
                )
                await asyncio.sleep(action.delay)  # type: ignore[union-attr]
                todo.extend(self.machine.feed(_RETRY_NOW))
            else:  # Refuse: only commands get it, and they answer it themselves
                log.warning("session %s: unexpected action %r", self.sid, action)

    async def _reopen_for(self, interrupt: Interrupt, then: Action | None) -> None:
        """An ``interrupt`` whose rerun opens a new connection says what the model keeps
        (``context``). Rerun at once (a takeover): the connection is opened first and
        the event says what happened; after a backoff (a lost connection): what will
        happen, by the resumption handle the session holds. Sent whether or not the
        open works (its failure is the rerun's own, reported as ever)."""
        try:
            if type(then) is Request:
                upstream = await self._open_upstream()
                interrupt.context = "resumed" if upstream.resumed else "rebuilt"
            else:
                chosen = self.setup.upstream_factory.choose()
                interrupt.context = "resumed" if self._resume_for(chosen) else "rebuilt"
        finally:
            self.emit(interrupt)

    def _turn_started(self) -> None:
        traceparent = self.observer.turn_started()
        if traceparent:
            # Kept with the session so a node that takes it over links its rerun here.
            self.host.spawn(self._remember({"traceparent": traceparent}), f"meta:{self.sid}")

    async def _remember(self, fields: dict[str, str]) -> None:
        try:
            await self.services.store.set_meta(self.sid, fields)
        except StoreError as exc:
            log.info("session %s: could not store %s: %s", self.sid, ", ".join(fields), exc)

    async def _request(
        self, message: Message | None, outputs: Sequence[tuple[str, str]] = ()
    ) -> None:
        self._in_upstream_call = True
        self.observer.step_started()
        upstream = self.upstream
        setup = self.setup
        if upstream is not None and self._opened_with is not setup:
            # Configured since it was opened: reopen with the new prompt and provider.
            self._drop_upstream(stop=False)
            upstream = None
        if upstream is None:
            # Fresh connection: history already ends with the prompt message.
            upstream = await self._open_upstream()
        elif message is not None:
            await upstream.add_message(message)
        else:
            for call_id, output in outputs:
                await upstream.send_function_output(call_id, output)
        self._requested_at = time.perf_counter()
        await upstream.start_response()
        self._in_upstream_call = False

    async def _open_upstream(self) -> Upstream:
        """The open upstream, or a fresh one whose context is rebuilt from history."""
        upstream = self.upstream
        if upstream is not None:
            return upstream
        self._in_upstream_call = True
        setup = self.setup
        chosen = setup.upstream_factory.choose()
        self._provider = chosen.provider
        # Priced and traced as the provider that answers (after a fallback: not the primary).
        self.observer.provider = chosen.provider
        self.observer.model = chosen.model
        upstream = chosen.create()
        # A model that only speaks answers a text session with the transcript of its
        # speech; it is told no text protocol and calls its tools natively.
        voice = self.voice
        if facts(chosen.wire, chosen.model).answers == "audio" and (
            voice is None or voice.audio_out is None
        ):
            voice = self._voice_of(setup, speaks_only=True)
        speaks = voice is not None and voice.audio_out is not None
        prompt = native_prompt(setup.instructions) if speaks else setup.system_prompt
        self.machine.voice = voice is not None
        resume = self._resume_for(chosen)
        with self.observer.connect():
            await upstream.open(prompt, self._context(prompt), voice=voice, resume=resume)
        point = self._resume_point
        # What the provider holds now, in history items: its position's anchor.
        held = point.items if resume is not None and upstream.resumed and point else 0
        self._positions = {upstream.position: held}
        try:
            await self._send_held_audio(upstream)
        except BaseException:
            self.host.spawn(_discard(upstream, stop=False), f"discard-upstream:{self.sid}")
            raise
        self.upstream = upstream
        self._opened_with = setup
        self._in_upstream_call = False
        self._listen_failures = 0
        return upstream

    def _resume_for(self, chosen: UpstreamFactory) -> Resume | None:
        point = self._resume_point
        if point is None:
            return None
        return point.resume(chosen.provider, chosen.model, self.history, self._clock())

    def _resumable(self, offer: Resumable) -> None:
        """The provider offers a handle to its copy of the conversation: kept with the
        session, if it was given at the end of a turn (its history items are known)."""
        items = self._positions.get(offer.position)
        if items is None:
            return  # given between two steps of a turn: the next turn's end brings another
        point = ResumePoint(self._provider, self.observer.model, offer.handle, items, self._clock())
        self._resume_point = point
        self.host.spawn(self._remember({META_KEY: point.encode()}), f"meta:{self.sid}")

    def _context(self, system_prompt: str) -> list[Message]:
        """The history a new upstream connection is given, cut to ``context_tokens``.

        A long session replayed whole on every reconnect or takeover costs time
        and tokens and may not fit the model's context at all (``protocol.budget``).
        """
        messages = assemble(self.history)
        budget = self.services.config.context_tokens
        if not budget:
            return messages
        prompt = context_tokens_estimate(system_prompt)
        kept = fit(messages, max(0, budget - prompt))
        if len(kept) < len(messages):
            log.info(
                "session %s: replaying %d of %d messages (context budget %d tokens)",
                self.sid,
                len(kept),
                len(messages),
                budget,
            )
        return kept

    async def _replace(self, text: str) -> None:
        upstream = self.upstream
        if upstream is None:
            return  # the next request reopens from history, which says the same
        self._in_upstream_call = True
        try:
            await upstream.replace_response(text)
        except UpstreamClosed:
            self._drop_upstream(stop=False)
        self._in_upstream_call = False

    async def _pump_upstream(self) -> None:
        """Feed the upstream's events to the machine until one calls for an action."""
        upstream = self.upstream
        if upstream is None:
            if not self.listening:
                raise UpstreamClosed("no upstream connection")
            upstream = await self._open_upstream()
        machine = self.machine
        text = machine.text
        emit = self.emit
        todo = self._todo
        first = self._requested_at is not None
        inline = upstream.stream_text_to(None)
        heard = self._heard
        while machine.awaits_upstream or self.listening:
            if todo:
                return  # a command came while the connection was opening
            if heard:
                read = heard.popleft()
                if isinstance(read, _Gone):
                    raise read.error
                ev = read
            elif machine.idle:
                self._listening_idle = True
                try:
                    ev = await upstream.recv()
                finally:
                    self._listening_idle = False
            elif machine.awaits_client:
                # Listening while the client works: its result (a command) interrupts.
                remaining = self._client_deadline - asyncio.get_running_loop().time()
                self._listening_idle = True
                try:
                    async with asyncio.timeout(max(remaining, 0.0)):
                        ev = await upstream.recv()
                except TimeoutError:
                    self._client_timed_out()
                    return
                finally:
                    self._listening_idle = False
            elif machine.state is TurnState.CANCELLING:
                try:
                    async with asyncio.timeout(_CANCEL_REPORT_WAIT):
                        ev = await upstream.recv()
                except TimeoutError:
                    raise UpstreamClosed(
                        f"no end of the cancelled response within {_CANCEL_REPORT_WAIT:g}s"
                    ) from None
            elif inline:
                # Deltas that arrive while this waits are handled in the read
                # callback (``_text_now``): no task resume per token.
                upstream.stream_text_to(self._text_now)
                self._streaming_to = upstream
                try:
                    ev = await upstream.recv()
                finally:
                    self._stop_text_now()
            else:
                ev = await upstream.recv()
            if type(ev) is TextDelta:
                if first:
                    first = False
                    self._first_delta()
                for action in text(ev.text):
                    if type(action) is StopResponse:
                        todo.append(action)
                    else:
                        emit(action)  # type: ignore[arg-type]
                if todo:
                    return
            elif type(ev) is Woken:
                failure, self._text_failure = self._text_failure, None
                if failure is not None:
                    raise failure
                if todo:
                    return
                first = self._requested_at is not None
            elif type(ev) is ResponseDone:
                assert isinstance(ev, ResponseDone)
                self.observer.step_done(ev.usage)
                if ev.status == "completed":
                    self.setup.upstream_factory.succeeded(self._provider)
                detail = ev.detail
                if detail and not _IDENTIFIER.fullmatch(detail):
                    log.warning("session %s: response %s: %s", self.sid, ev.status, detail)
                    detail = "see the gateway's log"
                if detail != ev.detail:
                    ev = msgspec.structs.replace(ev, detail=detail)
                todo.extend(machine.feed(ev))
                return
            elif type(ev) is UpstreamError:
                assert isinstance(ev, UpstreamError)
                log.warning("session %s: upstream error %s: %s", self.sid, ev.code, ev.message)
                self.observer.step_done(None, error=ev.code)
                code = ev.code if _IDENTIFIER.fullmatch(ev.code) else "error"
                fallback = "" if ev.retryable else self._fallback(fatal=True)
                todo.extend(machine.feed(UpstreamFailed(code, _FAILED_MESSAGE, fallback)))
                if todo:
                    return
            elif type(ev) is AudioDelta:
                self._audio_out(ev.pcm16)
            elif type(ev) is Thought:
                for action in machine.feed(ev):
                    emit(action)  # type: ignore[arg-type]
            elif type(ev) is Resumable:
                self._resumable(ev)
            elif type(ev) is Spoken:
                if first:
                    first = False
                    self._first_delta()
                for action in machine.feed(ev):
                    emit(action)  # type: ignore[arg-type]
            else:
                todo.extend(self._voice_input(ev))
                first = self._requested_at is not None
                if todo:
                    return

    def _stop_text_now(self) -> None:
        """No more deltas to ``_text_now``: before the driver is cancelled, so
        none is handled between the cancel and the driver's next step."""
        upstream, self._streaming_to = self._streaming_to, None
        if upstream is not None:
            upstream.stream_text_to(None)

    def _text_now(self, text: str) -> bool:
        """A delta handed over by the read callback while ``_pump_upstream``
        waits (``Upstream.stream_text_to``): parsed and emitted here, as the
        pump would. True: the driver must wake (a marker asked to stop, or
        this failed: the pump raises it as its own)."""
        try:
            if self._requested_at is not None:
                self._first_delta()
            todo = self._todo
            emit = self.emit
            for action in self.machine.text(text):
                if type(action) is StopResponse:
                    todo.append(action)
                else:
                    emit(action)  # type: ignore[arg-type]
            return bool(todo)
        except Exception as exc:  # the driver's handler reports it, as for its own
            self._text_failure = exc
            return True

    def _voice_input(self, ev: UpstreamEvent) -> Sequence[Action]:
        """The machine's actions for an upstream voice event (VAD, transcripts, calls)."""
        if type(ev) is SpeechEnded:
            self._requested_at = time.perf_counter()  # speech end → first chunk
        return self.machine.feed(ev)  # type: ignore[arg-type]

    def _first_delta(self) -> None:
        started, self._requested_at = self._requested_at, None
        if started is not None:
            seconds = time.perf_counter() - started
            self.services.metrics.first_delta.observe(seconds)
            self.observer.first_token(seconds)

    def _account(self, usage: Usage) -> None:
        """Charge a step's usage: counters, its price and the owner's quotas (``metric`` follows)."""
        metrics = self.services.metrics
        metrics.tokens_input.inc(usage.input)
        metrics.tokens_output.inc(usage.output)
        cost = self.observer.charge(usage)
        self.services.limits.record_usage(self.sid, usage, cost)

    async def _run_tools_hearing(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run a step's tools; a voice session hears its user meanwhile.

        The driver awaits the tools, so nothing read the upstream while they
        ran, and speech could not barge in until a slow tool returned. Here a
        watcher reads it: speech cancels the turn (and the tools) as a client
        ``cancel`` does; anything else waits in ``_heard`` for the driver.
        """
        upstream = self.upstream
        voice = self.voice
        if upstream is None or voice is None or voice.audio_in is None or not self.listening:
            return await self._run_tools(calls)
        watcher = asyncio.create_task(self._hear_during_tools(upstream), name=f"hear:{self.sid}")
        try:
            return await self._run_tools(calls)
        finally:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher

    async def _hear_during_tools(self, upstream: Upstream) -> None:
        heard = self._heard
        try:
            while True:
                ev = await upstream.recv()
                if type(ev) is SpeechBegan:
                    self._command(self.machine.feed(ev), interrupt=True)
                    return
                heard.append(ev)
        except UpstreamClosed as exc:
            heard.append(_Gone(exc))  # the driver's next read raises it

    async def _run_tools(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        services = self.services
        services.metrics.tool_calls.inc(len(calls))
        observe = self.observer.tool if self.observer.tracing else None
        allowed = self.setup.server_tools
        if allowed is None or all(call.name in allowed for call in calls):
            results = await services.executor.run_batch(
                list(calls), services.tool_context(self.sid), observe=observe
            )
        else:
            results = await self._run_allowed(calls, allowed, observe)
        failures = sum(1 for r in results if r.status != "success")
        if failures:
            services.metrics.tool_failures.inc(failures)
        return results

    async def _run_allowed(
        self, calls: Sequence[ToolCall], allowed: frozenset[str], observe: CallObserver | None
    ) -> list[ToolResult]:
        """Run the calls of tools this session may use; the others fail, in place."""
        services = self.services
        runnable = [call for call in calls if call.name in allowed]
        ran = iter(
            await services.executor.run_batch(
                runnable, services.tool_context(self.sid), observe=observe
            )
            if runnable
            else []
        )
        names = ", ".join(sorted(allowed)) or "none"
        return [
            next(ran)
            if call.name in allowed
            else ToolResult(
                tool=call.name,
                status="failure",
                content=f"the tool {call.name!r} is not available in this session; "
                f"its tools are: {names}",
            )
            for call in calls
        ]

    def _drop_upstream(self, *, stop: bool) -> None:
        """Let the upstream go; it is closed in the background, so the turn does not wait."""
        upstream, self.upstream = self.upstream, None
        self._heard.clear()  # that connection's events
        if upstream is not None:
            self.host.spawn(_discard(upstream, stop=stop), f"discard-upstream:{self.sid}")

    # ------------------------------------------------------------------ ownership

    def lose(self, reason: str) -> None:
        """Another node owns the session now: stop everything, tell the clients."""
        if self.closed:
            return
        self.host.spawn(self.close(reason, lost=True), f"lose:{self.sid}")

    async def close(self, reason: str, *, lost: bool = False) -> None:
        """Stop driving the session (lease lost, drain, idle release)."""
        if self.closed:
            return
        self.closed = True
        turn = self.turn
        if turn is not None and not turn.done():
            self._stop_text_now()
            turn.cancel()
            with contextlib.suppress(BaseException):
                await turn
        if not lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flushed(), 5.0)
        self._lost = True  # whatever could not be written by now is dropped
        # Free the lease before the slow part (closing the upstream socket), so
        # another node can pick the session up at once.
        self.host.runtime_closed(self, release=not lost)
        for sub in tuple(self.subscribers):
            sub.session_lost(reason)
        self.subscribers.clear()
        self.machine.feed(Shutdown())
        self._todo.clear()
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            await _discard(upstream, stop=True)


class _Gone:
    """The upstream's loss as the tools' watcher read it: the driver's next read raises it."""

    __slots__ = ("error",)

    def __init__(self, error: UpstreamClosed) -> None:
        self.error = error


async def _discard(upstream: Upstream, *, stop: bool) -> None:
    """Close an upstream we let go; ``stop``: first stop its response (so it stops billing)."""
    if stop:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(upstream.cancel_response(), 2.0)
    with contextlib.suppress(Exception):
        await upstream.close()
