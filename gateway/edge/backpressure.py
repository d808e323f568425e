"""A slow client never grows the gateway's memory and never loses an event.

Three layers, from cheapest to last resort:

1. **Coalescing.** When a client's send queue holds more than
   ``coalesce_after`` frames, or it is catching up from the log after falling
   behind, consecutive ``think`` (or ``respond``) chunks are merged into one
   frame: ``content`` is their concatenation, ``seq`` the last chunk's,
   ``seq_from`` the first's. No text is lost and a client checks contiguity
   with ``seq_from``; a token frame is ~60 bytes of envelope around ~4
   characters, so a merged frame carries the same text in a fraction of the
   bytes and the client catches up faster.
2. **Catch-up from the log** (``gateway.edge.connection``): past
   ``send_queue_frames`` the queue is dropped and the client is fed from the
   store's log. The socket's own buffer is bounded by ``write_limit``: a send
   waits for the client to drain it.
3. **Closing.** A client that takes nothing from its socket for
   ``slow_client_timeout`` s while frames wait is closed with 4008 "client too
   slow": its events stay in the log and it resumes with ``after``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from gateway.metrics import Metrics
from gateway.store.base import LogEntry
from protocol.events import Respond, Think, encode

__all__ = ["SegmentJoiner", "SendPressure", "coalesce_entries", "merge_run"]

log = logging.getLogger("gateway.edge.backpressure")

MAX_MERGED_BYTES: Final = 32_768
"""A merged frame stops growing at this many bytes: browsers' and libraries'
default frame limits (1 MiB) stay far away, and one frame never delays the next
event for long."""

MAX_SEGMENT_BYTES: Final = 512 * 1024
"""In event mode (``SegmentJoiner``) a segment is one frame up to this size; a
longer one comes as several, each with its ``seq_from..seq``. Half of the 1 MiB
frame limit of browsers and common libraries."""

_decode_chunk: Final = msgspec.json.Decoder(Think | Respond)


def _chunk_kind(data: bytes) -> type[Think] | type[Respond] | None:
    # msgspec writes the tag first: a prefix check tells a chunk without decoding it.
    if data.startswith(b'{"type":"think",'):
        return Think
    if data.startswith(b'{"type":"respond",'):
        return Respond
    return None


def merge_run(run: Sequence[LogEntry]) -> LogEntry:
    """One frame for consecutive chunks of one kind: content joined, ``seq_from..seq``."""
    if len(run) == 1:
        return run[0]
    chunks = [_decode_chunk.decode(entry.data) for entry in run]
    last = chunks[-1]
    merged = type(last)(
        content="".join(c.content for c in chunks),
        seq=last.seq,
        timestamp=last.timestamp,
        seq_from=chunks[0].seq_from if chunks[0].seq_from is not msgspec.UNSET else chunks[0].seq,
    )
    return LogEntry(last.seq, encode(merged))


def _take_run(first: LogEntry, rest: deque[LogEntry]) -> list[LogEntry]:
    """``first`` and the entries at the head of ``rest`` that continue its run."""
    kind = _chunk_kind(first.data)
    run = [first]
    if kind is None:
        return run
    size = len(first.data)
    while rest:
        nxt = rest[0]
        if (
            nxt.seq != run[-1].seq + 1
            or _chunk_kind(nxt.data) is not kind
            or size + len(nxt.data) > MAX_MERGED_BYTES
        ):
            break
        run.append(rest.popleft())
        size += len(nxt.data)
    return run


def coalesce_entries(entries: Iterable[LogEntry]) -> tuple[list[LogEntry], int]:
    """``entries`` with every run of consecutive same-kind chunks merged (order
    kept), and how many chunks went into merged frames."""
    pending = deque(entries)
    out: list[LogEntry] = []
    merged = 0
    while pending:
        run = _take_run(pending.popleft(), pending)
        if len(run) > 1:
            merged += len(run)
        out.append(merge_run(run))
    return out, merged


class SendPressure:
    """One connection's coalescing state; the writer calls it on its hot path.

    When nothing is behind, each call is one comparison.
    """

    __slots__ = ("_metrics", "behind", "coalesce_after", "limit")

    def __init__(self, coalesce_after: int, limit: int, metrics: Metrics) -> None:
        self.coalesce_after = coalesce_after
        self.limit = limit
        self._metrics = metrics
        # Set once the client fell out of live delivery (see ``page``).
        self.behind = False

    def fell_behind(self) -> None:
        self.behind = self.coalesce_after > 0

    def coalesce(self, entry: LogEntry, queue: deque[LogEntry]) -> LogEntry:
        """``entry`` (the next to send, ``seq`` = last sent + 1), merged with the
        chunks after it in ``queue`` when the queue is long."""
        if self.coalesce_after <= 0 or len(queue) < self.coalesce_after:
            return entry
        run = _take_run(entry, queue)
        if len(run) == 1:
            return entry
        self._metrics.clients.coalesced.inc(len(run))
        return merge_run(run)

    def page(self, entries: list[LogEntry]) -> list[LogEntry]:
        """A catch-up page, coalesced once the client has fallen behind.

        It stays so for the connection's life: a client that was too slow once
        catches up faster every time after. A resume's first replay (before any
        fall) gives back exactly the logged frames.
        """
        if not self.behind:
            return entries
        out, merged = coalesce_entries(entries)
        if merged:
            self._metrics.clients.coalesced.inc(merged)
        return out

    def may_queue_reply(self, queue: deque[LogEntry]) -> bool:
        """Unlogged replies cannot be caught up from the log; past the queue limit
        (a client sending frames without reading the answers) they are dropped."""
        if len(queue) < self.limit:
            return True
        self._metrics.clients.replies_dropped.inc()
        return False


class SegmentJoiner:
    """Event mode (``?stream=event``): one ``think`` and one ``respond`` per segment.

    For clients that show whole units rather than tokens. A segment is a run of
    consecutive chunks of one kind; its frames are held until the first event
    that is not one of them (the next kind, ``call``, ``end``, ``interrupt`` …)
    and then sent as one frame merged by ``merge_run`` (``seq_from..seq``), so
    contiguity checks hold as in token mode. Live delivery and replay go through
    the same joiner, so both join the same way. Held chunks are not sent, so a
    client that reconnects resumes from before them and loses nothing.
    """

    __slots__ = ("_held", "_held_bytes", "_kind")

    def __init__(self) -> None:
        self._held: list[LogEntry] = []
        self._held_bytes = 0
        self._kind: type[Think] | type[Respond] | None = None

    @property
    def held_from(self) -> int | None:
        """The seq of the first chunk held back (None: nothing is held)."""
        return self._held[0].seq if self._held else None

    def feed(self, entry: LogEntry, out: list[LogEntry]) -> None:
        """Take the next entry in seq order; append to ``out`` what may be sent now."""
        kind = _chunk_kind(entry.data)
        held = self._held
        if held and (
            kind is not self._kind or self._held_bytes + len(entry.data) > MAX_SEGMENT_BYTES
        ):
            out.append(merge_run(held))
            self._held = held = []
            self._held_bytes = 0
        if kind is None:
            out.append(entry)
            return
        self._kind = kind
        held.append(entry)
        self._held_bytes += len(entry.data)
