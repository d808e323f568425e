"""What the store knows of each session's log end: the append script's ``check`` flag.

The append script (``gateway.store.redis_scripts.APPEND``) can skip reading
the log's last seq and restarting the idle TTL when the caller knows where
the log ends: this node's own last append of the session, answered ``1``, a
moment ago. That cut Redis's count from 5 to 3 commands per append
(docs/capacity.md). What makes it safe:

- the lease is still checked on every script call, and the log writer's bare
  XADDs are fenced in the log itself (``redis_scripts.ACQUIRE``, ``redis_rounds``);
  XADD refuses a seq at or below the log's last, so a log another writer made
  longer meanwhile is refused as before (``SeqConflict``);
- a log cannot get *shorter* than what was remembered while the memo is
  trusted: trimming keeps the last entry, a delete takes the lease too (the
  append is refused with ``LeaseLost``), and the memo is trusted only for
  ``period`` after the append that last restarted the TTL (``check`` "1"),
  which is a tenth of the TTL at most: the keys cannot expire meanwhile;
- the one way a log loses its end, a failover to a replica that had not
  got the last writes (or a restart without them), is seen by the store
  as a lost or new connection, a redirect or a ``READONLY``: the whole memo
  is then forgotten (``clear``), so the next append of every session
  reads the log's end again and a lost end is refused as before
  (``SeqConflict``). Appends no replica confirmed are not remembered.

Not covered: keys evicted (a ``maxmemory`` policy that evicts; the
gateway's Redis must not evict) or flushed by hand while connections stay up.

So a session's keys live at least ``ttl - period`` after its last event, as
before, and a check costs one read and three PEXPIREs per session per period
instead of a PTTL per append.
"""

from __future__ import annotations

import time
from typing import Final

__all__ = ["CHECK", "TRUST", "SeqMemo"]

CHECK: Final = b"$1\r\n1\r\n"
"""The packed ``check`` argument: read the log's end, restart the TTL."""
TRUST: Final = b"$1\r\n0\r\n"
"""The packed ``check`` argument: the caller knows the log's end."""


class SeqMemo:
    """Per session: the last seq this store appended, by which node, and until when
    that is trusted.

    Trusted for that node only: a ``TRUST`` append may go as a bare XADD, with no
    lease read (``redis_rounds``), so another node sharing this store (tests, or a
    process hosting several) must not ride on what the writer knew.
    """

    __slots__ = ("_known", "_period", "_swept", "enabled", "generation")

    def __init__(self, ttl_ms: int) -> None:
        # A tenth of the TTL, at most 60 s (the idle TTL used to be restarted
        # once it had run down by that much).
        self._period = min(ttl_ms / 10_000, 60.0)
        self._known: dict[str, tuple[int, float, str]] = {}  # sid → (last, until, node)
        self._swept = 1024  # sweep expired entries when the memo outgrows this
        self.enabled = True
        """False: every append checks (the path before the memo, for benches)."""
        self.generation = 0
        """Counts ``clear`` and ``forget``: an append packed ``TRUST`` under an older
        generation is sent with ``CHECK`` (``GroupCommit``)."""

    def flag(self, sid: str, node: str, first: int) -> bytes:
        """``TRUST`` if ``node``'s log of ``sid`` is known to end at ``first - 1``, else
        ``CHECK``."""
        known = self._known.get(sid)
        if (
            known is not None
            and known[0] == first - 1
            and known[2] == node
            and time.monotonic() < known[1]
        ):
            return TRUST
        return CHECK

    def stored(self, sid: str, node: str, last: int, flag: bytes) -> None:
        """An append of ``sid`` by ``node`` ending at ``last``, sent with ``flag``, was
        stored."""
        if not self.enabled or last <= 0:
            return
        known = self._known
        if flag is CHECK:
            known[sid] = (last, time.monotonic() + self._period, node)
        else:
            entry = known.get(sid)
            if entry is None or entry[2] != node:
                return
            known[sid] = (last, entry[1], node)
        if len(known) > self._swept:
            self._sweep()

    def clear(self) -> None:
        """Nothing is known any more (a connection lost or made, a redirect: see above)."""
        self._known.clear()
        self.generation += 1

    def forget(self, sid: str) -> None:
        """Nothing is known of ``sid`` any more (leased anew, released, deleted)."""
        self._known.pop(sid, None)
        self.generation += 1

    def _sweep(self) -> None:
        now = time.monotonic()
        self._known = {sid: e for sid, e in self._known.items() if e[1] > now}
        self._swept = max(1024, 2 * len(self._known))
