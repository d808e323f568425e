"""What waits to be sent to one client, and where its stream stands (``ClientConnection``).

The writer sends logged events in ``seq`` order with no gap and no duplicate.
Live, the events its session hands over are queued here; *lagging*, they are
read from the store's log after ``last_sent`` instead (a resume starts so, and
a client whose queue passes ``limit`` falls back to it: memory stays bounded
and the client still gets every event). Replies to the client's own frames and
the model's speech are queued between the events, each at its place.

This holds the state and the decisions (what to queue, what one write holds,
what a page of the log adds to the stream); the connection does the I/O: it
awaits the socket and reads the log.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Final

from gateway.edge.backpressure import SegmentJoiner, SendPressure
from gateway.metrics import Metrics
from gateway.store.base import LogEntry
from protocol.events import AudioCleared, Error, Pong, encode

__all__ = ["AUDIO", "Outbox", "Write"]

_UNLOGGED: Final = -1  # queue marker: a reply to this client only, sent as is
AUDIO: Final = -2  # queue marker: a binary frame of the model's speech

Write = tuple[list[bytes], bool]
"""Frames for one socket write, and whether it is the one binary frame of speech."""


class Outbox:
    """One client's queue and position (see the module docstring)."""

    __slots__ = (
        "idle",
        "joiner",
        "lagging",
        "last_sent",
        "limit",
        "newest",
        "pressure",
        "queue",
        "replies",
        "wake",
    )

    def __init__(self, after: int, *, limit: int, pressure: SendPressure, event_mode: bool) -> None:
        self.last_sent = after  # the seq of the last frame handed to the socket
        # The newest seq known to be in the log (the head at attach, the newest
        # delivered since): a catch-up reads at least to it.
        self.newest = after
        self.queue: deque[LogEntry] = deque()
        self.replies: deque[Error | Pong | AudioCleared] = deque()  # one per _UNLOGGED entry
        self.limit = limit
        self.lagging = True  # start by catching up from the log
        self.wake = asyncio.Event()
        self.idle = False  # the writer is parked on ``wake`` with nothing to send
        self.pressure = pressure  # coalescing for a client behind (backpressure)
        # Event mode: think and respond chunks joined into one frame per segment.
        self.joiner = SegmentJoiner() if event_mode else None

    @property
    def client_seq(self) -> int:
        """The seq of the last logged event the client has been sent (held
        chunks of an event-mode segment are not sent yet)."""
        held = self.joiner.held_from if self.joiner is not None else None
        return self.last_sent if held is None else held - 1

    def queue_events(self, entries: Sequence[LogEntry], metrics: Metrics) -> None:
        """Logged events the writer did not send at once; past ``limit`` the queue is
        dropped and the writer catches up from the log instead."""
        queue = self.queue
        if len(queue) + len(entries) > self.limit:
            queue.clear()
            self.replies.clear()
            self.lagging = True
            self.pressure.fell_behind()
            metrics.clients.client_lagging.inc()
        else:
            queue.extend(entries)
        self.wake.set()

    def queue_audio(self, frame: bytes) -> None:
        if len(self.queue) < self.limit:
            self.queue.append(LogEntry(AUDIO, frame))
            self.wake.set()

    def queue_reply(self, event: Error | Pong | AudioCleared) -> None:
        """A reply to the client's own frame; encoded when sent, its seq then the last
        one this client was sent (also when a replay went out ahead of it)."""
        if not self.pressure.may_queue_reply(self.queue):
            return  # the client reads nothing: its replies would pile up without bound
        self.replies.append(event)
        self.queue.append(LogEntry(_UNLOGGED, b""))
        self.wake.set()

    def take_queued(self) -> list[Write]:
        """Everything queued, in order, as writes: text frames batched (merged if the
        client is behind), the speech between them each a write of its own. A gap
        leaves the rest queued and the outbox lagging: the log has what is missing."""
        writes: list[Write] = []
        batch: list[bytes] = []
        queue = self.queue
        joiner = self.joiner
        joined: list[LogEntry] = []
        while queue:
            entry = queue.popleft()
            seq = entry.seq
            if seq == _UNLOGGED:
                reply = self.replies.popleft()
                reply.seq = self.client_seq
                batch.append(encode(reply))
            elif seq == AUDIO:
                writes.append((batch, False))
                batch = []
                writes.append(([entry.data], True))
            elif seq > self.last_sent:
                if seq != self.last_sent + 1:
                    queue.appendleft(entry)
                    self.lagging = True
                    break
                if joiner is not None:  # event mode: whole segments only
                    joiner.feed(entry, joined)
                    batch.extend(e.data for e in joined)
                    joined.clear()
                    self.last_sent = seq
                    continue
                # A long queue: merge the chunks after it (seq_from..seq).
                entry = self.pressure.coalesce(entry, queue)
                batch.append(entry.data)
                self.last_sent = entry.seq
        writes.append((batch, False))
        return writes

    def replay_page(self, entries: list[LogEntry]) -> list[bytes]:
        """A page of the log read after ``last_sent``: the frames it adds to the stream
        (one write), a ``log_trimmed`` error first where the log no longer has the
        events the client misses."""
        batch: list[bytes] = []
        if entries and entries[0].seq > self.last_sent + 1:
            gap = Error(
                code="log_trimmed",
                content=f"events {self.last_sent + 1}..{entries[0].seq - 1} are no longer "
                "in the session log (it keeps the newest events only); "
                "the stream continues after them",
                seq=self.last_sent,
            )
            batch.append(encode(gap))
        joiner = self.joiner
        if joiner is not None:  # event mode: replay joins as live delivery does
            joined: list[LogEntry] = []
            for entry in entries:
                if entry.seq > self.last_sent:
                    joiner.feed(entry, joined)
                    self.last_sent = entry.seq
            batch.extend(entry.data for entry in joined)
        else:
            for entry in self.pressure.page(entries):  # merged if the client fell behind
                if entry.seq > self.last_sent:
                    batch.append(entry.data)
                    self.last_sent = entry.seq
        return batch
