"""Rights take effect at once: a revoked API key opens nothing, on every node, within a second.

A connection lives on one credential: an API key, or a client token that an
API key minted (the token names it: ``ClientToken.kd``, the key's digest). So
each connection is tracked here with that ``Credential``, and revoking a key
(``gateway keys revoke``, an ``HDEL`` on the Redis hash, a line removed from
the keys file) ends all of them:

- **Connections already open are closed** with 4401 (``CloseCode.KEY_REVOKED``).
  A ``RightsWatch`` per node asks the key sources about the credentials of its
  open connections every ``RIGHTS_CHECK`` seconds (one ``HMGET`` for all of
  them; the keys file is in memory, and re-read when it changed), and at once
  when ``gateway keys`` announces a change on the control bus
  (``control.KeysChanged`` on ``RIGHTS_CHANNEL``). The message is a hint, not
  an order: the watch asks the store what is issued, so a lost message costs
  at most one period and a forged one nothing.
- **New connections are refused** (401): an API key is looked up per
  handshake as before; a client token's key is looked up too
  (``KeyRights.alive``), its answer kept ``RIGHTS_CHECK`` seconds so a burst of
  reconnects costs one round trip, and dropped when the bus says the key changed.

A key removed from the keys file counts from the moment a node re-reads the
file (it looks every ``RIGHTS_CHECK`` s, and at once on SIGHUP): each node
answers for its own file. While Redis cannot be read, open connections stay
(as limits are not enforced during an outage) and new ones are refused with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from gateway.edge.auth import KeyFile, KeyStoreUnavailable, RedisKeys
from gateway.edge.reaper import Reapable
from gateway.sessions.control import RIGHTS_CHANNEL, KeysChanged, decode_control
from gateway.store.base import Bus

__all__ = ["RIGHTS_CHECK", "Credential", "KeyRights", "Revocable", "RightsWatch"]

log = logging.getLogger("gateway.edge.rights")

RIGHTS_CHECK: Final = 0.5
"""Seconds between two looks at the keys of open connections, and how long an
answer about a key is trusted: a revocation nobody announced (a raw ``HDEL``, a
lost message) is acted on within this, well inside the second we promise."""

CLOSE_GRACE: Final = 2.0
"""Seconds a revoked connection's own writer has to send its 4401 before its
TCP connection is aborted (a client that reads nothing never takes the close)."""


@dataclass(frozen=True, slots=True)
class Credential:
    """What a connection's rights hang on: the key id and the key that proved it.

    ``digest`` is the SHA-256 of the API key (presented, or named by the client
    token). "" for a token minted before tokens named their key: it lives as
    long as its key id holds any key.
    """

    key_id: str
    digest: str


class KeyRights:
    """Whether the key behind a credential is issued now: the keys file first, then Redis.

    Answers from Redis are kept for ``fresh`` seconds (``alive``); ``check``
    always asks and refreshes them. Raises ``KeyStoreUnavailable`` when Redis
    has to be asked and does not answer.
    """

    def __init__(
        self,
        key_file: KeyFile | None,
        redis_keys: RedisKeys | None,
        *,
        fresh: float = RIGHTS_CHECK,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key_file = key_file
        self.redis_keys = redis_keys
        self.fresh = fresh
        self._clock = clock
        self._known: dict[Credential, tuple[bool, float]] = {}  # answer, when

    async def alive(self, cred: Credential) -> bool:
        """Whether ``cred`` may open a connection now (a client token's handshake)."""
        if self._in_file(cred):
            return True
        known = self._known.get(cred)
        if known is not None and self._clock() - known[1] < self.fresh:
            return known[0]
        return cred in await self.check([cred])

    async def check(self, creds: Collection[Credential]) -> set[Credential]:
        """Those of ``creds`` whose key is issued now: one look at each source."""
        issued = {cred for cred in creds if self._in_file(cred)}
        rest = [cred for cred in creds if cred not in issued]
        redis = self.redis_keys
        if rest and redis is not None:
            named = await redis.issued(sorted({c.digest for c in rest if c.digest}))
            ids = await redis.key_ids() if any(not c.digest for c in rest) else set()
            issued.update(
                c
                for c in rest
                if (named.get(c.digest) == c.key_id if c.digest else c.key_id in ids)
            )
        now = self._clock()
        known = self._known
        for cred in [c for c, (_, when) in known.items() if now - when >= self.fresh]:
            del known[cred]  # memory stays bounded by the credentials of the last moment
        if redis is not None:
            for cred in rest:
                known[cred] = (cred in issued, now)
        return issued

    def forget(self, digests: Collection[str]) -> None:
        """These keys changed (empty: any): the next answer about them comes from the store."""
        if not digests:
            self._known.clear()
            return
        for cred in [c for c in self._known if c.digest in digests or not c.digest]:
            del self._known[cred]

    def _in_file(self, cred: Credential) -> bool:
        key_file = self.key_file
        if key_file is None:
            return False
        if cred.digest:
            return key_file.issued(cred.digest) == cred.key_id
        return key_file.has_key_id(cred.key_id)


class Revocable(Reapable, Protocol):
    """A client connection as the rights watch sees it (``gateway.edge.connection``)."""

    def revoked(self) -> None:
        """Its key was revoked: close it with 4401."""


@dataclass(slots=True)
class _Live:
    """One open connection's credential, and how far its revocation got."""

    cred: Credential
    revoked: bool = False
    told_at: float | None = None  # when its connection was told to close (monotonic)


class RightsWatch:
    """Closes this node's connections whose key was revoked (see the module's docstring).

    ``track`` a connection once its handshake is admitted and ``untrack`` it
    when it closed; ``look_now`` after the keys changed (SIGHUP); ``on_tick``
    runs before each look (the edge re-reads its files there).
    """

    def __init__(
        self,
        rights: KeyRights,
        store: Bus,
        connections: Collection[Revocable],
        *,
        on_tick: Callable[[], None] = lambda: None,
        interval: float = RIGHTS_CHECK,
    ) -> None:
        self.rights = rights
        self.store = store
        self.connections = connections
        self.on_tick = on_tick
        self.interval = interval
        self._live: dict[ServerConnection, _Live] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._unavailable_logged = 0.0

    def track(self, ws: ServerConnection, cred: Credential) -> None:
        self._live[ws] = _Live(cred)

    def untrack(self, ws: ServerConnection) -> None:
        self._live.pop(ws, None)

    def look_now(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run(), name="rights-watch"))
        if self.rights.redis_keys is not None:
            listen = self.store.listen(RIGHTS_CHANNEL, self._on_message)
            self._tasks.append(asyncio.create_task(listen, name="rights-listener"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()

    def _on_message(self, data: bytes) -> None:
        message = decode_control(data)
        if isinstance(message, KeysChanged):
            self.rights.forget(message.digests)
            self.look_now()
        else:
            log.warning(
                "ignoring an unexpected message on the rights channel (%d bytes)", len(data)
            )

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            try:
                self.on_tick()
                await self.look()
            except Exception:  # a bug must not end the watch: the next tick tries again
                log.exception("rights watch: looking at the keys of open connections failed")

    async def look(self) -> None:
        """Ask the key sources about every open connection's key; close the revoked."""
        live = self._live
        creds = {entry.cred for entry in live.values() if not entry.revoked}
        if creds:
            try:
                issued = await self.rights.check(creds)
            except KeyStoreUnavailable as exc:
                now = time.monotonic()
                if now - self._unavailable_logged >= 10.0:
                    self._unavailable_logged = now
                    log.warning("cannot check API keys of open connections: %s", exc)
                issued = creds  # an outage revokes nothing
            revoked = creds - issued
            if revoked:
                for key_id in sorted({cred.key_id for cred in revoked}):
                    log.info("an API key of %s was revoked: closing its connections (4401)", key_id)
                for entry in live.values():
                    if entry.cred in revoked:
                        entry.revoked = True
        self._close_revoked()

    def _close_revoked(self) -> None:
        """Tell each revoked connection to close; abort those that did not in time.

        A connection admitted but not yet served (its handshake still
        finishing) is not among ``connections`` yet: it is told at a next look.
        """
        pending = [(ws, entry) for ws, entry in self._live.items() if entry.revoked]
        if not pending:
            return
        now = time.monotonic()
        serving = {id(conn.ws): conn for conn in self.connections}
        for ws, entry in pending:
            if entry.told_at is None:
                conn = serving.get(id(ws))
                if conn is not None:
                    conn.revoked()
                    entry.told_at = now
            elif now - entry.told_at >= CLOSE_GRACE and ws.protocol.state is State.OPEN:
                ws.transport.abort()
