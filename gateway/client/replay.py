"""``gateway replay FILE --url ws://…``: a recorded session's user side, played to a gateway.

The plan (``gateway.client.replay_plan``) says what the user did and where
the session was each time; this drives a new session on any gateway with it:
the first configuration (its instructions, provider and model replaced when
asked), then each action once the replayed session is as far as the
recorded one was — messages, configures, cancels, commits, playback reports,
approvals, the client's answers to its tools (sent when the replayed session
makes the same call), and the user's audio at its recorded pace. What the
replayed session sends back is kept with the time it came, and the two runs
are compared turn by turn (``gateway.client.transcript``).

``fork_at``: the user's side up to the recorded event ``fork_at``, then the
session is left open (its id is printed; ``--chat`` goes on in ``gateway
chat``). On the simulator a replay is deterministic: the same recording
gives the same report (latencies aside; a cancel lands after the same words,
give or take the chunks in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.client.dial import open_connection
from gateway.client.replay_plan import Action, Anchor, Plan
from gateway.client.stream import TURN_ENDING_ERROR_CODES
from gateway.client.transcript import Thresholds, TurnDiff, compare, turns_of
from protocol.events import (
    ApprovalRequired,
    Call,
    Cancelled,
    Configured,
    End,
    Error,
    Event,
    Metric,
    Replying,
    User,
    decode_event,
)

__all__ = ["Progress", "ReplayOptions", "ReplayRefused", "ReplayResult", "replay"]

_encode: Final = msgspec.json.Encoder().encode
NO_ANSWER: Final = (
    "the replayed session made a call the recording has no answer for (gateway replay)"
)


class ReplayOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How to replay: where, with what changed, how long to wait.

    ``idle_max``: the longest wait between turns (the user's thinking time is
    recorded, not needed); ``turn_timeout``: how long the replayed session may
    take to reach an action's anchor, or to finish its last turn.
    """

    url: str
    token: str | None = None
    provider: str | None = None
    model: str | None = None
    instructions: str | None = None
    fork_at: int | None = None
    idle_max: float = 1.0
    turn_timeout: float = 60.0
    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)


class ReplayResult(msgspec.Struct, kw_only=True):
    """What a replay did and found: the new session, each turn side by side, notes."""

    session_id: str
    turns: list[TurnDiff]
    notes: list[str]
    events: list[tuple[float, Event]]

    @property
    def changed(self) -> bool:
        return any(d.changed for d in self.turns)


class Progress:
    """How far the replayed session is: its turns, the events of the current one, its
    calls by place; every event with the time it came. Fed by the reader."""

    def __init__(self) -> None:
        self.events: list[tuple[float, Event]] = []
        self.turn = 0
        self.in_turn = 0
        self.closing = False
        self.closed = True
        self.last_seq = 0
        self.calls: dict[tuple[int, int], Call] = {}
        self.turn_calls = 0
        self.replies: list[Error] = []
        self.configured = 0
        self.approvals: dict[str, str] = {}  # call id → the digest its approve must carry
        self.changed = asyncio.Event()

    def feed(self, t: float, event: Event) -> None:
        if isinstance(event, Error) and event.seq <= self.last_seq:
            self.replies.append(event)  # an unlogged reply to one of our frames
            self._poke()
            return
        self.last_seq = max(self.last_seq, event.seq)
        self.events.append((t, event))
        if isinstance(event, User | Replying):  # a turn starts (a reply's: no message)
            self.turn += 1
            self.in_turn, self.turn_calls = 0, 0
            self.closing = self.closed = False
        if self.turn:
            self.in_turn += 1
        if isinstance(event, End | Cancelled):
            self.closing = True
        elif isinstance(event, Metric) and self.closing:
            self.closed = True
        elif isinstance(event, Error) and event.code in TURN_ENDING_ERROR_CODES:
            self.closing = True
        elif isinstance(event, Call) and self.turn:
            self.calls[(self.turn, self.turn_calls)] = event
            self.turn_calls += 1
        elif isinstance(event, Configured):
            self.configured += 1
        elif isinstance(event, ApprovalRequired):
            self.approvals[event.id] = event.digest
        self._poke()

    def _poke(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def reached(self, anchor: Anchor) -> bool:
        if anchor.turn == 0 or self.turn > anchor.turn:
            return True
        if self.turn < anchor.turn:
            return False
        if anchor.closed:
            return self.closed
        return self.in_turn >= anchor.events or self.closing

    def passed(self, turn: int) -> bool:
        """The replayed session is done with ``turn`` (it closed, or another began)."""
        return self.turn > turn or (self.turn == turn and self.closing)

    async def until(self, check: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``check`` holds (True) or ``timeout`` passes (False)."""
        try:
            async with asyncio.timeout(timeout):
                while not check():
                    await self.changed.wait()
        except TimeoutError:
            return False
        return True


class _Replayer:
    """One replay's connection: reads the replayed session, sends the plan's actions."""

    def __init__(self, plan: Plan, options: ReplayOptions, ws: ClientConnection) -> None:
        self.plan = plan
        self.options = options
        self.ws = ws
        self.progress = Progress()
        self.notes: list[str] = list(plan.problems)
        self._answered = {a.call for a in plan.actions if a.call is not None}
        self._tasks: set[asyncio.Task[None]] = set()
        # The recorded run's turns: the replay is over when as many have closed.
        self._turns = plan.turns

    async def read(self) -> None:
        progress = self.progress
        with contextlib.suppress(ConnectionClosed):
            async for frame in self.ws:
                if isinstance(frame, bytes):
                    continue  # the model's speech: its transcript is in the events
                try:
                    event = decode_event(frame)
                except (msgspec.ValidationError, msgspec.DecodeError):
                    continue
                progress.feed(time.monotonic(), event)
                if isinstance(event, Call) and event.runs_on == "client":
                    place = (progress.turn, progress.turn_calls - 1)
                    if place not in self._answered:
                        self._spawn(self._no_answer(event))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _no_answer(self, call: Call) -> None:
        self.notes.append(f"answered call {call.id} with a failure: the recording has none")
        await self._send(
            {"type": "tool_result", "id": call.id, "status": "failure", "content": NO_ANSWER}
        )

    async def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(_encode(message).decode())

    # ------------------------------------------------------------------ the plan

    async def configure_first(self) -> None:
        """The session's recorded configuration (with the replacements asked for)."""
        fields = msgspec.to_builtins(self.plan.config)
        assert isinstance(fields, dict)
        message = self._overridden({"type": "configure", **fields})
        if len(message) == 1:
            return
        before = self.progress.configured
        await self._send(message)
        ok = await self.progress.until(
            lambda: self.progress.configured > before or bool(self.progress.replies), 10.0
        )
        if self.progress.replies:
            refusal = self.progress.replies.pop()
            raise ReplayRefused(
                f"the gateway refused the session's configuration ({refusal.code}): "
                f"{refusal.content}"
            )
        if not ok:
            self.notes.append("the gateway did not confirm the first configuration in 10 s")

    def _overridden(self, message: dict[str, Any]) -> dict[str, Any]:
        if message.get("type") != "configure":
            return message
        options = self.options
        changed = dict(message)
        # Whether the replay records is the replaying gateway's (--record, key policy):
        # a recorded "record": true would be refused under a policy that forbids it.
        changed.pop("record", None)
        if options.instructions is not None:
            changed["instructions"] = options.instructions
        if options.provider is not None:
            changed["provider"] = options.provider
        if options.model is not None:
            changed["model"] = options.model
        return changed

    async def run(self) -> None:
        for action in self.plan.actions:
            await self._act(action)
        await self.progress.until(self._settled, self.options.turn_timeout)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.options.turn_timeout)
        if not self._settled():
            self.notes.append(
                f"the replayed session's last turn did not end within {self.options.turn_timeout:g} s"
            )

    def _settled(self) -> bool:
        return self.progress.closed and self.progress.turn >= self._turns

    async def _act(self, action: Action) -> None:
        progress, options = self.progress, self.options
        if action.call is not None:
            turn, index = action.call
            made = await progress.until(
                lambda: (turn, index) in progress.calls or progress.passed(turn),
                options.turn_timeout,
            )
            call = progress.calls.get((turn, index))
            if not made or call is None:
                self.notes.append(
                    f"not sent: the {action.kind} for call {index + 1} of turn {turn} "
                    "(the replayed session made no such call)"
                )
                return
            message = {**(action.message or {}), "id": call.id}
            if message.get("type") == "approve":
                # The digest covers the call's id: the replayed call's own is asked for.
                await progress.until(
                    lambda: call.id in progress.approvals or progress.passed(turn),
                    options.turn_timeout,
                )
                digest = progress.approvals.get(call.id)
                if digest is None:
                    self.notes.append(
                        f"not sent: the approve for call {index + 1} of turn {turn} "
                        "(the replayed call asked for no approval)"
                    )
                    return
                message["digest"] = digest
            await asyncio.sleep(action.delay)
            await self._send(message)
            return
        reached = await progress.until(
            lambda: progress.reached(action.anchor), options.turn_timeout
        )
        if not reached:
            self.notes.append(
                f"sent late: the {action.kind} waited {options.turn_timeout:g} s for the replayed "
                f"session to reach turn {action.anchor.turn}"
            )
        between = action.anchor.closed or action.anchor.turn == 0
        await asyncio.sleep(min(action.delay, options.idle_max) if between else action.delay)
        if action.audio is not None:
            self._spawn(self._speak(action))
            return
        message = self._overridden(dict(action.message or {}))
        if message == {"type": "configure"}:
            return  # it only turned recording on or off
        if message.get("type") == "played":
            message["seq"] = progress.last_seq
        await self._send(message)

    async def _speak(self, action: Action) -> None:
        """A run of the user's audio, chunk by chunk at its recorded offsets."""
        assert action.audio is not None
        start = time.monotonic()
        with contextlib.suppress(ConnectionClosed):
            for offset, pcm in action.audio.chunks:
                wait = start + offset - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.ws.send(pcm, text=False)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task


class ReplayRefused(Exception):
    """The gateway would not take the recorded session's configuration."""


async def replay(plan: Plan, options: ReplayOptions) -> ReplayResult:
    """Drive a new session on ``options.url`` with ``plan``; the turns side by side.

    Raises ``gateway.client.dial.ClientError`` (the gateway cannot be reached or
    refuses the connection) or ``ReplayRefused``.
    """
    ws, session = await open_connection(options.url, token=options.token, max_size=None)
    replayer = _Replayer(plan, options, ws)
    replayer.progress.last_seq = session.seq
    reader = asyncio.create_task(replayer.read(), name="replay-reader")
    try:
        await replayer.configure_first()
        await replayer.run()
    finally:
        await replayer.close()
        await ws.close()  # the session stays on the gateway: a fork's chat resumes it
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
    recorded = turns_of(plan.events)
    replayed = turns_of(replayer.progress.events)
    for reply in replayer.progress.replies:
        replayer.notes.append(f"the gateway answered a frame with {reply.code}: {reply.content}")
    turns = compare(recorded, replayed, options.thresholds)
    if options.fork_at is not None and recorded and recorded[-1].outcome == "open":
        # The fork cut the recorded turn: the replayed one went on, which is no change.
        cut = turns[len(recorded) - 1]
        cut.changes = []
        replayer.notes.append(
            f"turn {cut.index} was cut at seq {options.fork_at} in the recording; "
            "the replayed session finished it"
        )
    return ReplayResult(
        session_id=session.session_id,
        turns=turns,
        notes=replayer.notes,
        events=replayer.progress.events,
    )
