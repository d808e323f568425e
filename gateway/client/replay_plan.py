"""What a replay does, read from a recording: the user's side, each action at its anchor.

Pure (no socket, no clock). ``plan_replay`` reads a recording
(``protocol.recording``) into a ``Plan``: the session's first configuration,
the events the recorded clients got (the recorded run, for the report), and
the user's side as ``Action``s in recorded order — messages, cancels,
configures, commits, playback reports, any other command (approvals), the
client's answers to its tools, and the user's audio in runs.

**Anchors.** A replayed session does not send its events at the recorded
times, so an action is tied to where the session was when it was heard: its
turn (``Anchor.turn``, counted from 1; 0 before the first), how many of that
turn's events had been delivered (``events``), whether the turn was over
(``closed``), and how long after that event it came (``delay``). The replay
sends it once the replayed session is as far (or further: a turn that ended
sooner, or a later turn begun) and the delay passed. So a cancel lands after
the same words on a deterministic model, a barge-in's audio starts at the
same point of the answer, and a message typed after an answer waits for it.

**Client tools.** A recorded ``tool_result`` answers the call the recorded
session made; the replayed session's calls have other ids. An answer is tied
to its call's place instead (the turn, and which client call of the turn),
and sent when the replayed session makes that call, with the recorded delay.
Another command naming a recorded call's id (an approval) is rewritten the
same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec

from protocol.configuration import SessionConfig
from protocol.events import Call, Cancelled, End, Event, Metric, Replying, User, decode_event
from protocol.recording import (
    MAX_SEQ,
    RECORDING_VERSION,
    ClientAudio,
    ClientCommand,
    Cut,
    Header,
    Logged,
    NodeJoined,
    Record,
    read_records,
)

__all__ = [
    "MAX_RECORDING_BYTES",
    "MAX_RECORDS",
    "Action",
    "Anchor",
    "AudioRun",
    "Plan",
    "PlanError",
    "plan_replay",
]

AUDIO_GAP: Final = 0.3
"""Seconds of silence between audio chunks that start a new run of audio."""
MAX_RECORDING_BYTES: Final = 32 << 20
"""The largest recording a plan reads: twice a gateway's default --record-max-bytes."""
MAX_RECORDS: Final = 500_000
"""Records a plan reads (16 MiB of short events and commands is about 160,000)."""
MAX_NOTES: Final = 20
"""Problems kept word for word; past them, only how many more there were."""
EXPORT: Final = "export it again with `gateway recording get`"


class PlanError(ValueError):
    """The file is not a recording a replay can use; the message says why."""


class Anchor(msgspec.Struct, frozen=True):
    """Where the session was when the user acted (see the module docstring)."""

    turn: int
    events: int
    closed: bool


class AudioRun(msgspec.Struct, frozen=True):
    """Consecutive chunks of the user's audio: ``(offset s, PCM16)`` each, at ``rate``."""

    rate: int
    chunks: tuple[tuple[float, bytes], ...]


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """One thing the user did. ``message``: the client frame (JSON) to send, or
    ``audio``; ``call``: the recorded call it names (turn, which call of the turn),
    whose replayed id goes in its ``id`` field; ``seq``: where the recorded
    session was when it was heard."""

    anchor: Anchor
    delay: float
    kind: str
    seq: int
    message: dict[str, Any] | None = None
    audio: AudioRun | None = None
    call: tuple[int, int] | None = None
    refused: str = ""


class Plan(msgspec.Struct, kw_only=True):
    """A replay's script: the first configuration, the recorded run, the actions."""

    header: Header
    config: SessionConfig
    events: list[tuple[float, Event]]
    actions: list[Action]
    cut: bool = False
    problems: list[str] = msgspec.field(default_factory=list)

    @property
    def turns(self) -> int:
        """The recorded turns a replay can bring about: a spoken one only when the
        recording kept the user's audio (a replay waits for as many to end)."""
        spoken = any(a.audio is not None for a in self.actions)
        return sum(
            1
            for _, event in self.events
            if isinstance(event, Replying)
            or (isinstance(event, User) and (spoken or event.source != "audio"))
        )


class _Places:
    """Where each recorded seq falls: its turn, its place in the turn, the turn's end."""

    def __init__(self, events: Sequence[tuple[float, Event]]) -> None:
        self.seqs: list[int] = []
        self.times: list[float] = []
        self.spots: list[Anchor] = []
        self.calls: dict[str, tuple[int, int, float]] = {}  # call id → turn, index, delivered
        turn = in_turn = calls = 0
        closing = closed = False
        for t, event in events:
            if isinstance(event, User | Replying):  # a turn starts (a reply's: no message)
                turn, in_turn, calls, closing, closed = turn + 1, 0, 0, False, False
            if turn:
                in_turn += 1
            if isinstance(event, End | Cancelled):
                closing = True
            elif isinstance(event, Metric) and closing:
                closed = True
            if isinstance(event, Call) and turn:
                self.calls[event.id] = (turn, calls, t)
                calls += 1
            self.seqs.append(event.seq)
            self.times.append(t)
            self.spots.append(Anchor(turn, in_turn, closed))

    def at(self, seq: int, start: float) -> tuple[Anchor, float]:
        """The anchor of ``seq`` (the newest event delivered then) and its time."""
        index = _last_at_most(self.seqs, seq)
        if index < 0:
            return Anchor(0, 0, True), start
        return self.spots[index], self.times[index]


def _last_at_most(seqs: list[int], seq: int) -> int:
    lo, hi = 0, len(seqs)
    while lo < hi:
        mid = (lo + hi) // 2
        if seqs[mid] <= seq:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def plan_replay(data: bytes, *, fork_at: int | None = None) -> Plan:
    """The replay of a recording's bytes (``PlanError`` if it is not one to replay).

    ``fork_at``: only what the user did before the recorded session passed
    event ``fork_at``, and the recorded run up to it. Refused: an empty or
    damaged file (a line that is not a record, one cut short), a version this
    reader does not know, a seq past ``MAX_SEQ``, more than ``MAX_RECORDS``
    records, a recording with nothing to replay, a fork outside its events,
    and a recording cut at its size limit unless the fork is before the cut.
    """
    records = _records(data)
    header = records[0]
    if not isinstance(header, Header):
        raise PlanError(
            "not a recording (its first record is not a header); "
            "export one with `gateway recording get`"
        )
    if not 1 <= header.version <= RECORDING_VERSION:
        raise PlanError(_version(header.version))
    records.sort(key=lambda r: r.t)  # nodes that took turns may have written out of order
    notes = _Notes()
    events = _events(records, notes)
    if not events:
        raise PlanError(
            "the recording holds no events: the session did nothing while it was recorded, "
            "so there is nothing to replay"
        )
    first, last = events[0][1].seq, events[-1][1].seq
    cut = next((r for r in records if isinstance(r, Cut)), None)
    if fork_at is not None:
        if not 1 <= fork_at <= last:
            raise PlanError(
                f"fork at seq {fork_at}: the recording's events are seq {first} to {last}; "
                f"fork at one of them"
            )
        events = [(t, e) for t, e in events if e.seq <= fork_at]
    elif cut is not None:
        raise PlanError(
            f"the recording was cut at its size limit ({cut.limit:,} bytes: the gateway's "
            f"--record-max-bytes) after seq {last}: what followed was not kept, so the "
            f"replay cannot be compared with it; fork at seq {last} or before (--fork-at, "
            "fork_at in a scenario) to replay what was kept, or record with a larger limit"
        )
    places = _Places(events)
    actions = _actions(records, places, header.t, notes)
    if fork_at is not None:
        actions = [a for a in actions if a.seq < fork_at]
    elif not actions:
        raise PlanError(
            f"the recording holds {len(events):,} event{'s' if len(events) != 1 else ''} but "
            "nothing the user sent (no client records): there is nothing to replay"
        )
    if header.audio == "none" and any(
        isinstance(e, User) and e.source == "audio" for _, e in events
    ):
        notes.add(
            "the recording kept no audio (record_audio none): its spoken turns are not replayed"
        )
    return Plan(
        header=header,
        config=header.config,
        events=events,
        actions=actions,
        cut=cut is not None,
        problems=notes.all(),
    )


class _Notes:
    """Problems a replay goes on despite (an event or command it cannot read): the
    first ``MAX_NOTES`` word for word, then how many more."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.more = 0

    def add(self, text: str) -> None:
        if len(self.kept) < MAX_NOTES:
            self.kept.append(text)
        else:
            self.more += 1

    def all(self) -> list[str]:
        return self.kept + ([f"{self.more:,} more problems like these"] if self.more else [])


class _Probe(msgspec.Struct):
    """What a header that is not this version's still says: its kind and version."""

    kind: str = ""
    version: object = None


def _records(data: bytes) -> list[Record]:
    """Every record of ``data``, or ``PlanError`` at the first line that is not one."""
    if len(data) > MAX_RECORDING_BYTES:
        raise PlanError(
            f"{len(data):,} bytes: larger than a recording a replay reads "
            f"({MAX_RECORDING_BYTES:,} bytes at most)"
        )
    records: list[Record] = []
    for item in read_records(data):
        if isinstance(item, str):
            raise PlanError(_damaged(data, item, first=not records))
        records.append(item)
        if len(records) > MAX_RECORDS:
            raise PlanError(
                f"more than {MAX_RECORDS:,} records: larger than a recording a replay reads"
            )
    if not records:
        raise PlanError(
            "the file is empty: not a recording; export one with `gateway recording get`"
        )
    return records


def _damaged(data: bytes, problem: str, *, first: bool) -> str:
    number = int(problem.split(":", 1)[0].removeprefix("line "))
    if first and number == _first_line(data):
        try:
            probe = msgspec.json.decode(data.split(b"\n", 1)[0], type=_Probe)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            probe = _Probe()
        version = probe.version
        if probe.kind == "header" and isinstance(version, int) and version != RECORDING_VERSION:
            return _version(version)
        return f"not a recording ({problem}); export one with `gateway recording get`"
    if not data.endswith(b"\n") and number == data.count(b"\n") + 1:
        return f"line {number} is cut short (the file ends inside it): {EXPORT}"
    return f"the file is damaged: {problem}; {EXPORT}"


def _first_line(data: bytes) -> int:
    """The number of the first line that is not blank."""
    number = 1
    for line in data.split(b"\n", 64):
        if line.strip():
            return number
        number += 1
    return number


def _version(version: object) -> str:
    if isinstance(version, int) and version > RECORDING_VERSION:
        return (
            f"the recording is version {version}, from a newer gateway (this one reads "
            f"version {RECORDING_VERSION}): upgrade realtime-gateway to replay it"
        )
    return f"the recording's header names version {version}, which no gateway writes: {EXPORT}"


def _events(records: Iterable[Record], notes: _Notes) -> list[tuple[float, Event]]:
    events: dict[int, tuple[float, Event]] = {}
    for record in records:
        if isinstance(record, Logged):
            try:
                event = decode_event(record.event)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                notes.add(f"an event that is not one ({exc})")
                continue
            except RecursionError:
                notes.add("an event that is not one (JSON nested too deeply)")
                continue
            if not 0 <= event.seq <= MAX_SEQ:
                raise PlanError(
                    f"the file is damaged: an event claims seq {event.seq}, outside any a "
                    f"session reaches (0 to {MAX_SEQ:,}); {EXPORT}"
                )
            events.setdefault(event.seq, (record.t, event))  # a takeover may log it twice
    return [events[seq] for seq in sorted(events)]


def _actions(
    records: Sequence[Record], places: _Places, start: float, notes: _Notes
) -> list[Action]:
    actions: list[Action] = []
    run: list[ClientAudio] = []

    def end_run() -> None:
        if run:
            first = run[0]
            anchor, at = places.at(first.seq, start)
            chunks = tuple((c.t - first.t, bytes(c.pcm)) for c in run)
            actions.append(
                Action(
                    anchor=anchor,
                    delay=max(0.0, first.t - at),
                    kind="audio",
                    seq=first.seq,
                    audio=AudioRun(first.rate, chunks),
                )
            )
            run.clear()

    for record in records:
        if isinstance(record, ClientAudio):
            if run:
                last = run[-1]
                ends = last.t + len(last.pcm) / 2 / max(last.rate, 1)
                if record.t - ends > AUDIO_GAP or record.rate != last.rate:
                    end_run()
            if record.pcm:
                run.append(record)
        elif isinstance(record, ClientCommand):
            action = _command(record, places, start, notes)
            if action is not None:
                actions.append(action)
        elif isinstance(record, NodeJoined | Header):
            continue
    end_run()
    actions.sort(key=lambda a: a.seq)  # stable: recorded order within a seq
    return actions


def _command(record: ClientCommand, places: _Places, start: float, notes: _Notes) -> Action | None:
    try:
        message = msgspec.json.decode(record.message)
    except msgspec.DecodeError as exc:
        notes.add(f"a command that is not JSON ({exc})")
        return None
    except RecursionError:
        notes.add("a command that is not JSON (nested too deeply)")
        return None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        notes.add("a command with no type")
        return None
    kind = str(message["type"])
    named = message.get("id")
    call = places.calls.get(named) if isinstance(named, str) else None
    if call is not None:
        turn, index, delivered = call
        # Sent when the replayed session makes the same call, as long after it.
        return Action(
            anchor=Anchor(turn, 0, False),
            delay=max(0.0, record.t - delivered),
            kind=kind,
            seq=record.seq,
            message=message,
            call=(turn, index),
            refused=record.refused,
        )
    anchor, at = places.at(record.seq, start)
    return Action(
        anchor=anchor,
        delay=max(0.0, record.t - at),
        kind=kind,
        seq=record.seq,
        message=message,
        refused=record.refused,
    )
