"""A driven session's log: number, stamp, log, then send (the log side of a runtime).

Every event a session emits gets the next ``seq`` and a timestamp here, is
queued for the node's one ``LogWriter`` (group commit: events emitted while
an append is in flight go out together in the next one, so a token costs a
share of a round trip), and reaches the attached clients only once the
store has it (**log, then send**). History items ride with the next append
atomically. This object is the writer's ``LogSource``; the runtime's other
rooms only ``emit`` and ``persist``.

When an append fails the batch is held, in order, and retried: nothing
reaches a client before it is logged, and a batch whose append may have
landed (the connection broke in flight, or under durability replicated no
replica confirmed it) is settled against the store's ``confirmed_seq``: sent
once the store says it is stored as durably as promised (a replica confirmed
it, asked again), never because the primary happens to have it; never sent
twice or lost. While held, the clients are told once, in words that say why. A lost lease or a seq conflict means another
node owns the session: nothing more is written and ``on_lost`` is told.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from gateway.metrics import Metrics
from gateway.sessions.guard import EventGuard
from gateway.sessions.logwriter import Batch, LogWriter
from gateway.sessions.recorder import SessionRecorder
from gateway.sessions.subscriber import Subscriber
from gateway.store.base import LeaseLost, LogEntry, SeqConflict, StoreUnavailable, Unreplicated
from protocol.assembly import HistoryItem, encode_history_item
from protocol.events import Error, Event, Respond, Think, User, encode

__all__ = ["SessionLog"]

log = logging.getLogger("gateway.sessions.runtime")

# The events a log round may hold back for company: a response's streamed chunks,
# and the user's own message (its client has it; the answer's first content,
# which is hurried, follows it in the same round or the next).
_MAY_LINGER: frozenset[type[Event]] = frozenset({Respond, Think, User})

_STORE_DOWN: str = (
    "the session store is unavailable; events are held and will be delivered when it "
    "returns — stay connected"
)
_UNREPLICATED: str = (
    "no replica of the session store has confirmed the latest events (durability "
    "replicated); they are held and will be delivered once one does — stay connected"
)


class SessionLog:
    """The events and history of one session on its driving node (see the module docstring).

    ``last_seq`` is where numbering goes on from (the log's last seq when the
    session was loaded); ``history`` the session's history, appended to by
    ``persist``; ``on_lost(reason)`` is called once another node owns the session.
    """

    def __init__(
        self,
        sid: str,
        *,
        last_seq: int,
        history: list[HistoryItem],
        writer: LogWriter,
        metrics: Metrics,
        retry_delay: float,
        clock: Callable[[], float],
        on_lost: Callable[[str], None],
    ) -> None:
        self.sid = sid
        self.history = history
        self.subscribers: set[Subscriber] = set()
        self._writer = writer
        self._metrics = metrics
        self._retry_delay = retry_delay
        self._clock = clock
        self._on_lost = on_lost
        self._seq = last_seq
        self.delivered_seq = last_seq
        self._pending: list[LogEntry] = []
        self._pending_history: list[bytes] = []
        self._marked = False  # waiting in the node's LogWriter for its turn
        self._hurry = False  # the next event is a turn's first content (``hurry_next``)
        self.lost = False  # another node owns the session: write nothing more
        # A batch whose append failed with StoreUnavailable (may have landed).
        self.unsure: Batch | None = None
        self._flushed = asyncio.Event()
        self._flushed.set()
        self._store_down = False
        self.recorder: SessionRecorder | None = None  # the session records what it delivers
        # The session's guardrails: every event and history item is judged before it is
        # numbered (gateway.sessions.guard); None: the session has no rules.
        self.guard: EventGuard | None = None

    # ------------------------------------------------------------------ writing

    @property
    def last_seq(self) -> int:
        """The seq of the newest event emitted (logged or about to be)."""
        return self._seq

    def emit(self, event: Event) -> None:
        """Number, stamp and queue an event for logging, then delivery (after the
        session's guardrails, if it has any, judged it)."""
        guard = self.guard
        if guard is None:
            self._emit(event)
        else:
            for judged in guard.filter(event):
                self._emit(judged)

    def answer_done(self) -> None:
        """The provider's response is complete: what the guardrails held of a spoken
        answer is judged and logged now (``EventGuard.answer_done``)."""
        if self.guard is not None:
            for judged in self.guard.answer_done():
                self._emit(judged)

    def _emit(self, event: Event) -> None:
        self._seq += 1
        event.seq = self._seq
        event.timestamp = self._clock()
        self._pending.append(LogEntry(self._seq, encode(event)))
        if not self._marked:
            self._mark()
        if self._hurry or type(event) not in _MAY_LINGER:
            # A turn's first content, or an event someone acts on (a response's
            # end, a call to run, speech that interrupts the model's): not kept
            # waiting for company, as mid-stream chunks may be (``LogWriter``).
            self._hurry = False
            self._writer.hurry(self)

    def hurry_next(self) -> None:
        """The next event emitted is a turn's first content: its round does not linger."""
        self._hurry = True

    def persist(self, items: Sequence[HistoryItem], firsts: Sequence[Event] = ()) -> None:
        """Add history items; they are written with the next log append (atomically).

        Each is stamped with the seq of the first event it holds (``firsts``, of the
        first items), or else of the event logged last (a user message's own), so a
        ``forget`` can name it by the seqs its client saw."""
        for item, first in zip(items, firsts, strict=False):
            if not item.seq:
                item.seq = first.seq
        for item in items:
            if not item.seq:
                item.seq = self._seq
        if self.guard is not None:
            items = self.guard.history(items)
        for item in items:
            self.history.append(item)
            self._pending_history.append(encode_history_item(item))
        if not self._marked:
            self._mark()

    def _mark(self) -> None:
        self._marked = True
        self._flushed.clear()
        self._writer.mark(self)

    async def flushed(self) -> None:
        """Wait until everything emitted so far is logged and delivered.

        Someone waits on it (a tool about to run, a turn ending): its round does
        not linger for company."""
        if not self._flushed.is_set():
            self._writer.hurry(self)
        await self._flushed.wait()

    def stop(self) -> None:
        """Write nothing more (the session closed here): what is not logged is dropped."""
        self.lost = True
        self._stop_holding()

    # ------------------------------------------------------------------ the LogWriter's side

    def take_batch(self) -> Batch | None:
        """What to append now (None: nothing). Called by the node's LogWriter."""
        self._marked = False
        if self.lost:
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
                self._stop_holding()
                log.info("store is back for session %s", self.sid)
            self._delivered(batch[0])
            self._check_flushed()
        elif isinstance(result, LeaseLost | SeqConflict):
            log.warning("session %s: lost ownership while logging: %s", self.sid, result)
            self.lost = True
            self._stop_holding()
            self._pending, self._pending_history = [], []
            self._flushed.set()
            self._on_lost(str(result))
        else:
            # StoreUnavailable (or an unexpected error): hold the batch, in
            # order, and retry; nothing reaches a client before it is logged.
            if self.unsure is None:
                self.unsure = batch  # sent: it may have landed
            else:
                # The unsure batch could not be settled, so ``batch`` was never
                # sent: it goes back in front of what is pending. Merged into
                # the unsure one, a batch that had landed would look partly
                # unwritten and be written again (a seq conflict).
                self._pending = batch[0] + self._pending
                self._pending_history = batch[1] + self._pending_history
            if isinstance(result, StoreUnavailable):
                self._store_unavailable(result)
            else:
                log.error("session %s: appending failed: %r", self.sid, result)
            asyncio.get_running_loop().call_later(self._retry_delay, self._retry)

    def write_failed(self) -> None:
        """The LogWriter broke on this session's batch (a bug): reload it elsewhere."""
        self.lost = True
        self._stop_holding()
        self._flushed.set()
        self._on_lost("internal error while logging")

    def _retry(self) -> None:
        if not self._marked and not self.lost:
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
        self._metrics.events.inc(len(entries))
        if self.recorder is not None:
            self.recorder.delivered(entries)
        for sub in tuple(self.subscribers):
            sub.deliver(entries)

    def _store_unavailable(self, exc: StoreUnavailable) -> None:
        unreplicated = isinstance(exc, Unreplicated)
        if unreplicated:
            self._metrics.store.unreplicated.inc()
        if self._store_down:
            return
        self._store_down = True
        self._metrics.store_errors.inc()
        self._metrics.store.holding.inc()
        log.warning("store unavailable for session %s: %s", self.sid, exc)
        notice = _UNREPLICATED if unreplicated else _STORE_DOWN
        self.notify(Error(code="store", content=notice, seq=self.delivered_seq))

    def _stop_holding(self) -> None:
        """No longer holding events for the store (it is back, or the session ended)."""
        if self._store_down:
            self._store_down = False
            self._metrics.store.holding.dec()

    # ------------------------------------------------------------------ clients

    def notify(self, event: Error) -> None:
        """An unlogged notice to every attached client."""
        event.timestamp = self._clock()
        for sub in tuple(self.subscribers):
            sub.notify(event)

    def deliver_audio(self, frame: bytes) -> None:
        """A frame of the model's speech to every attached client (unlogged)."""
        for sub in tuple(self.subscribers):
            sub.deliver_audio(frame)

    def session_lost(self, reason: str) -> None:
        """Tell every client the session moved, and let them go."""
        for sub in tuple(self.subscribers):
            sub.session_lost(reason)
        self.subscribers.clear()
